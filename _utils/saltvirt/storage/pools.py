"""Storage pools and volumes on a libvirt connection: Salt's pool_* / volume_* operations (XML lives in
``saltvirt.xml.poolxml``; generic define/start/stop/autostart of pools is shared with networks in
``saltvirt.host.netpool``)."""

import base64
import binascii
import contextlib
import os
import subprocess
import xml.etree.ElementTree as ET
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import netpool
from saltvirt.host.conn import define, libvirt, lv_errors
from saltvirt.xml import poolxml
from saltvirt.xml.domain import definition

POOL_STATES = ("inactive", "building", "running", "degraded", "inaccessible")
VOLUME_TYPES = ("file", "block", "dir", "network", "netdir", "ploop")


def _usage_type(secret_type):
    return libvirt.VIR_SECRET_USAGE_TYPE_CEPH if secret_type == "ceph" else libvirt.VIR_SECRET_USAGE_TYPE_ISCSI


def secret_usage(pool_name: str) -> str:
    """The usage name of the secret a pool_define with a password makes (and pool_undefine removes)."""
    return f"pool_{pool_name}"


def pool_secret(conn: Conn, spec: Data, test: bool = False) -> tuple[Data, bool]:
    """``spec`` with a source_auth password moved into a libvirt secret (made when missing, its value set;
    an existing secret referenced by the current definition is reused). Returns (spec, changed)."""
    auth = spec["source"].get("auth")
    if not auth or "password" not in auth:
        return spec, False
    password = auth["password"]
    if spec["type"] == "rbd":  # ceph keys are given base64-encoded, libvirt wants the raw key
        try:
            password = base64.b64decode(password, validate=True)
        except (binascii.Error, ValueError):
            raise SaltInvocationError(
                "an rbd source_auth password is the base64 ceph key (ceph auth get-key)"
            ) from None
    else:
        password = password.encode()
    current = netpool.lookup(conn, "pool", spec["name"])
    ref = None
    if current is not None:
        ref = (poolxml.parse_pool(current.XMLDesc(0))["source"].get("auth") or {}).get("secret")
    ref = ref or {"type": "usage", "value": secret_usage(spec["name"])}
    secret = None
    try:
        if ref["type"] == "uuid":
            secret = conn.secretLookupByUUIDString(ref["value"])
        else:
            secret = conn.secretLookupByUsage(_usage_type(auth["type"]), ref["value"])
    except libvirt.libvirtError as exc:
        if exc.get_error_code() not in (libvirt.VIR_ERR_NO_SECRET, libvirt.VIR_ERR_NO_SUPPORT):
            msg = exc.get_error_message()
            raise CommandExecutionError(f"looking up the secret of pool {spec['name']}: {msg}") from None
    # the secret is private (its value cannot be read back through the API), so an existing one cannot be
    # compared: its value is (re)set on every call, as Salt did, and reported only when the secret is new
    changed = secret is None
    if not test:
        with lv_errors(f"store the source_auth password of pool {spec['name']} in a libvirt secret"):
            if secret is None:
                ref = {"type": "usage", "value": secret_usage(spec["name"])}
                desc = f"source_auth of storage pool {spec['name']} (salt-virt)"
                secret = conn.secretDefineXML(poolxml.secret_xml(auth["type"], ref["value"], desc), 0)
            secret.setValue(password, 0)
    out = dict(spec, source=dict(spec["source"]))
    out["source"]["auth"] = {"type": auth["type"], "username": auth["username"], "secret": ref}
    return out, changed


def _drop_secret(conn, pool_xml, name):
    """Undefine the secret pool_define made for pool ``name`` (usage pool_<name>); other secrets stay."""
    auth = poolxml.parse_pool(pool_xml)["source"].get("auth")
    if not auth or auth["secret"] != {"type": "usage", "value": secret_usage(name)}:
        return False
    try:
        conn.secretLookupByUsage(_usage_type(auth["type"]), secret_usage(name)).undefine()
    except libvirt.libvirtError:
        return False
    return True


def start_pool(conn: Conn, name: str, build: bool = True) -> bool:
    """Start a pool, building it first (see netpool.start). False when it was running already."""
    return netpool.start(conn, "pool", name, build=build)


def define_pool(conn: Conn, spec: Data, transient: bool = False, start: bool = True) -> bool:
    """Salt's ``pool_define``: define (or, ``transient``, create running) a new pool. Returns True."""
    if netpool.lookup(conn, "pool", spec["name"]) is not None:
        raise SaltInvocationError(
            f"pool {spec['name']!r} is already defined: use virt.pool_update or the virt.pool_defined state"
        )
    spec, _ = pool_secret(conn, spec)
    xml = poolxml.pool_xml(spec)
    with lv_errors(f"define pool {spec['name']!r}"):
        if transient:
            conn.storagePoolCreateXML(xml, 0)
            return True
        define(conn, "pool", xml)
    if start:
        start_pool(conn, spec["name"])
    return True


def update_pool(conn: Conn, spec: Data, test: bool = False) -> bool:
    """Salt's ``pool_update``: redefine when the declared fields differ (uuid and undeclared fields kept).
    Returns whether it (would have) changed."""
    obj = netpool.get(conn, "pool", spec["name"])
    current = poolxml.parse_pool(netpool.read_xml(obj, "pool", inactive=True))
    poolxml.check_required(poolxml.merged(spec, current))
    spec, secret_changed = pool_secret(conn, spec, test=test)
    diff = poolxml.pool_diff(spec, current)
    if diff and not test:
        with lv_errors(f"redefine pool {spec['name']!r}"):
            define(conn, "pool", poolxml.pool_xml(spec, netpool.read_xml(obj, "pool", inactive=True)))
    return bool(diff) or secret_changed


def ensure_pool(
    conn: Conn,
    spec: Data,
    autostart: bool | None = True,
    run: bool = False,
    transient: bool = False,
    test: bool = False,
    build: bool = True,
) -> Data:
    """The ``virt.pool_defined`` / ``pool_running`` states (see netpool.ensure), with source_auth secrets
    and transient pools (``build``: build a pool it starts). Returns {'changes', 'comment'}; changes never
    hold a password."""
    name = spec["name"]
    existing = netpool.lookup(conn, "pool", name)
    if existing is None:
        poolxml.check_required(spec)
    else:
        poolxml.check_required(poolxml.merged(spec, poolxml.parse_pool(existing.XMLDesc(0))))
    spec, secret_changed = pool_secret(conn, spec, test=test)
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


def pool_info(conn: Conn, name: str | None = None) -> dict[str, Data]:
    """Salt's ``pool_info`` keys (uuid, state, capacity, allocation, free, autostart, persistent,
    target_path, type) plus ours (target, active, available, source, permissions)."""
    out = {}
    for pname, facts in netpool.info(conn, "pool", name).items():
        obj = netpool.get(conn, "pool", pname)
        state = obj.info()[0]
        facts.setdefault("capacity", 0)
        facts.setdefault("allocation", 0)
        facts.setdefault("available", 0)
        facts.update(
            uuid=obj.UUIDString(),
            state=POOL_STATES[state] if state < len(POOL_STATES) else "unknown",
            free=facts["available"],
            target_path=facts["target"],
        )
        out[pname] = facts
    return out


def _call(conn, name, action, func):
    obj = netpool.get(conn, "pool", name)
    with lv_errors(f"{action} pool {name!r}"):
        func(obj)
    return True


def build_pool(conn: Conn, name: str) -> Any:
    return _call(conn, name, "build", lambda o: o.build(0))


def refresh_pool(conn: Conn, name: str) -> Any:
    obj = netpool.get(conn, "pool", name)
    if not obj.isActive():
        raise CommandExecutionError(f"pool {name!r} is not running: start it (virt.pool_start) to refresh it")
    return _call(conn, name, "refresh", lambda o: o.refresh(0))


def delete_pool(conn: Conn, name: str, zeroed: bool = False) -> Any:
    """Delete what build made (the target directory, the volume group): the pool must be stopped.
    ``zeroed``: ask libvirt to overwrite the data with zeros first (Salt's ``fast=False``)."""
    obj = netpool.get(conn, "pool", name)
    if obj.isActive():
        raise CommandExecutionError(f"pool {name!r} is running: stop it (virt.pool_stop) before deleting it")
    flags = libvirt.VIR_STORAGE_POOL_DELETE_ZEROED if zeroed else libvirt.VIR_STORAGE_POOL_DELETE_NORMAL
    return _call(conn, name, "delete", lambda o: o.delete(flags))


def undefine_pool(conn: Conn, name: str) -> bool:
    obj = netpool.get(conn, "pool", name)
    xml = obj.XMLDesc(0)
    netpool.undefine(conn, "pool", name)
    _drop_secret(conn, xml, name)
    return True


def delete_all(conn: Conn, name: str, purge: bool = False, test: bool = False) -> tuple[Data | None, list[str]]:
    """The ``virt.pool_deleted`` state: (purge: delete its volumes, stop, delete) and undefine.
    Returns (changes in Salt's shape, list of unsupported actions)."""
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
                        delete_volume(conn, name, vol)
                    changes["deleted_volumes"].append(vol)
        if not test:
            netpool.stop(conn, "pool", name)
        changes["stopped"] = True
    if purge:
        if ptype in poolxml.DELETABLE:
            if not test:
                delete_pool(conn, name)
            changes["deleted"] = True
        else:
            unsupported.append("deleting pool")
    if not test and netpool.lookup(conn, "pool", name) is not None:  # a transient pool is gone once stopped
        undefine_pool(conn, name)
    changes["undefined"] = True
    return changes, unsupported


def _computed_caps(conn):
    return [{"name": ptype, "supported": True} for ptype in poolxml.POOL_TYPES]


def _parse_caps(xml):
    out = []
    for pool in ET.fromstring(xml).findall("pool"):
        entry: Data = {"name": pool.get("type"), "supported": pool.get("supported") == "yes"}
        options = {}
        for kind, fmt_tag in (("pool", "sourceFormatType"), ("volume", "targetFormatType")):
            el = pool.find(kind)
            if el is None:
                continue
            default = el.find("defaultFormat")
            values = [v.text for v in el.findall(f"enum[@name='{fmt_tag}']/value")]
            opt: Data = {}
            if default is not None:
                opt["default_format"] = default.get("type")
            if values:
                opt[fmt_tag] = values
            if opt:
                options[kind] = opt
        if options:
            entry["options"] = options
        out.append(entry)
    return out


def capabilities(conn: Conn) -> Data:
    """Salt's ``pool_capabilities``: {computed, pool_types: [{name, supported, options}]}."""
    try:
        return {"computed": False, "pool_types": _parse_caps(conn.getStoragePoolCapabilities(0))}
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
            raise CommandExecutionError(f"read storage pool capabilities: {exc.get_error_message()}") from None
    return {"computed": True, "pool_types": _computed_caps(conn)}


# volumes ------------------------------------------------------------------------------------------
def running_pool(conn: Conn, pool: str) -> Any:
    obj = netpool.get(conn, "pool", pool)
    if not obj.isActive():
        raise CommandExecutionError(f"pool {pool!r} is not running: start it (virt.pool_start {pool})")
    return obj


def lookup_volume(conn: Conn, pool: str, name: str) -> Any:
    obj = running_pool(conn, pool)
    try:
        return obj.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise CommandExecutionError(f"looking up volume {name!r} in pool {pool!r}: {exc.get_error_message()}") from None


def get_volume(conn: Conn, pool: str, name: str) -> Any:
    vol = lookup_volume(conn, pool, name)
    if vol is None:
        raise CommandExecutionError(f"volume {name!r} does not exist in pool {pool!r}")
    return vol


def create_volume_xml(conn: Conn, pool: str, xml: str) -> Any:
    """Create a volume from XML in a running pool; an existing name is an error (nothing overwritten)."""
    try:
        name = ET.fromstring(xml).findtext("name")
    except ET.ParseError as exc:
        raise SaltInvocationError(f"the volume XML does not parse: {exc}") from None
    if not name:
        raise SaltInvocationError("the volume XML has no <name>")
    obj = running_pool(conn, pool)
    if lookup_volume(conn, pool, name) is not None:
        raise SaltInvocationError(
            f"volume {name!r} already exists in pool {pool!r}: nothing was changed (virt.volume_delete it first)"
        )
    with lv_errors(f"create volume {name!r} in pool {pool!r}"):
        return obj.createXML(xml, 0)


def define_volume(conn: Conn, pool: str, spec: Data) -> bool:
    """Salt's ``volume_define``: a new volume (logical pools allocate it fully, as LVM does)."""
    obj = running_pool(conn, pool)
    if ET.fromstring(obj.XMLDesc(0)).get("type") == "logical":
        spec = dict(spec, allocation=spec["size"])
    create_volume_xml(conn, pool, poolxml.volume_xml(spec))
    return True


def delete_volume(conn: Conn, pool: str, name: str) -> bool:
    vol = get_volume(conn, pool, name)
    try:
        vol.delete(0)
    except libvirt.libvirtError as exc:
        if not _delete_partition(conn, pool, name):
            raise CommandExecutionError(f"delete volume {name!r} of pool {pool!r}: {exc.get_error_message()}") from None
    return True


def _delete_partition(conn, pool, name):
    """libvirt (9.x) cannot delete a partition of a disk pool whose device name ends in a digit (loop0,
    nvme0n1): it asks parted to remove partition 'p1'. Remove partition N of the local device ourselves
    (parted, as libvirt would) and refresh the pool. False when this is not that case."""
    obj = running_pool(conn, pool)
    facts = poolxml.parse_pool(obj.XMLDesc(0))
    devices = facts["source"]["devices"] or []
    if facts["type"] != "disk" or len(devices) != 1:
        return False
    device = devices[0]["path"]
    base = os.path.basename(device)
    number = name[len(base) + 1 :] if name.startswith(base + "p") and base[-1:].isdigit() else ""
    if not number.isdigit() or not os.path.exists(device):
        return False
    proc = subprocess.run(["parted", "-s", device, "rm", number], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise CommandExecutionError(f"delete partition {number} of {device} (volume {name}): {proc.stderr.strip()}")
    with lv_errors(f"refresh pool {pool!r}"):
        obj.refresh(0)
    return True


def upload_volume(
    conn: Conn, pool: str, name: str, path: str, offset: int = 0, length: int = 0, sparse: bool = False
) -> bool:
    """Salt's ``volume_upload``: write a local file into a volume at ``offset`` (``length`` bytes, 0: all)."""
    validate.absolute_path(path, "file")
    if not os.path.isfile(path):
        raise SaltInvocationError(f"file {path!r} does not exist or is not a regular file")
    offset, length = int(offset or 0), int(length or 0)
    if offset < 0 or length < 0:
        raise SaltInvocationError("offset and length cannot be negative")
    vol = get_volume(conn, pool, name)
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


def _domain_disk_paths(conn):
    out = {}
    for dom in conn.listAllDomains(0):
        paths = set()
        for disk in definition.parse(dom.XMLDesc(0))["disks"]:
            if disk["pool"] and disk["volume"]:
                paths.add(("vol", disk["pool"], disk["volume"]))
            elif disk["file"]:
                paths.add(disk["file"])
        out[dom.name()] = paths
    return out


def volume_infos(conn: Conn, pool: str | None = None, volume: str | None = None) -> dict[str, Data]:
    """Salt's ``volume_infos``: {pool: {volume: {type, key, path, capacity, allocation, used_by,
    backing_store, format}}} over running pools (empty pools left out)."""
    disks = _domain_disk_paths(conn)
    pools = [p for p in conn.listAllStoragePools(0) if p.isActive() and (pool is None or p.name() == pool)]
    backing: Data = {}
    result = {}
    for pobj in pools:
        vols = {}
        for vol in pobj.listAllVolumes(0):
            if volume is not None and vol.name() != volume:
                continue
            try:
                kind, cap, alloc = vol.info()
                facts = poolxml.parse_volume(vol.XMLDesc(0))
            except libvirt.libvirtError:  # gone since the last refresh
                continue
            vols[vol.name()] = {
                "type": VOLUME_TYPES[kind] if kind < len(VOLUME_TYPES) else "unknown",
                "key": vol.key(),
                "path": vol.path(),
                "capacity": cap,
                "allocation": alloc,
                "backing_store": facts["backing_store"],
                "format": facts["format"],
                "_ref": ("vol", pobj.name(), vol.name()),
            }
            if facts["backing_store"]:
                backing.setdefault(facts["backing_store"]["path"], set()).add(vol.path())
        if vols:
            result[pobj.name()] = vols
    for vols in result.values():
        for facts in vols.values():
            users = {facts["path"], facts.pop("_ref")} | backing.get(facts["path"], set())
            facts["used_by"] = sorted(vm for vm, paths in disks.items() if paths & users)
    return result


def ensure_volume(conn: Conn, pool: str, spec: Data, test: bool = False) -> Data:
    """The ``virt.volume_defined`` state: {'result', 'changes', 'comment'} (Salt's comments)."""
    if netpool.lookup(conn, "pool", pool) is None:
        raise SaltInvocationError(f"Storage pool {pool} not existing")
    vol = lookup_volume(conn, pool, spec["name"])
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
        define_volume(conn, pool, spec)
    return {
        "result": None if test else True,
        "changes": {f"{pool}/{spec['name']}": {"old": "", "new": "defined"}},
        "comment": f"Volume {spec['name']} {'would be ' if test else ''}defined in pool {pool}",
    }
