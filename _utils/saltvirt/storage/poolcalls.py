"""Salt's storage pool and volume calls, each one function: the operator's limits checked
(:mod:`saltvirt.storage.poollimits`), then the lifecycle (:mod:`saltvirt.host.netpool`: one ``start``) and the
operations (:mod:`saltvirt.storage.pools`): ``virt.pool_define`` / ``pool_update`` / ``pool_build`` /
``pool_start`` / ``pool_stop`` / ``pool_undefine`` / ``pool_delete``, ``virt.volume_define`` /
``volume_delete`` / ``volume_upload``, and the ``virt.pool_defined`` / ``pool_running`` / ``pool_deleted`` /
``volume_defined`` states. ``settings`` and ``images_dir`` are the operator's (minion config only:
:func:`saltvirt.base.switches.operator_settings`, ``virt:images``).
"""

import contextlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import netpool
from saltvirt.host.conn import define, libvirt, lv_errors
from saltvirt.storage import attach, images, poollimits, pools
from saltvirt.xml import poolxml

Limits = Mapping[str, Any] | None  # the operator's settings (saltvirt.base.switches.operator_settings)


def _drop_secret(conn, pool_xml, name):
    """Undefine the secret pool_define made for pool ``name`` (usage pool_<name>); other secrets stay."""
    auth = poolxml.parse_pool(pool_xml)["source"].get("auth")
    if not auth or auth["secret"] != {"type": "usage", "value": pools.secret_usage(name)}:
        return False
    try:
        conn.secretLookupByUsage(pools.secret_usage_type(auth["type"]), pools.secret_usage(name)).undefine()
    except libvirt.libvirtError:
        return False
    return True


def define_pool(
    conn: Conn,
    spec: Data,
    *,
    settings: Limits,
    images_dir: str,
    transient: bool = False,
    start: bool = True,
) -> bool:
    """Salt's ``pool_define``: define (or, ``transient``, create running) a new pool within the operator's
    limits. Returns True."""
    if netpool.lookup(conn, "pool", spec["name"]) is not None:
        raise SaltInvocationError(
            f"pool {spec['name']!r} is already defined: use virt.pool_update or the virt.pool_defined state"
        )
    poollimits.check_pool(spec, settings, images_dir)
    spec, _ = pools.pool_secret(conn, spec)
    xml = poolxml.pool_xml(spec)
    with lv_errors(f"define pool {spec['name']!r}"):
        if transient:
            conn.storagePoolCreateXML(xml, 0)
            return True
        define(conn, "pool", xml)
    if start:
        netpool.start(conn, "pool", spec["name"], build=True)  # just defined within the limits: may be built
    return True


def update_pool(conn: Conn, spec: Data, *, settings: Limits, images_dir: str, test: bool = False) -> bool:
    """Salt's ``pool_update``: redefine when the declared fields differ (uuid and undeclared fields kept), what
    it changes within the operator's limits. Returns whether it (would have) changed."""
    obj = netpool.get(conn, "pool", spec["name"])
    current = poolxml.parse_pool(netpool.read_xml(obj, "pool", inactive=True))
    poollimits.check_pool(spec, settings, images_dir, current)
    poolxml.check_required(poolxml.merged(spec, current))
    spec, secret_changed = pools.pool_secret(conn, spec, test=test)
    diff = poolxml.pool_diff(spec, current)
    if diff and not test:
        with lv_errors(f"redefine pool {spec['name']!r}"):
            define(conn, "pool", poolxml.pool_xml(spec, netpool.read_xml(obj, "pool", inactive=True)))
    return bool(diff) or secret_changed


def ensure_pool(
    conn: Conn,
    spec: Data,
    *,
    settings: Limits,
    images_dir: str,
    autostart: bool | None = True,
    run: bool = False,
    transient: bool = False,
    test: bool = False,
) -> Data:
    """The ``virt.pool_defined`` / ``pool_running`` states (see netpool.ensure), with source_auth secrets
    and transient pools: what they define or change within the operator's limits (also with test=True); a
    pool they start is built only within them. Returns {'changes', 'comment'}; changes never hold a
    password."""
    current = poollimits.definition(conn, spec["name"])
    poollimits.check_pool(spec, settings, images_dir, current)
    why = None if current is None else poollimits.outside(poolxml.merged(spec, current), "build", settings, images_dir)
    return _unbuilt(why, lambda: _ensure(conn, spec, autostart, run, transient, test, build=why is None))


def _ensure(conn, spec, autostart, run, transient, test, build):
    name = spec["name"]
    existing = netpool.lookup(conn, "pool", name)
    if existing is None:
        poolxml.check_required(spec)
    else:
        poolxml.check_required(poolxml.merged(spec, poolxml.parse_pool(existing.XMLDesc(0))))
    spec, secret_changed = pools.pool_secret(conn, spec, test=test)
    if transient:
        obj = netpool.lookup(conn, "pool", name)
        if obj is None:
            if not test:
                with lv_errors(f"create transient pool {name!r}"):
                    conn.storagePoolCreateXML(poolxml.pool_xml(spec), 0)
            return {"changes": {"created": poolxml.public(spec)}, "comment": f"transient pool {name} created"}
        diff = poolxml.pool_diff(spec, poolxml.parse_pool(obj.XMLDesc(0)))
        if diff or obj.isPersistent():
            raise CommandExecutionError(
                f"pool {name} exists {'as a persistent pool' if obj.isPersistent() else 'with ' + ', '.join(diff)}:"
                " a transient pool cannot be changed in place; remove it (virt.pool_deleted) first"
            )
        return {"changes": {}, "comment": f"pool {name} is as declared"}
    done = netpool.ensure(conn, "pool", spec, autostart=autostart, run=run, test=test, build=build)
    if "defined" in done["changes"]:
        done["changes"]["defined"] = poolxml.public(spec)
    if secret_changed and (test or netpool.lookup(conn, "pool", name) is not None):
        done["changes"]["secret"] = "source_auth password stored in a libvirt secret"
        done["comment"] += "; secret " + ("would be " if test else "") + "updated"
    return done


def _unbuilt(why: SaltInvocationError | None, start: Callable[[], Any]) -> Any:
    """``start()``; when it fails and ``why`` (a refusal) kept it from building the pool, say so."""
    try:
        return start()
    except CommandExecutionError as exc:
        if why is None:
            raise
        raise CommandExecutionError(f"{exc}; it was not built first: {why}") from None


def start_pool(conn: Conn, name: str, *, build: bool, settings: Limits, images_dir: str) -> bool:
    """Salt's ``pool_start`` (``build``: first make what the pool needs, see netpool.start): a pool outside the
    operator's limits (one the operator defined) starts, but is never built (a failed start says why).
    False when it was running already."""
    facts = poollimits.definition(conn, name)
    why = None if facts is None or not build else poollimits.outside(facts, "build", settings, images_dir)
    return _unbuilt(why, lambda: netpool.start(conn, "pool", name, build=build and why is None))


def stop_pool(conn: Conn, name: str, *, settings: Limits, images_dir: str) -> bool:
    """Salt's ``pool_stop``; a transient pool (gone once stopped) only within the operator's limits."""
    obj = netpool.lookup(conn, "pool", name)
    if obj is not None and not obj.isPersistent():
        poollimits.within(conn, name, "stop (and so remove) transient", settings, images_dir)
    return netpool.stop(conn, "pool", name)


def build_pool(conn: Conn, name: str, *, settings: Limits, images_dir: str) -> bool:
    """Salt's ``pool_build``: only a pool within the operator's limits (its target directory in
    ``virt:pool_paths``, its devices, volume group, ... in ``virt:pool_sources``)."""
    poollimits.within(conn, name, "build", settings, images_dir)
    return pools.act(conn, name, "build", lambda o: o.build(0))


def _delete(conn, name, zeroed=False):
    """Delete what build made (the target directory, the volume group): the pool must be stopped.
    ``zeroed``: ask libvirt to overwrite the data with zeros first (Salt's ``fast=False``)."""
    obj = netpool.get(conn, "pool", name)
    if obj.isActive():
        raise CommandExecutionError(f"pool {name!r} is running: stop it (virt.pool_stop) before deleting it")
    flags = libvirt.VIR_STORAGE_POOL_DELETE_ZEROED if zeroed else libvirt.VIR_STORAGE_POOL_DELETE_NORMAL
    return pools.act(conn, name, "delete", lambda o: o.delete(flags))


def delete_pool(conn: Conn, name: str, *, fast: bool = True, settings: Limits, images_dir: str) -> bool:
    """Salt's ``pool_delete`` (``fast=False``: libvirt zeroes the data first, where it can): only a pool
    within the operator's limits, and none whose volumes a domain uses, an image backs onto or a VM owns
    (deleting a logical or zfs pool destroys its volume group or zpool with every volume in it)."""
    facts = poollimits.within(conn, name, "delete", settings, images_dir)
    if facts is not None:
        poollimits.unused(conn, name, facts, settings, images_dir)
    return _delete(conn, name, zeroed=not fast)


def _undefine(conn, name):
    obj = netpool.get(conn, "pool", name)
    xml = obj.XMLDesc(0)
    netpool.undefine(conn, "pool", name)
    _drop_secret(conn, xml, name)
    return True


def undefine_pool(conn: Conn, name: str, *, settings: Limits, images_dir: str) -> bool:
    """Salt's ``pool_undefine``: only a pool within the operator's limits (a caller removes only what it
    could define again)."""
    poollimits.within(conn, name, "undefine", settings, images_dir)
    return _undefine(conn, name)


def delete_all(
    conn: Conn,
    name: str,
    *,
    purge: bool,
    test: bool,
    settings: Limits,
    images_dir: str,
    host_id: str | None = None,
) -> tuple[Data | None, list[str]]:
    """The ``virt.pool_deleted`` state: (purge: delete its volumes, stop, delete) and undefine, within the
    operator's limits; with ``purge`` (its volumes and what building it made are deleted) only while nothing
    uses or owns what is in it. Checked before anything is done, also with test=True. A running pool's
    volumes of VMs that no longer exist on this host (``host_id``: this minion, see
    :func:`saltvirt.storage.attach.pool_unused`) go too: changes ``deleted_orphans`` ({volume: why}, only when
    there are some), and their records leave the gone VM's manifest. Returns (changes in Salt's shape, list
    of unsupported actions)."""
    facts = poollimits.within(conn, name, "delete" if purge else "undefine", settings, images_dir)
    orphans = []
    if facts is not None and purge:
        orphans = poollimits.unused(conn, name, facts, settings, images_dir, purge=True, host_id=host_id)
    changes, unsupported = _remove(conn, name, purge=purge, test=test)
    gone = [o for o in orphans if changes is not None and o["volume"] in changes["deleted_volumes"]]
    if gone and changes is not None:
        why = "belonged to VM {!r}, which no longer exists on this host"
        changes["deleted_orphans"] = {o["volume"]: why.format(o["vm"]) for o in gone}
    for orphan in gone if not test else ():
        if orphan["record"] is not None:
            images.forget_extra(orphan["vm_dir"], orphan["vm"], "volumes", [orphan["record"]], orphan["uuid"])
    return changes, unsupported


def _remove(conn, name, purge, test):
    """(purge: delete its volumes, stop, delete) and undefine: (changes in Salt's shape, unsupported actions)."""
    obj = netpool.lookup(conn, "pool", name)
    if obj is None:
        return None, []
    ptype = ET.fromstring(obj.XMLDesc(0)).get("type")
    changes: Data = {"stopped": False, "deleted": False, "undefined": False, "deleted_volumes": []}
    unsupported = []
    if obj.isActive():
        if purge:
            if ptype in poolxml.NO_VOLUME_DELETE:
                unsupported.append("deleting volume")
            else:
                with lv_errors(f"refresh pool {name!r}"):
                    obj.refresh(0)
                for vol in sorted(obj.listVolumes()):
                    if not test:
                        pools.delete_volume(conn, name, vol)
                    changes["deleted_volumes"].append(vol)
        if not test:
            netpool.stop(conn, "pool", name)
        changes["stopped"] = True
    if purge:
        if ptype in poolxml.DELETABLE:
            if not test:
                _delete(conn, name)
            changes["deleted"] = True
        else:
            unsupported.append("deleting pool")
    if not test and netpool.lookup(conn, "pool", name) is not None:  # a transient pool is gone once stopped
        _undefine(conn, name)
    changes["undefined"] = True
    return changes, unsupported


def define_volume(conn: Conn, pool: str, spec: Data, *, settings: Limits, images_dir: str) -> bool:
    """Salt's ``volume_define`` (:func:`saltvirt.storage.pools.define_volume`) within the operator's limits."""
    poollimits.check_new_volume(conn, pool, spec, settings=settings, images_dir=images_dir)
    return pools.define_volume(conn, pool, spec)


def delete_volume(conn: Conn, pool: str, name: str, *, settings: Limits, images_dir: str) -> bool:
    """Salt's ``volume_delete``: a volume of a pool VMs may attach from (``virt:pools``) or of a pool
    within the operator's limits (which a call could delete with all its volumes), that no domain uses
    (defined or running, as a disk or in a backing chain), no image or volume backs onto and no VM owns
    (:func:`saltvirt.storage.attach.changeable`)."""
    poollimits.check_volume_pool(conn, pool, name, settings=settings, images_dir=images_dir)
    vol = pools.get_volume(conn, pool, name)
    attach.changeable(conn, pool, name, vol, "delete", images_dir=images_dir, settings=settings)
    return pools.delete_volume(conn, pool, name)


def upload_volume(
    conn: Conn,
    pool: str,
    name: str,
    path: str,
    *,
    settings: Limits,
    images_dir: str,
    offset: int = 0,
    length: int = 0,
    sparse: bool = False,
) -> bool:
    """Salt's ``volume_upload``: write a local file into a volume at ``offset`` (``length`` bytes, 0: all): the
    file from a directory the operator made available, into a volume no VM uses or owns of a pool VMs may
    attach from."""
    settings = settings or {}
    validate.confined(path, "file", (*(settings.get("allowed_paths") or ()), images_dir), "virt:allowed_paths")
    attach.check_pool(pool, True, settings)
    vol = pools.get_volume(conn, pool, name)
    attach.readable(conn, [("file", path)], images_dir=images_dir, settings=settings)
    attach.changeable(conn, pool, name, vol, "upload", images_dir=images_dir, settings=settings)
    validate.absolute_path(path, "file")
    if not os.path.isfile(path):
        raise SaltInvocationError(f"file {path!r} does not exist or is not a regular file")
    offset, length = int(offset or 0), int(length or 0)
    if offset < 0 or length < 0:
        raise SaltInvocationError("offset and length cannot be negative")
    stream = conn.newStream(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        with lv_errors(f"upload {path} to volume {name!r} of pool {pool!r}"):
            flags = libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM if validate.to_bool(sparse) else 0
            vol.upload(stream, offset, length, flags)
            left = [length or os.fstat(fd).st_size]

            def _read(_stream, nbytes, _fd):
                chunk = os.read(_fd, min(nbytes, left[0]))
                left[0] -= len(chunk)
                return chunk

            stream.sendAll(_read, fd)
            stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise
    finally:
        os.close(fd)
    return True


def ensure_volume(conn: Conn, pool: str, spec: Data, *, settings: Limits, images_dir: str, test: bool = False) -> Data:
    """The ``virt.volume_defined`` state: {'result', 'changes', 'comment'} (Salt's comments); a volume it
    creates is within the operator's limits (also with test=True)."""
    if netpool.lookup(conn, "pool", pool) is None:
        raise SaltInvocationError(f"Storage pool {pool} not existing")
    vol = pools.lookup_volume(conn, pool, spec["name"])
    if vol is None:
        poollimits.check_new_volume(conn, pool, spec, settings=settings, images_dir=images_dir)
    if vol is not None:
        facts = poolxml.parse_volume(vol.XMLDesc(0))
        if facts["backing_store"] != spec["backing_store"] or (spec["format"] and facts["format"] != spec["format"]):
            return {
                "result": False,
                "changes": {},
                "comment": "A volume with the same name but different backing store or format is existing",
            }
        comment = "volume is existing"
        if vol.info()[1] != spec["size"] * 1024 * 1024:
            comment = "The capacity of the volume is different, but no resize performed"
        return {"result": True, "changes": {}, "comment": comment}
    if not test:
        pools.define_volume(conn, pool, spec)
    return {
        "result": None if test else True,
        "changes": {f"{pool}/{spec['name']}": {"old": "", "new": "defined"}},
        "comment": f"Volume {spec['name']} {'would be ' if test else ''}defined in pool {pool}",
    }
