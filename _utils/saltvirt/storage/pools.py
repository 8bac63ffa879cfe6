"""Storage pools and volumes on a libvirt connection: what Salt's calls (:mod:`saltvirt.storage.poolcalls`) and
a VM's pool disks (:mod:`saltvirt.storage.volumes`) share: a pool's source_auth secret, its facts and
capabilities, volumes looked up, created and deleted. The lifecycle (define, start, stop, autostart: shared with
networks) is :mod:`saltvirt.host.netpool`, the XML :mod:`saltvirt.xml.poolxml`.
"""

import base64
import binascii
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import netpool
from saltvirt.host.conn import libvirt, lv_errors
from saltvirt.xml import poolxml
from saltvirt.xml.domain import definition

POOL_STATES = ("inactive", "building", "running", "degraded", "inaccessible")
VOLUME_TYPES = ("file", "block", "dir", "network", "netdir", "ploop")


def secret_usage_type(secret_type: str) -> int:
    """libvirt's usage type of a pool's source_auth secret (``ceph``, else iSCSI)."""
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
            secret = conn.secretLookupByUsage(secret_usage_type(auth["type"]), ref["value"])
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


def act(conn: Conn, name: str, action: str, func: Callable[[Any], Any]) -> bool:
    """``func(pool)`` on the pool ``name``, libvirt's errors saying ``action``. Returns True."""
    obj = netpool.get(conn, "pool", name)
    with lv_errors(f"{action} pool {name!r}"):
        func(obj)
    return True


def refresh_pool(conn: Conn, name: str) -> bool:
    obj = netpool.get(conn, "pool", name)
    if not obj.isActive():
        raise CommandExecutionError(f"pool {name!r} is not running: start it (virt.pool_start) to refresh it")
    return act(conn, name, "refresh", lambda o: o.refresh(0))


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
