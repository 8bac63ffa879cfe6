"""The operator's limits on Salt's raw storage calls, as checks: :mod:`saltvirt.storage.poolcalls` runs them
before ``virt.pool_define`` / ``pool_update`` and the ``virt.pool_defined`` / ``pool_running`` states,
``virt.pool_build`` / ``pool_start`` / ``pool_stop`` / ``pool_undefine`` / ``pool_delete`` and the
``virt.pool_deleted`` state, ``virt.volume_define`` and the ``virt.volume_defined`` state with a
``backing_store``, ``virt.volume_upload``, ``virt.volume_delete``. The limits come from the minion config
only (:func:`saltvirt.base.switches.operator_settings`):

* a pool's target directory (``dir``, ``fs``, ``netfs``: libvirt creates it, sets its permissions or
  mounts on it) lies inside a directory of ``virt:pool_paths`` (default: those of ``virt:allowed_paths``),
  never inside ``virt:images``;
* what a pool is made of must be listed in ``virt:pool_sources`` (default: nothing): ``devices`` (block
  devices of ``fs``, ``logical`` and ``disk`` pools), ``names`` (the volume group of a ``logical`` pool, the
  zpool of a ``zfs`` pool), ``hosts`` (servers of ``netfs``, ``iscsi``, ``iscsi-direct``, ``rbd`` and
  ``gluster`` pools), ``adapters`` (a ``scsi`` pool's adapter name or wwpn; ``mpath`` for the multipath
  pool, which shows every multipath device of the host). Entries are ``fnmatch`` globs;
* an existing pool: only what a call changes is checked (what the operator defined stays usable);
* a ``backing_store`` lies in ``virt:images``, ``virt:allowed_paths`` or is a volume of a pool VMs may
  attach from (``virt:pools``), passes the ownership door (:func:`saltvirt.storage.attach.readable`) and
  is what its declared format says (raw, or a qcow2 with nothing outside itself);
* a file ``volume_upload`` copies lies in ``virt:allowed_paths`` or ``virt:images`` and passes the same
  door; the volume it overwrites is in a pool VMs may attach from and is no VM's disk;
* building, deleting and undefining a pool (and stopping a transient one, which removes it) need all of
  its definition within the limits above: a call removes only what a call could define again. A pool the
  operator defined elsewhere still starts, never built;
* what is deleted is used by nothing (:func:`saltvirt.storage.attach.changeable`,
  :func:`saltvirt.storage.attach.pool_unused`): no domain's disk or backing chain, no image's or volume's
  backing file, no VM's own; ``volume_delete`` only from a pool of ``virt:pools`` or one within the limits.
  A purge (``virt.pool_deleted``) takes a running pool's orphans with it: volumes of VMs no longer on this
  host that nothing uses.
"""

import contextlib
import fnmatch
import os
from collections.abc import Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import netpool
from saltvirt.host.conn import libvirt
from saltvirt.storage import attach, intake
from saltvirt.xml import poolxml

TARGET_DIR_TYPES = ("dir", "fs", "netfs")  # libvirt makes, chowns or mounts on the target directory
DEVICE_TYPES = ("fs", "logical", "disk")  # source_devices are this host's block devices
NAME_TYPES = ("logical", "zfs")  # source_name is this host's volume group / zpool
HOST_TYPES = ("netfs", "iscsi", "iscsi-direct", "rbd", "gluster")  # source_hosts are servers
_ALL = ("type", "target", "source_devices", "source_name", "source_hosts", "source_adapter")


# pools --------------------------------------------------------------------------------------------
def check_pool(spec: Data, settings: Mapping[str, Any] | None, images_dir: str, current: Data | None = None) -> None:
    """Refuse a pool definition (``current``: the parsed definition of an existing pool; then only what
    ``spec`` changes is checked) whose target or sources the operator has not made available."""
    full, keys = spec, set(_ALL)
    if current is not None:
        full = poolxml.merged(spec, current)
        diff = poolxml.pool_diff(spec, current)
        keys = set(_ALL) if "type" in diff else set(diff)
    settings = settings or {}
    name, ptype, src = full["name"], full["type"], full["source"] or {}
    if "target" in keys and ptype in TARGET_DIR_TYPES and full.get("target"):
        _check_target(name, full["target"], settings, images_dir)
    if "source_devices" in keys and ptype in DEVICE_TYPES:
        for dev in src.get("devices") or ():
            path = dev["path"]
            _listed(name, "devices", "source device", path, (path, os.path.realpath(path)), settings)
    if keys & {"type", "source_name"} and ptype in NAME_TYPES:
        vg = src.get("name") or name  # libvirt: a logical pool's volume group is named like the pool
        _listed(name, "names", "volume group" if ptype == "logical" else "zpool", vg, (vg,), settings)
    if "source_hosts" in keys and ptype in HOST_TYPES:
        for host in src.get("hosts") or ():
            _listed(name, "hosts", "source host", host["name"], (host["name"].lower(),), settings)
    if keys & {"type", "source_adapter"} and ptype == "scsi":
        adapter = src.get("adapter") or {}
        ident = adapter.get("name") or adapter.get("wwpn") or ""
        _listed(name, "adapters", "SCSI adapter", ident or repr(adapter), (str(ident),) if ident else (), settings)
    if "type" in keys and ptype == "mpath":
        _listed(name, "adapters", "multipath (every multipath device of the host)", "mpath", ("mpath",), settings)


def _check_target(name, target, settings, images_dir):
    if validate.root_of(target, (images_dir,)):
        raise SaltInvocationError(
            f"pool {name}: target {target} is inside virt:images, salt-virt's VM directories: refused. Put the "
            "pool's directory elsewhere (virt:pool_paths)"
        )
    roots = settings.get("pool_paths") or ()
    if validate.root_of(target, roots) is None:
        raise SaltInvocationError(
            f"pool {name}: target {target} is outside the directories pools may use ({', '.join(roots) or 'none'}): "
            "put it inside one, or the operator lists the directory in virt:pool_paths in the minion config"
        )


def _listed(name, kind, what, shown, candidates, settings):
    allowed = (settings.get("pool_sources") or {}).get(kind) or ()
    if any(fnmatch.fnmatchcase(c, entry) for c in candidates for entry in allowed):
        return
    raise SaltInvocationError(
        f"pool {name}: {what} {shown} is not one the operator made available for pools "
        f"({', '.join(allowed) or 'none'}): the operator lists it in virt:pool_sources:{kind} in the minion config"
    )


def definition(conn: Conn, name: str) -> Data | None:
    """The parsed definition (as defined, not as running) of the pool ``name``; None when it is not defined."""
    obj = netpool.lookup(conn, "pool", name)
    return None if obj is None else poolxml.parse_pool(netpool.read_xml(obj, "pool", inactive=True))


# what a call does to an existing pool: within the limits only --------------------------------------
# where deleting a pool removes what is below, by type: its target directory, its volume group, its zpool;
# other types' volumes are known by libvirt's list only (a disk pool's /dev target holds the whole host)
CONTENT_ROOTS = {
    "dir": "{target}",
    "fs": "{target}",
    "netfs": "{target}",
    "logical": "/dev/{vg}",
    "zfs": "/dev/zvol/{vg}",
}


def outside(
    facts: Data, action: str, settings: Mapping[str, Any] | None, images_dir: str
) -> SaltInvocationError | None:
    """The refusal (a SaltInvocationError) of ``action`` on the pool ``facts`` (its parsed definition) when
    it is not within the operator's limits (:func:`check_pool` on all of it), else None."""
    try:
        check_pool(facts, settings, images_dir)
    except SaltInvocationError as exc:
        return SaltInvocationError(f"{action} pool {facts['name']} refused (not within the operator's limits): {exc}")
    return None


def within(conn: Conn, name: str, action: str, settings: Mapping[str, Any] | None, images_dir: str) -> Data | None:
    """The parsed definition of the pool ``name`` (None when not defined: the call's own error follows),
    refused when ``action`` on it is not within the operator's limits."""
    facts = definition(conn, name)
    why = None if facts is None else outside(facts, action, settings, images_dir)
    if why is not None:
        raise why
    return facts


def unused(
    conn: Conn,
    name: str,
    facts: Data,
    settings: Mapping[str, Any] | None,
    images_dir: str,
    purge: bool = False,
    host_id: str | None = None,
) -> list[Data]:
    """Refuse deleting the pool while anything uses or owns what is in it (:func:`attach.pool_unused`);
    ``purge`` (of a running pool): returns the orphans that go with it."""
    source = facts["source"] or {}
    pattern, root = CONTENT_ROOTS.get(facts["type"]), None
    if pattern and (facts["target"] or "{target}" not in pattern):
        root = pattern.format(target=facts["target"], vg=source.get("name") or name)
    obj = netpool.lookup(conn, "pool", name)
    volumes = None
    if obj is not None and obj.isActive():
        with contextlib.suppress(libvirt.libvirtError):
            obj.refresh(0)  # what a purge deletes is what libvirt lists after its refresh
            volumes = {vol.path(): (vol.name(), vol.key()) for vol in obj.listAllVolumes(0)}
    # orphans only from what libvirt lists now: in a stopped pool (or one it cannot list) a gone VM's
    # volume is refused as before
    return attach.pool_unused(
        conn,
        name,
        root,
        volumes=volumes,
        images_dir=images_dir,
        settings=settings,
        purge=purge and volumes is not None,
        host_id=host_id,
    )


# volumes ------------------------------------------------------------------------------------------
def check_backing_store(conn: Conn, spec: Data, *, settings: Mapping[str, Any] | None, images_dir: str) -> None:
    """Refuse a new volume's ``backing_store`` the operator has not made available (module docstring)."""
    backing = spec.get("backing_store")
    if not backing:
        return
    path = backing["path"]
    settings = settings or {}
    trusted = {os.path.realpath(t) for t in settings.get("trusted_images") or ()}
    if os.path.realpath(path) not in trusted:
        pool = _pool_of(conn, path)
        if pool is not None:
            attach.check_pool(pool, True, settings)  # a volume: of a pool VMs may attach from
        else:
            roots = (images_dir, *(settings.get("allowed_paths") or ()))
            where = "virt:images, virt:allowed_paths or a pool of virt:pools"
            validate.confined(path, "backing_store path", roots, where)
    if not os.path.exists(path):
        raise SaltInvocationError(f"backing_store: {path} does not exist")
    attach.readable(conn, [("backing_store", path)], images_dir=images_dir, settings=settings)
    intake.existing_disk(path, backing["format"], "backing_store", settings.get("trusted_images") or ())


def _pool_of(conn, path):
    """The pool (the operator made available to VMs) whose volume ``path`` is, else None."""
    try:
        return conn.storageVolLookupByPath(path).storagePoolLookupByVolume().name()
    except libvirt.libvirtError:
        return None


def check_new_volume(conn: Conn, pool: str, spec: Data, *, settings: Mapping[str, Any] | None, images_dir: str) -> None:
    """Refuse a volume a call creates (``volume_define``, the ``volume_defined`` state) in a pool VMs may not
    attach from, or with a ``backing_store`` the operator has not made available."""
    attach.check_pool(pool, False, settings)
    check_backing_store(conn, spec, settings=settings, images_dir=images_dir)


def check_volume_pool(conn: Conn, pool: str, name: str, *, settings: Mapping[str, Any] | None, images_dir: str) -> None:
    """Refuse ``volume_delete`` from a pool neither of ``virt:pools`` nor within the limits (a call could
    delete that pool with all its volumes)."""
    try:
        attach.check_pool(pool, True, settings)
    except SaltInvocationError as exc:
        facts = definition(conn, pool)
        if facts is None or outside(facts, "delete", settings, images_dir) is not None:
            raise SaltInvocationError(f"delete volume {pool}/{name} refused: {exc}") from None
