"""libvirt virtual networks and storage pools: XML (ElementTree), desired-vs-current, lifecycle."""
import ipaddress
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt import validate
from saltvirt.conn import libvirt, lv_errors

FORWARD_MODES = (None, "nat", "route", "bridge", "open", "isolated")
POOL_TYPES = ("dir",)


def network_spec(name, bridge=None, forward="nat", ip=None, dhcp_start=None, dhcp_end=None):
    """Normalised desired network: {name, bridge, forward, ip (CIDR), dhcp: [start, end]}."""
    validate.vm_name(name, "network name")
    if forward in ("isolated", "none", ""):
        forward = None
    if forward not in FORWARD_MODES:
        raise SaltInvocationError(f"forward must be one of nat, route, bridge, open or none, got {forward!r}")
    if forward == "bridge" and not bridge:
        raise SaltInvocationError("forward=bridge needs bridge=<existing host bridge>")
    if bridge:
        validate.vm_name(bridge, "bridge name")
    net = None
    if ip:
        try:
            net = ipaddress.ip_interface(ip)
        except ValueError:
            raise SaltInvocationError(f"ip must be ADDRESS/PREFIX (e.g. 192.168.100.1/24), got {ip!r}") from None
    dhcp = None
    if dhcp_start or dhcp_end:
        if not net:
            raise SaltInvocationError("dhcp range needs ip=")
        for addr in (dhcp_start, dhcp_end):
            if ipaddress.ip_address(addr) not in net.network:
                raise SaltInvocationError(f"dhcp address {addr} is outside {net.network}")
        dhcp = [str(dhcp_start), str(dhcp_end)]
    return {"name": name, "bridge": bridge, "forward": forward, "ip": str(net) if net else None, "dhcp": dhcp}


def network_xml(spec):
    root = ET.Element("network")
    ET.SubElement(root, "name").text = spec["name"]
    if spec["forward"]:
        ET.SubElement(root, "forward", mode=spec["forward"])
    if spec["bridge"]:
        ET.SubElement(root, "bridge", name=spec["bridge"])
    if spec["ip"] and spec["forward"] != "bridge":
        net = ipaddress.ip_interface(spec["ip"])
        ip_el = ET.SubElement(root, "ip", address=str(net.ip), prefix=str(net.network.prefixlen))
        if spec["dhcp"]:
            ET.SubElement(ET.SubElement(ip_el, "dhcp"), "range", start=spec["dhcp"][0], end=spec["dhcp"][1])
    return ET.tostring(root, encoding="unicode")


def parse_network(xml):
    root = ET.fromstring(xml)
    fwd, br, ip_el = root.find("forward"), root.find("bridge"), root.find("ip")
    ip = dhcp = None
    if ip_el is not None and ip_el.get("address"):
        prefix = ip_el.get("prefix") or ipaddress.ip_network(f"0.0.0.0/{ip_el.get('netmask')}").prefixlen
        ip = str(ipaddress.ip_interface(f"{ip_el.get('address')}/{prefix}"))
        rng = ip_el.find("dhcp/range")
        if rng is not None:
            dhcp = [rng.get("start"), rng.get("end")]
    return {
        "name": root.findtext("name"),
        "bridge": br.get("name") if br is not None else None,
        "forward": fwd.get("mode", "nat") if fwd is not None else None,
        "ip": ip,
        "dhcp": dhcp,
    }


def network_diff(spec, current):
    """Fields that differ; ``bridge`` None in the spec means: whatever libvirt picked."""
    out = {}
    for key in ("forward", "ip", "dhcp", "bridge"):
        if key == "bridge" and spec[key] is None:
            continue
        if spec[key] != current.get(key):
            out[key] = {"old": current.get(key), "new": spec[key]}
    return out


def pool_spec(name, ptype="dir", target=None):
    validate.vm_name(name, "pool name")
    if ptype not in POOL_TYPES:
        raise SaltInvocationError(f"pool type must be one of {POOL_TYPES}, got {ptype!r}")
    validate.absolute_path(target, "pool target")
    return {"name": name, "type": ptype, "target": target.rstrip("/") or "/"}


def pool_xml(spec):
    root = ET.Element("pool", type=spec["type"])
    ET.SubElement(root, "name").text = spec["name"]
    ET.SubElement(ET.SubElement(root, "target"), "path").text = spec["target"]
    return ET.tostring(root, encoding="unicode")


def parse_pool(xml):
    root = ET.fromstring(xml)
    return {"name": root.findtext("name"), "type": root.get("type"), "target": root.findtext("target/path")}


# objects ------------------------------------------------------------------------------------------
def lookup(conn, kind, name):
    finder = conn.networkLookupByName if kind == "network" else conn.storagePoolLookupByName
    code = libvirt.VIR_ERR_NO_NETWORK if kind == "network" else libvirt.VIR_ERR_NO_STORAGE_POOL
    try:
        return finder(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == code:
            return None
        raise CommandExecutionError(f"looking up {kind} {name!r}: {exc.get_error_message()}") from None


def get(conn, kind, name):
    obj = lookup(conn, kind, name)
    if obj is None:
        raise CommandExecutionError(f"{kind} {name!r} is not defined on {conn.getHostname()}")
    return obj


def info(conn, kind, name=None):
    """{name: {..., active, autostart, persistent}} for one network/pool or all."""
    if name:
        objs = [get(conn, kind, name)]
    else:
        objs = conn.listAllNetworks(0) if kind == "network" else conn.listAllStoragePools(0)
    parse = parse_network if kind == "network" else parse_pool
    out = {}
    for obj in objs:
        facts = parse(obj.XMLDesc(0))
        facts.update(active=bool(obj.isActive()), autostart=bool(obj.autostart()), persistent=bool(obj.isPersistent()))
        if kind == "pool" and obj.isActive():
            cap, alloc, avail = obj.info()[1:4]
            facts.update(capacity=cap, allocation=alloc, available=avail)
        out[obj.name()] = facts
    return out


def define(conn, kind, spec, replace=False):
    xml = network_xml(spec) if kind == "network" else pool_xml(spec)
    existing = lookup(conn, kind, spec["name"])
    if existing is not None and not replace:
        raise SaltInvocationError(f"{kind} {spec['name']!r} is already defined")
    if existing is not None:  # a redefinition must keep the object's UUID
        root = ET.fromstring(xml)
        uuid = ET.Element("uuid")
        uuid.text = existing.UUIDString()
        root.insert(1, uuid)
        xml = ET.tostring(root, encoding="unicode")
    with lv_errors(f"define {kind} {spec['name']!r}"):
        obj = conn.networkDefineXML(xml) if kind == "network" else conn.storagePoolDefineXML(xml, 0)
    return obj


def start(conn, kind, name, build=False):
    obj = get(conn, kind, name)
    if obj.isActive():
        return False
    with lv_errors(f"start {kind} {name!r}"):
        if kind == "pool" and build:
            obj.build(0)
        obj.create(0) if kind == "pool" else obj.create()
    return True


def stop(conn, kind, name):
    obj = get(conn, kind, name)
    if not obj.isActive():
        return False
    with lv_errors(f"stop {kind} {name!r}"):
        obj.destroy()
    return True


def undefine(conn, kind, name):
    obj = get(conn, kind, name)
    with lv_errors(f"undefine {kind} {name!r}"):
        if obj.isActive():
            obj.destroy()
        obj.undefine()
    return True


def set_autostart(conn, kind, name, value):
    obj = get(conn, kind, name)
    if bool(obj.autostart()) == bool(value):
        return False
    with lv_errors(f"set autostart of {kind} {name!r}"):
        obj.setAutostart(1 if value else 0)
    return True


def list_volumes(conn, pool):
    obj = get(conn, "pool", pool)
    if not obj.isActive():
        raise CommandExecutionError(f"pool {pool!r} is not running")
    with lv_errors(f"list volumes of pool {pool!r}"):
        obj.refresh(0)
        return sorted(obj.listVolumes())
