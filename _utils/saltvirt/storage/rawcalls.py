"""Salt's raw storage calls within what the operator made available: ``virt.pool_define`` /
``pool_update`` and the ``virt.pool_defined`` / ``pool_running`` states, ``virt.pool_build`` /
``pool_start`` / ``pool_stop`` / ``pool_undefine`` / ``pool_delete`` and the ``virt.pool_deleted`` state,
``virt.volume_define`` and the ``virt.volume_defined`` state with a ``backing_store``,
``virt.volume_upload``, ``virt.volume_delete``. Same arguments and returns
as :mod:`saltvirt.storage.pools` (Salt's), checked first; the limits come from the minion config only
(:func:`saltvirt.storage.attach.operator_settings`):

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

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import netpool
from saltvirt.host.conn import libvirt
from saltvirt.storage import attach, images, intake, pools
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


def _current(conn, name):
    obj = netpool.lookup(conn, "pool", name)
    return None if obj is None else poolxml.parse_pool(netpool.read_xml(obj, "pool", inactive=True))


def define_pool(
    conn: Conn,
    spec: Data,
    *,
    settings: Mapping[str, Any] | None,
    images_dir: str,
    transient: bool = False,
    start: bool = True,
) -> bool:
    """Salt's ``pool_define`` (:func:`saltvirt.storage.pools.define_pool`) within the operator's limits."""
    if _current(conn, spec["name"]) is None:  # an existing name: define_pool's own refusal
        check_pool(spec, settings, images_dir)
    return pools.define_pool(conn, spec, transient=transient, start=start)


def update_pool(
    conn: Conn, spec: Data, *, settings: Mapping[str, Any] | None, images_dir: str, test: bool = False
) -> bool:
    """Salt's ``pool_update`` (:func:`saltvirt.storage.pools.update_pool`): what it changes within the limits."""
    current = _current(conn, spec["name"])
    if current is not None:
        check_pool(spec, settings, images_dir, current)
    return pools.update_pool(conn, spec, test=test)


def ensure_pool(conn: Conn, spec: Data, *, settings: Mapping[str, Any] | None, images_dir: str, **kwargs: Any) -> Data:
    """The ``virt.pool_defined`` / ``pool_running`` states (:func:`saltvirt.storage.pools.ensure_pool`),
    what they define or change within the limits (also with test=True); a pool they start is built
    only within them (:func:`start_pool`)."""
    current = _current(conn, spec["name"])
    check_pool(spec, settings, images_dir, current)
    why = None if current is None else _outside(poolxml.merged(spec, current), "build", settings, images_dir)
    return _unbuilt(why, lambda: pools.ensure_pool(conn, spec, build=why is None, **kwargs))


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


def _outside(facts, action, settings, images_dir):
    """The refusal (a SaltInvocationError) of ``action`` on the pool ``facts`` (its parsed definition) when
    it is not within the operator's limits (:func:`check_pool` on all of it), else None."""
    try:
        check_pool(facts, settings, images_dir)
    except SaltInvocationError as exc:
        return SaltInvocationError(f"{action} pool {facts['name']} refused (not within the operator's limits): {exc}")
    return None


def _within(conn, name, action, settings, images_dir):
    """The parsed definition of the pool ``name`` (None when not defined: the call's own error follows),
    refused when ``action`` on it is not within the operator's limits."""
    facts = _current(conn, name)
    why = None if facts is None else _outside(facts, action, settings, images_dir)
    if why is not None:
        raise why
    return facts


def _unbuilt(why, start):
    """``start()``; when it fails and ``why`` (a refusal) kept it from building the pool, say so."""
    try:
        return start()
    except CommandExecutionError as exc:
        if why is None:
            raise
        raise CommandExecutionError(f"{exc}; it was not built first: {why}") from None


def build_pool(conn: Conn, name: str, *, settings: Mapping[str, Any] | None, images_dir: str) -> bool:
    """Salt's ``pool_build``: only a pool within the operator's limits (its target directory in
    ``virt:pool_paths``, its devices, volume group, ... in ``virt:pool_sources``)."""
    _within(conn, name, "build", settings, images_dir)
    return bool(pools.build_pool(conn, name))


def start_pool(conn: Conn, name: str, *, build: bool, settings: Mapping[str, Any] | None, images_dir: str) -> bool:
    """Salt's ``pool_start``: a pool outside the operator's limits (one the operator defined) starts, but is
    never built (a failed start says why). False when it was running already."""
    facts = _current(conn, name)
    why = None if facts is None or not build else _outside(facts, "build", settings, images_dir)
    return _unbuilt(why, lambda: pools.start_pool(conn, name, build=build and why is None))


def stop_pool(conn: Conn, name: str, *, settings: Mapping[str, Any] | None, images_dir: str) -> bool:
    """Salt's ``pool_stop``; a transient pool (gone once stopped) only within the operator's limits."""
    obj = netpool.lookup(conn, "pool", name)
    if obj is not None and not obj.isPersistent():
        _within(conn, name, "stop (and so remove) transient", settings, images_dir)
    return netpool.stop(conn, "pool", name)


def undefine_pool(conn: Conn, name: str, *, settings: Mapping[str, Any] | None, images_dir: str) -> bool:
    """Salt's ``pool_undefine``: only a pool within the operator's limits (a caller removes only what it
    could define again)."""
    _within(conn, name, "undefine", settings, images_dir)
    return pools.undefine_pool(conn, name)


def _unused(conn, name, facts, settings, images_dir, purge=False, host_id=None):
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


def delete_pool(
    conn: Conn, name: str, *, fast: bool = True, settings: Mapping[str, Any] | None, images_dir: str
) -> bool:
    """Salt's ``pool_delete`` (``fast=False``: libvirt zeroes the data first, where it can): only a pool
    within the operator's limits, and none whose volumes a domain uses, an image backs onto or a VM owns
    (deleting a logical or zfs pool destroys its volume group or zpool with every volume in it)."""
    facts = _within(conn, name, "delete", settings, images_dir)
    if facts is not None:
        _unused(conn, name, facts, settings, images_dir)
    return bool(pools.delete_pool(conn, name, zeroed=not fast))


def delete_all(
    conn: Conn,
    name: str,
    *,
    purge: bool,
    test: bool,
    settings: Mapping[str, Any] | None,
    images_dir: str,
    host_id: str | None = None,
) -> tuple[Data | None, list[str]]:
    """The ``virt.pool_deleted`` state (:func:`saltvirt.storage.pools.delete_all`): within the operator's
    limits; with ``purge`` (its volumes and what building it made are deleted) only while nothing uses or
    owns what is in it. Checked before anything is done, also with test=True. A running pool's volumes
    of VMs that no longer exist on this host (``host_id``: this minion, see :func:`attach.pool_unused`) go
    too: changes ``deleted_orphans`` ({volume: why}, only when there are some), and their records leave
    the gone VM's manifest."""
    facts = _within(conn, name, "delete" if purge else "undefine", settings, images_dir)
    orphans = []
    if facts is not None and purge:
        orphans = _unused(conn, name, facts, settings, images_dir, purge=True, host_id=host_id)
    changes, unsupported = pools.delete_all(conn, name, purge=purge, test=test)
    gone = [o for o in orphans if changes is not None and o["volume"] in changes["deleted_volumes"]]
    if gone and changes is not None:
        why = "belonged to VM {!r}, which no longer exists on this host"
        changes["deleted_orphans"] = {o["volume"]: why.format(o["vm"]) for o in gone}
    for orphan in gone if not test else ():
        if orphan["record"] is not None:
            images.forget_extra(orphan["vm_dir"], orphan["vm"], "volumes", [orphan["record"]], orphan["uuid"])
    return changes, unsupported


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


def define_volume(conn: Conn, pool: str, spec: Data, *, settings: Mapping[str, Any] | None, images_dir: str) -> bool:
    """Salt's ``volume_define`` (:func:`saltvirt.storage.pools.define_volume`) within the operator's limits."""
    attach.check_pool(pool, False, settings)
    check_backing_store(conn, spec, settings=settings, images_dir=images_dir)
    return pools.define_volume(conn, pool, spec)


def ensure_volume(
    conn: Conn, pool: str, spec: Data, *, settings: Mapping[str, Any] | None, images_dir: str, test: bool = False
) -> Data:
    """The ``virt.volume_defined`` state (:func:`saltvirt.storage.pools.ensure_volume`): a volume it
    creates is within the limits (also with test=True)."""
    if netpool.lookup(conn, "pool", pool) is not None and pools.lookup_volume(conn, pool, spec["name"]) is None:
        attach.check_pool(pool, False, settings)
        check_backing_store(conn, spec, settings=settings, images_dir=images_dir)
    return pools.ensure_volume(conn, pool, spec, test=test)


def upload_volume(
    conn: Conn,
    pool: str,
    name: str,
    path: str,
    *,
    settings: Mapping[str, Any] | None,
    images_dir: str,
    offset: int = 0,
    length: int = 0,
    sparse: bool = False,
) -> bool:
    """Salt's ``volume_upload`` (:func:`saltvirt.storage.pools.upload_volume`): the file from a directory
    the operator made available, into a volume no VM uses or owns of a pool VMs may attach from."""
    settings = settings or {}
    roots = (*(settings.get("allowed_paths") or ()), images_dir)
    validate.confined(path, "file", roots, "virt:allowed_paths")
    attach.check_pool(pool, True, settings)
    vol = pools.get_volume(conn, pool, name)
    attach.readable(conn, [("file", path)], images_dir=images_dir, settings=settings)
    attach.changeable(conn, pool, name, vol, "upload", images_dir=images_dir, settings=settings)
    return pools.upload_volume(conn, pool, name, path, offset=offset, length=length, sparse=sparse)


def delete_volume(conn: Conn, pool: str, name: str, *, settings: Mapping[str, Any] | None, images_dir: str) -> bool:
    """Salt's ``volume_delete``: a volume of a pool VMs may attach from (``virt:pools``) or of a pool
    within the operator's limits (which a call could delete with all its volumes), that no domain uses
    (defined or running, as a disk or in a backing chain), no image or volume backs onto and no VM owns
    (:func:`saltvirt.storage.attach.changeable`)."""
    try:
        attach.check_pool(pool, True, settings)
    except SaltInvocationError as exc:
        facts = _current(conn, pool)
        if facts is None or _outside(facts, "delete", settings, images_dir) is not None:
            raise SaltInvocationError(f"delete volume {pool}/{name} refused: {exc}") from None
    vol = pools.get_volume(conn, pool, name)
    attach.changeable(conn, pool, name, vol, "delete", images_dir=images_dir, settings=settings)
    return pools.delete_volume(conn, pool, name)
