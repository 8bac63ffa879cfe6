"""libvirt storage pool, volume and secret XML (ElementTree): specs from Salt's ``pool_define`` /
``volume_define`` arguments, builders, parsers and desired-vs-current comparison. No libvirt calls here."""

import xml.etree.ElementTree as ET
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.xml.etree import attr

# type: (what the pool needs to be usable, one line for the error message)
POOL_TYPES = {
    "dir": ("target",),
    "fs": ("target", "devices"),
    "netfs": ("target", "hosts", "dir"),
    "logical": (),  # source name (the volume group) defaults to the pool name
    "disk": ("devices",),
    "iscsi": ("hosts", "devices"),
    "iscsi-direct": ("hosts", "devices", "initiator"),
    "scsi": ("adapter",),
    "mpath": (),
    "rbd": ("hosts", "name"),
    "gluster": ("hosts", "name"),
    "zfs": ("name",),
}
# types whose pool_build makes something (dir/fs/netfs: the target directory; logical: the volume group on
# empty devices; disk: a partition table on an empty disk). libvirt refuses to build over existing data
# unless asked to overwrite, which we never ask.
BUILDABLE = ("dir", "fs", "netfs", "logical", "disk")
# types where deleting the pool (VIR_STORAGE_POOL_DELETE_NORMAL) removes what build made
DELETABLE = ("dir", "fs", "netfs", "logical", "zfs")
# types whose volumes cannot be deleted through libvirt
NO_VOLUME_DELETE = ("iscsi", "iscsi-direct", "mpath", "scsi")
SECRET_TYPES = {"rbd": "ceph", "iscsi": "chap", "iscsi-direct": "chap"}
SOURCE_KEYS = ("devices", "dir", "hosts", "name", "format", "initiator", "adapter", "auth")
ADAPTER_ATTRS = ("type", "name", "parent", "managed", "parent_wwnn", "parent_wwpn", "parent_fabric_wwn", "wwnn", "wwpn")
_SOURCE_WORDS = {
    "target": "target=<path>",
    "devices": "source_devices=[{path: ...}]",
    "hosts": "source_hosts=['host[:port]']",
    "dir": "source_dir=<exported directory>",
    "name": "source_name=<name>",
    "initiator": "source_initiator=<initiator IQN>",
    "adapter": "source_adapter={type: ..., name: ...}",
}


def _permissions(perms, what):
    if perms is None:
        return None
    if isinstance(perms, list) and all(isinstance(p, dict) for p in perms):  # YAML "- mode: ..." lists
        perms = {k: v for p in perms for k, v in p.items()}
    if not isinstance(perms, dict) or set(perms) - {"mode", "owner", "group", "label"}:
        raise SaltInvocationError(f"{what} permissions must be a dict with mode, owner, group and/or label")
    out = {}
    if perms.get("mode") is not None:
        try:
            out["mode"] = f"{int(str(perms['mode']), 8):04o}"
        except ValueError:
            raise SaltInvocationError(
                f"{what} permissions mode must be octal like '0755', got {perms['mode']!r}"
            ) from None
    for key in ("owner", "group"):
        if perms.get(key) is not None:
            if not str(perms[key]).lstrip("-").isdigit():
                raise SaltInvocationError(f"{what} permissions {key} must be a numeric id, got {perms[key]!r}")
            out[key] = str(int(perms[key]))
    if perms.get("label"):
        out["label"] = str(perms["label"])
    return out or None


def _hosts(hosts):
    if hosts is None:
        return None
    if isinstance(hosts, str):
        hosts = [hosts]
    out = []
    for host in hosts:
        name, _, port = str(host).rpartition(":") if str(host).count(":") == 1 else (str(host), "", "")
        if not name or (port and not port.isdigit()) or any(c in name for c in " /<>'\""):
            raise SaltInvocationError(f"source_hosts entries are 'host' or 'host:port', got {host!r}")
        out.append({"name": name, "port": port or None})
    return out


def _devices(devices):
    if devices is None:
        return None
    if isinstance(devices, (str, dict)):
        devices = [devices]
    out = []
    for item in devices:
        dev = {"path": item} if isinstance(item, str) else dict(item)
        if not dev.get("path") or set(dev) - {"path", "part_separator"}:
            raise SaltInvocationError(f"source_devices entries are {{path, part_separator}}, got {dev!r}")
        sep = dev.get("part_separator")
        if sep is not None:
            dev["part_separator"] = "yes" if validate.to_bool(sep) else "no"
        out.append(dev)
    return out


def _auth(auth, ptype):
    """Salt's ``source_auth``: {type, username, secret: {type: uuid|usage, value}}, or {username, password}
    (the password goes into a libvirt secret; see ``storage.pool_secret``)."""
    if auth is None:
        return None
    if not isinstance(auth, dict) or not auth.get("username"):
        raise SaltInvocationError("source_auth needs username plus password or secret={type: uuid|usage, value}")
    if ptype not in SECRET_TYPES:
        raise SaltInvocationError(f"source_auth is for rbd, iscsi and iscsi-direct pools, not {ptype}")
    out = {"type": auth.get("type") or SECRET_TYPES[ptype], "username": str(auth["username"])}
    if out["type"] != SECRET_TYPES[ptype]:
        raise SaltInvocationError(f"source_auth type of a {ptype} pool is {SECRET_TYPES[ptype]}, got {out['type']!r}")
    if auth.get("password") is not None:
        out["password"] = str(auth["password"])
    elif isinstance(auth.get("secret"), dict) and auth["secret"].get("type") in ("uuid", "usage"):
        out["secret"] = {"type": auth["secret"]["type"], "value": str(auth["secret"]["value"])}
    else:
        raise SaltInvocationError("source_auth needs a password or secret={type: uuid|usage, value}")
    return out


def pool_spec(
    name: str,
    ptype: str = "dir",
    target: Any = None,
    permissions: Any = None,
    source_devices: Any = None,
    source_dir: Any = None,
    source_initiator: Any = None,
    source_adapter: Any = None,
    source_hosts: Any = None,
    source_auth: Any = None,
    source_name: Any = None,
    source_format: Any = None,
    require: bool = True,
) -> Data:
    """Normalised desired pool: {name, type, target, permissions, source: {devices, dir, hosts, name,
    format, initiator, adapter, auth}} (None: not declared). Raises SaltInvocationError naming what a
    type is missing (``require=False``: an update of an existing pool, see ``check_required``)."""
    validate.vm_name(name, "pool name")
    if ptype not in POOL_TYPES:
        raise SaltInvocationError(f"pool type must be one of {', '.join(POOL_TYPES)}, got {ptype!r}")
    if target is not None:
        validate.absolute_path(target, "pool target")
        target = target.rstrip("/") or "/"
    if source_adapter is not None and not (isinstance(source_adapter, dict) and source_adapter.get("type")):
        raise SaltInvocationError("source_adapter must be a dict with at least type (scsi_host or fc_host)")
    if source_dir is not None and source_format != "cifs" and ptype != "gluster":
        validate.absolute_path(source_dir, "source_dir")
    if source_initiator is not None and not str(source_initiator).startswith("iqn."):
        raise SaltInvocationError(
            f"source_initiator is an iSCSI IQN (iqn.YYYY-MM.domain:name), got {source_initiator!r}"
        )
    source = {
        "devices": _devices(source_devices),
        "dir": (source_dir.lstrip("/") if source_format == "cifs" else source_dir) if source_dir else None,
        "hosts": _hosts(source_hosts),
        "name": str(source_name) if source_name is not None else None,
        "format": str(source_format) if source_format is not None else None,
        "initiator": str(source_initiator) if source_initiator is not None else None,
        "adapter": dict(source_adapter) if source_adapter is not None else None,
        "auth": _auth(source_auth, ptype),
    }
    spec = {
        "name": name,
        "type": ptype,
        "target": target,
        "permissions": _permissions(permissions, "pool target"),
        "source": source,
    }
    return check_required(spec) if require else spec


def check_required(spec: Data) -> Data:
    """``spec`` if it has what its type needs, else SaltInvocationError naming the missing arguments."""
    have = dict(spec["source"], target=spec["target"])
    missing = [_SOURCE_WORDS[key] for key in POOL_TYPES[spec["type"]] if not have.get(key)]
    if missing:
        article = "an" if spec["type"][0] in "aeio" else "a"
        raise SaltInvocationError(f"{article} {spec['type']} pool needs {', '.join(missing)}")
    return spec


# each element's builder beside its reader; pool_xml/parse_pool and volume_xml/parse_volume compose them
def _perm_element(parent, perms):
    if perms:
        el = ET.SubElement(parent, "permissions")
        for key in ("mode", "owner", "group", "label"):
            if perms.get(key) is not None:
                ET.SubElement(el, key).text = perms[key]


def _perm_facts(el):
    if el is None:
        return None
    return {child.tag: child.text for child in el if child.text is not None} or None


def _source_element(src):
    el = ET.Element("source")
    for host in src.get("hosts") or []:
        ET.SubElement(el, "host", {k: v for k, v in host.items() if v})
    for dev in src.get("devices") or []:
        ET.SubElement(el, "device", dev)
    if src.get("dir"):
        ET.SubElement(el, "dir", path=src["dir"])
    adapter = src.get("adapter")
    if adapter:
        ad = ET.SubElement(el, "adapter", {k: str(adapter[k]) for k in ADAPTER_ATTRS if adapter.get(k) is not None})
        parent = adapter.get("parent_address")
        if parent:
            pa = ET.SubElement(
                ad, "parentaddr", {"unique_id": str(parent["unique_id"])} if "unique_id" in parent else {}
            )
            ET.SubElement(pa, "address", {k: str(v) for k, v in (parent.get("address") or {}).items()})
    if src.get("name"):
        ET.SubElement(el, "name").text = src["name"]
    if src.get("format"):
        ET.SubElement(el, "format", type=src["format"])
    if src.get("initiator"):
        ET.SubElement(ET.SubElement(el, "initiator"), "iqn", name=src["initiator"])
    auth = src.get("auth")
    if auth and auth.get("secret"):
        au = ET.SubElement(el, "auth", type=auth["type"], username=auth["username"])
        ET.SubElement(au, "secret", {auth["secret"]["type"]: auth["secret"]["value"]})
    return el


def _source_facts(src):
    adapter = src.find("adapter")
    auth = src.find("auth")
    secret = auth.find("secret") if auth is not None else None
    source: Data = {
        "devices": [dict(d.attrib) for d in src.findall("device")] or None,
        "dir": attr(src, "dir", "path"),
        "hosts": [{"name": h.get("name"), "port": h.get("port")} for h in src.findall("host")] or None,
        "name": src.findtext("name"),
        "format": attr(src, "format", "type"),
        "initiator": attr(src, "initiator/iqn", "name"),
        "adapter": dict(adapter.attrib) if adapter is not None else None,
        "auth": None,
    }
    pa = adapter.find("parentaddr") if adapter is not None else None
    if pa is not None:
        address = pa.find("address")
        source["adapter"]["parent_address"] = dict(
            pa.attrib, address=dict(address.attrib if address is not None else {})
        )
    if auth is not None:
        kind = "uuid" if secret is not None and secret.get("uuid") else "usage"
        source["auth"] = {
            "type": auth.get("type"),
            "username": auth.get("username"),
            "secret": {"type": kind, "value": secret.get(kind) if secret is not None else None},
        }
    return source


def pool_xml(spec: Data, base: str | None = None) -> str:
    """Pool XML for ``spec`` (its source auth must reference a secret by then). With ``base`` (the current
    definition) the uuid stays and what the spec leaves undeclared (None) is taken from ``base``."""
    if base is not None:
        spec = merged(spec, parse_pool(base))
    root = ET.Element("pool", type=spec["type"])
    ET.SubElement(root, "name").text = spec["name"]
    if base is not None and ET.fromstring(base).findtext("uuid"):
        ET.SubElement(root, "uuid").text = ET.fromstring(base).findtext("uuid")
    src = _source_element(spec["source"])
    if len(src) or spec["type"] != "dir":
        root.append(src)
    path = spec["target"]
    if not path and spec["type"] == "logical":
        # libvirt's own default (the volume group's /dev directory), written out: its schema check
        # (VIR_STORAGE_POOL_DEFINE_VALIDATE) requires a target for a logical pool
        path = f"/dev/{spec['source'].get('name') or spec['name']}"
    if path or spec["permissions"]:
        target = ET.SubElement(root, "target")
        if path:
            ET.SubElement(target, "path").text = path
        _perm_element(target, spec["permissions"])
    return ET.tostring(root, encoding="unicode")


def parse_pool(xml: str) -> Data:
    """A spec-shaped dict of a pool definition (libvirt's defaults included as it reports them)."""
    root = ET.fromstring(xml)
    src = root.find("source")
    return {
        "name": root.findtext("name"),
        "type": root.get("type"),
        "target": root.findtext("target/path"),
        "permissions": _perm_facts(root.find("target/permissions")),
        "source": _source_facts(src if src is not None else ET.Element("source")),
    }


def merged(spec: Data, current: Data) -> Data:
    """``spec`` with what it leaves undeclared (None) taken from ``current`` (a parsed definition)."""
    out = dict(spec, source=dict(spec["source"]))
    if out["target"] is None:
        out["target"] = current.get("target")
    if out["permissions"] is None:
        out["permissions"] = current.get("permissions")
    for key in SOURCE_KEYS:
        if out["source"].get(key) is None:
            out["source"][key] = (current.get("source") or {}).get(key)
    return out


def public(spec: Data) -> Data:
    """The spec as it may appear in a state's changes or a job return: no password."""
    out = dict(spec, source=dict(spec["source"]))
    auth = out["source"].get("auth")
    if auth and "password" in auth:
        out["source"]["auth"] = dict(auth, password="***")
    return out


def _auth_differs(want, cur):
    keys = ("type", "username", "secret") if "secret" in want else ("type", "username")
    return any(want.get(k) != (cur or {}).get(k) for k in keys)


def _devices_differ(want, cur):
    cur = cur or []
    if [d["path"] for d in want] != [d.get("path") for d in cur]:
        return True
    return any(d.get("part_separator") not in (None, c.get("part_separator")) for d, c in zip(want, cur, strict=True))


def _hosts_differ(want, cur):
    cur = cur or []  # libvirt reports no port when none was given; a declared port must match
    if [h["name"] for h in want] != [h["name"] for h in cur]:
        return True
    return any(h["port"] and h["port"] != c.get("port") for h, c in zip(want, cur, strict=True))


def _source_differs(key, want, cur):
    if key == "auth":
        return _auth_differs(want, cur)
    if key == "devices":
        return _devices_differ(want, cur)
    if key == "hosts":
        return _hosts_differ(want, cur)
    if key == "adapter":
        return any(str(v) != str((cur or {}).get(k)) for k, v in want.items() if k != "parent_address")
    return want != cur


def pool_diff(spec: Data, current: Data) -> Data:
    """{field: {old, new}} for what the spec declares and the current definition does not have
    (undeclared fields and libvirt's filled-in defaults are not differences). Auth is compared by
    type, username and secret reference (a new password is the secret's business: storage.pool_secret)."""
    out = {}
    for key in ("type", "target"):
        if spec[key] is not None and spec[key] != current.get(key):
            out[key] = {"old": current.get(key), "new": spec[key]}
    if spec["permissions"]:
        cur = current.get("permissions") or {}
        if any(cur.get(k) != v for k, v in spec["permissions"].items()):
            out["permissions"] = {"old": cur or None, "new": spec["permissions"]}
    shown = public(spec)["source"]
    for key in SOURCE_KEYS:
        want, cur = spec["source"].get(key), (current.get("source") or {}).get(key)
        if want is not None and _source_differs(key, want, cur):
            out[f"source_{key}"] = {"old": cur, "new": shown[key]}
    return out


def secret_xml(secret_type: str, usage: str, description: str) -> str:
    """A private, persistent libvirt secret for a pool's source auth (usage: ceph name or iscsi target)."""
    root = ET.Element("secret", ephemeral="no", private="yes")
    ET.SubElement(root, "description").text = description
    usage_el = ET.SubElement(root, "usage", type="ceph" if secret_type == "ceph" else "iscsi")
    ET.SubElement(usage_el, "name" if secret_type == "ceph" else "target").text = usage
    return ET.tostring(root, encoding="unicode")


# volumes ------------------------------------------------------------------------------------------
VOLUME_TYPES = (None, "file", "block", "dir", "network", "netdir", "ploop")


def _mib(value, what):
    try:
        mib = int(value)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"{what} is a whole number of MiB, got {value!r}") from None
    if mib < 0:
        raise SaltInvocationError(f"{what} cannot be negative, got {value!r}")
    return mib


def volume_spec(  # pylint: disable=redefined-builtin
    name: str,
    size: Any,
    allocation: Any = 0,
    format: Any = None,
    type: Any = None,
    permissions: Any = None,
    backing_store: Any = None,
    nocow: Any = False,
) -> Data:
    """Normalised desired volume (Salt's ``volume_define`` arguments; sizes in MiB)."""
    validate.vm_name(name, "volume name")
    if type not in VOLUME_TYPES:
        raise SaltInvocationError(f"volume type must be one of file, block, dir, network, netdir, ploop, got {type!r}")
    if backing_store is not None:
        if not isinstance(backing_store, dict) or not backing_store.get("path") or not backing_store.get("format"):
            raise SaltInvocationError(
                "backing_store needs path and format (the format is never guessed: a guessed format lets a "
                "guest read host files)"
            )
        validate.absolute_path(backing_store["path"], "backing_store path")
        backing_store = {"path": backing_store["path"], "format": str(backing_store["format"])}
    return {
        "name": name,
        "type": type,
        "size": _mib(size, "size"),
        "allocation": _mib(allocation or 0, "allocation"),
        "format": str(format) if format else None,
        "permissions": _permissions(permissions, "volume"),
        "backing_store": backing_store,
        "nocow": validate.to_bool(nocow),
    }


def volume_xml(spec: Data) -> str:
    root = ET.Element("volume", {"type": spec["type"]} if spec["type"] else {})
    ET.SubElement(root, "name").text = spec["name"]
    ET.SubElement(root, "capacity", unit="bytes").text = str(spec["size"] * 1024 * 1024)
    ET.SubElement(root, "allocation", unit="bytes").text = str(spec["allocation"] * 1024 * 1024)
    target = ET.SubElement(root, "target")
    if spec["format"]:
        ET.SubElement(target, "format", type=spec["format"])
    _perm_element(target, spec["permissions"])
    if spec["nocow"]:
        ET.SubElement(target, "nocow")
    if spec["backing_store"]:
        bs = ET.SubElement(root, "backingStore")
        ET.SubElement(bs, "path").text = spec["backing_store"]["path"]
        ET.SubElement(bs, "format", type=spec["backing_store"]["format"])
    return ET.tostring(root, encoding="unicode")


def parse_volume(xml: str) -> Data:
    root = ET.fromstring(xml)
    fmt = root.find("target/format")
    bs_path, bs_fmt = root.findtext("backingStore/path"), root.find("backingStore/format")
    return {
        "name": root.findtext("name"),
        "type": root.get("type"),
        "path": root.findtext("target/path"),
        "format": fmt.get("type") if fmt is not None else None,
        "backing_store": (
            {"path": bs_path, "format": bs_fmt.get("type") if bs_fmt is not None else None} if bs_path else None
        ),
    }
