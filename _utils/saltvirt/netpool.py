"""libvirt virtual networks and storage pools: XML (ElementTree), desired-vs-current, lifecycle."""

import ipaddress
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt import poolxml, validate
from saltvirt.conn import libvirt, lv_errors

FORWARD_MODES = (None, "nat", "route", "bridge", "open", "isolated")
POOL_TYPES = tuple(poolxml.POOL_TYPES)


def network_spec(  # noqa: C901, PLR0912 - one check per argument, in the order the user reads them
    name, bridge=None, forward="nat", ip=None, dhcp_start=None, dhcp_end=None, netmask=None
):
    """Normalised desired network: {name, bridge, forward, ip (CIDR), dhcp: [start, end]}.

    ``ip``: ADDRESS/PREFIX, or ADDRESS with ``netmask``. ``forward``: nat, route, open, bridge (onto an
    existing host ``bridge``, no ip) or None/none/isolated (no forwarding)."""
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
    if netmask and not ip:
        raise SaltInvocationError("netmask needs ip=")
    if ip:
        try:
            net = ipaddress.ip_interface(f"{ip}/{netmask}" if netmask else str(ip))
        except ValueError:
            raise SaltInvocationError(
                "ip must be ADDRESS/PREFIX (e.g. 192.168.100.1/24) or ADDRESS with netmask=, "
                f"got {ip!r} {netmask or ''}"
            ) from None
        if net.network.prefixlen == net.max_prefixlen:
            raise SaltInvocationError(f"ip {ip} needs a prefix or netmask (e.g. {net.ip}/24)")
        if forward == "bridge":
            raise SaltInvocationError("a forward=bridge network has no ip: the host bridge's own network is used")
    dhcp = None
    if dhcp_start or dhcp_end:
        if not net:
            raise SaltInvocationError("dhcp range needs ip=")
        if not (dhcp_start and dhcp_end):
            raise SaltInvocationError("a dhcp range needs both dhcp_start and dhcp_end")
        for addr in (dhcp_start, dhcp_end):
            try:
                inside = ipaddress.ip_address(addr) in net.network
            except ValueError:
                raise SaltInvocationError(f"dhcp address {addr!r} is not an IP address") from None
            if not inside:
                raise SaltInvocationError(f"dhcp address {addr} is outside {net.network}")
        if ipaddress.ip_address(dhcp_start) > ipaddress.ip_address(dhcp_end):
            raise SaltInvocationError(f"dhcp range {dhcp_start} - {dhcp_end} is backwards")
        dhcp = [str(dhcp_start), str(dhcp_end)]
    return {"name": name, "bridge": bridge, "forward": forward, "ip": str(net) if net else None, "dhcp": dhcp}


def _ip_element(spec):
    net = ipaddress.ip_interface(spec["ip"])
    attrs = {"address": str(net.ip), "prefix": str(net.network.prefixlen)}
    if net.version == 6:
        attrs["family"] = "ipv6"
    ip_el = ET.Element("ip", attrs)
    if spec["dhcp"]:
        ET.SubElement(ET.SubElement(ip_el, "dhcp"), "range", start=spec["dhcp"][0], end=spec["dhcp"][1])
    return ip_el


def network_xml(spec, base=None):
    """Network XML for ``spec``. With ``base`` (the current definition) only the managed parts change:
    uuid, MAC, the bridge name libvirt picked, DNS and everything else stay."""
    if base is None:
        root = ET.Element("network")
        ET.SubElement(root, "name").text = spec["name"]
    else:
        root = ET.fromstring(base)
    fwd = root.find("forward")
    if fwd is not None and (not spec["forward"] or fwd.get("mode", "nat") != spec["forward"]):
        root.remove(fwd)
        fwd = None
    if spec["forward"] and fwd is None:
        root.insert(2 if root.find("uuid") is not None else 1, ET.Element("forward", mode=spec["forward"]))
    br = root.find("bridge")
    if spec["bridge"]:
        if br is None:
            br = ET.SubElement(root, "bridge")
        br.set("name", spec["bridge"])
    if _first_ip(root) is not None and _ip_facts(_first_ip(root)) != (spec["ip"], spec["dhcp"]):
        root.remove(_first_ip(root))
    if spec["ip"] and _first_ip(root) is None:
        root.append(_ip_element(spec))
    return ET.tostring(root, encoding="unicode")


def _first_ip(root):
    return next((el for el in root.findall("ip") if el.get("address")), None)


def _ip_facts(ip_el):
    prefix = ip_el.get("prefix")
    if not prefix:
        prefix = ipaddress.ip_network(f"0.0.0.0/{ip_el.get('netmask')}").prefixlen if ip_el.get("netmask") else 24
    ip = str(ipaddress.ip_interface(f"{ip_el.get('address')}/{prefix}"))
    rng = ip_el.find("dhcp/range")
    return ip, ([rng.get("start"), rng.get("end")] if rng is not None else None)


def parse_network(xml):
    root = ET.fromstring(xml)
    fwd, br, ip_el = root.find("forward"), root.find("bridge"), _first_ip(root)
    ip, dhcp = _ip_facts(ip_el) if ip_el is not None else (None, None)
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


# storage pools: their XML lives in saltvirt.poolxml (all pool types); define/start/stop/autostart here
pool_spec = poolxml.pool_spec
pool_xml = poolxml.pool_xml
parse_pool = poolxml.parse_pool
pool_diff = poolxml.pool_diff


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


def _xml(obj, kind, inactive=False):
    flag = getattr(libvirt, "VIR_NETWORK_XML_INACTIVE" if kind == "network" else "VIR_STORAGE_XML_INACTIVE", 1)
    with lv_errors(f"read the definition of {kind} {obj.name()!r}"):
        if inactive and obj.isPersistent():
            try:
                return obj.XMLDesc(flag)
            except libvirt.libvirtError as exc:  # drivers without the flag (test:///) have one definition
                if exc.get_error_code() not in (libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT):
                    raise
        return obj.XMLDesc(0)


def info(conn, kind, name=None, inactive=False):
    """{name: {..., active, autostart, persistent}} for one network/pool or all (``inactive``: as
    defined, which a running object only uses after a restart)."""
    if name:
        objs = [get(conn, kind, name)]
    else:
        objs = conn.listAllNetworks(0) if kind == "network" else conn.listAllStoragePools(0)
    parse = parse_network if kind == "network" else parse_pool
    out = {}
    for obj in objs:
        facts = parse(_xml(obj, kind, inactive))
        facts.update(active=bool(obj.isActive()), autostart=bool(obj.autostart()), persistent=bool(obj.isPersistent()))
        if kind == "pool" and obj.isActive():
            cap, alloc, avail = obj.info()[1:4]
            facts.update(capacity=cap, allocation=alloc, available=avail)
        out[obj.name()] = facts
    return out


def define(conn, kind, spec, replace=False):
    """Define a network/pool; ``replace``: redefine an existing one, keeping what the spec does not
    manage (uuid, MAC, bridge name libvirt picked, ...)."""
    existing = lookup(conn, kind, spec["name"])
    if existing is not None and not replace:
        raise SaltInvocationError(
            f"{kind} {spec['name']!r} is already defined: undefine it first, or use the virt.{kind}_defined state"
        )
    base = _xml(existing, kind, inactive=True) if existing is not None else None
    xml = network_xml(spec, base) if kind == "network" else pool_xml(spec, base)
    with lv_errors(f"define {kind} {spec['name']!r}"):
        return conn.networkDefineXML(xml) if kind == "network" else conn.storagePoolDefineXML(xml, 0)


def ensure(conn, kind, spec, autostart=None, run=False, test=False):
    """The ``virt.network_*`` / ``virt.pool_*`` states: bring the object to ``spec`` (define or
    redefine), ``autostart`` (None: leave it) and, with ``run``, active. Returns {'changes', 'comment'};
    with ``test`` the same changes, nothing done."""
    name = spec["name"]
    obj = lookup(conn, kind, name)
    changes = {}
    if obj is None:
        changes["defined"] = spec
    else:
        current = info(conn, kind, name, inactive=True)[name]
        diff = network_diff(spec, current) if kind == "network" else pool_diff(spec, current)
        if diff or not current["persistent"]:
            changes["redefined"] = diff
    active = bool(obj is not None and obj.isActive())
    if autostart is not None and bool(obj is not None and obj.autostart()) != bool(autostart):
        changes["autostart"] = {"old": bool(obj is not None and obj.autostart()), "new": bool(autostart)}
    if run and not active:
        changes["started"] = True
    later = "redefined" in changes and active
    words = {
        "defined": "defined",
        "redefined": f"redefined ({', '.join(changes.get('redefined') or ['made persistent'])})",
        "autostart": f"autostart {'on' if autostart else 'off'}",
        "started": "started",
    }
    done = ", ".join(words[k] for k in ("defined", "redefined", "autostart", "started") if k in changes)
    if test:
        comment = f"{kind} {name} would be {done}" if changes else f"{kind} {name} is as declared"
    else:
        if "defined" in changes or "redefined" in changes:
            define(conn, kind, spec, replace=True)
        if "autostart" in changes:
            set_autostart(conn, kind, name, autostart)
        if "started" in changes:
            start(conn, kind, name, build=kind == "pool")
        comment = f"{kind} {name} {done}" if changes else f"{kind} {name} is as declared"
    if later:
        comment += (
            f"; the running {kind} uses the new definition after a restart (virt.{kind}_stop + virt.{kind}_start)"
        )
    return {"changes": changes, "comment": comment}


def start(conn, kind, name, build=False):
    obj = get(conn, kind, name)
    if obj.isActive():
        return False
    if kind == "network":
        with lv_errors(f"start network {name!r}"):
            obj.create()
        return True
    # build: dir/fs/netfs make the target directory; logical/disk a volume group or partition table, only on
    # empty devices (libvirt refuses to overwrite without a flag we never pass). A build that finds its work
    # done (an existing volume group, a labelled disk) is not an error as long as the pool then starts.
    build_err = None
    if build and ET.fromstring(obj.XMLDesc(0)).get("type") in poolxml.BUILDABLE:
        try:
            obj.build(0)
        except libvirt.libvirtError as exc:
            build_err = exc.get_error_message()
    try:
        obj.create(0)
    except libvirt.libvirtError as exc:
        extra = f" (building it first failed too: {build_err})" if build_err else ""
        raise CommandExecutionError(f"start pool {name!r}: {exc.get_error_message()}{extra}") from None
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
