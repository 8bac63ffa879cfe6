"""Virtual network XML (ElementTree): the network spec (every argument of Salt's ``virt.network_define``,
checked key by key), the builder, the reader and desired-vs-current. Nothing here touches libvirt;
:mod:`saltvirt.host.netpool` defines, updates and starts networks.

A spec key left at None is not declared: an existing network keeps what it has there (``bridge``: the
name libvirt picked; ``mtu``, ``domain``, ``dns``, ``nat``, ``vport``, ``vlan``, DHCP ``hosts``, ...).
``forward``, ``ip`` and ``dhcp`` are always declared (None: no forwarding / no address / no range).
"""

import ipaddress
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.model import checks

MACVTAP_MODES = ("private", "vepa", "passthrough")
FORWARD_MODES = (None, "nat", "route", "bridge", "open", *MACVTAP_MODES, "hostdev")
IP_CONFIG_KEYS = ("cidr", "dhcp_ranges", "hosts", "bootp")
IP_CONFIG_REFUSED = {"tftp": "tftp (a TFTP root on the hypervisor) is not supported by salt-virt yet: leave it out"}
HOST_KEYS = ("ip", "mac", "name", "id")
DNS_KEYS = ("forwarders", "txt", "hosts", "srvs")
SRV_KEYS = ("name", "protocol", "domain", "target", "port", "priority", "weight")
VPORT_TYPES = ("openvswitch", "802.1Qbh", "802.1Qbg", "midonet")
VPORT_PARAMS = ("interfaceid", "profileid", "managerid", "typeid", "typeidversion", "instanceid")
# the keys whose None means "not declared" (left as the network has it), in libvirt's element order
OPTIONAL = ("mtu", "vport", "vlan", "domain", "dns", "nat", "interfaces", "pf", "addresses", "hosts", "bootp", "ipv6")

# libvirt's dnsName: no '_' (Salt's example TXT name _http.tcp.example.com fails libvirt's schema)
_DNS_NAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9][A-Za-z0-9-]{0,62})*\.?$")
_IFACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")
_PCI_RE = re.compile(r"^(?:([0-9a-fA-F]{1,4}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_DUID_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){1,127}$")
_PARAM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}$")
_TXT_RE = re.compile(r"^[ -!#-\[\]-~]{0,255}$")  # printable ASCII without '"' and '\'


# small checks -------------------------------------------------------------------------------------
def _dns_name(value, what):
    if not isinstance(value, str) or not _DNS_NAME_RE.match(value) or "\n" in value:
        raise SaltInvocationError(f"{what} must be a DNS name (letters, digits, '-', dots), got {value!r}")
    return value


def _host(value, what):
    if isinstance(value, str) and checks.HOSTNAME_RE.match(value) and "\n" not in value:
        return value
    raise SaltInvocationError(f"{what} must be a host name (letters, digits, '-', dots), got {value!r}")


def _addr(value, what, version=None):
    try:
        addr = ipaddress.ip_address(str(value).strip() if isinstance(value, str) else value)
    except ValueError:
        raise SaltInvocationError(f"{what} must be an IP address, got {value!r}") from None
    if version and addr.version != version:
        raise SaltInvocationError(f"{what} must be an IPv{version} address, got {value!r}")
    return addr


def _iface(value, what):
    if not isinstance(value, str) or not _IFACE_RE.match(value):
        raise SaltInvocationError(
            f"{what} must be a host interface name (up to 15 letters, digits, '_.:-'), got {value!r}"
        )
    return value


def _words(value, what):
    """Salt's whitespace separated string, or a list."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, (list, tuple)):
        return list(value)
    raise SaltInvocationError(f"{what} must be a whitespace separated string or a list, got {value!r}")


def _range(value, what, check):
    checks.check_keys(value, what, ("start", "end"))
    if "start" not in value or "end" not in value:
        raise SaltInvocationError(f"{what} needs both start and end")
    start, end = check(value["start"], f"{what}:start"), check(value["end"], f"{what}:end")
    if start > end:
        raise SaltInvocationError(f"{what} {start} - {end} is backwards")
    return [start, end]


def _bool_word(value, what):
    if isinstance(value, str) and value.lower() in ("yes", "no"):
        return value.lower() == "yes"
    if isinstance(value, (bool, int)) or (
        isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "on", "off")
    ):
        return validate.to_bool(value)
    raise SaltInvocationError(f"{what} must be true or false, got {value!r}")


# the spec ------------------------------------------------------------------------------------------
def _dhcp_range(net, dhcp_start, dhcp_end):
    if not (dhcp_start or dhcp_end):
        return None
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
    # both are inside net.network, so of one IP version: their integers compare as the addresses do
    if int(ipaddress.ip_address(dhcp_start)) > int(ipaddress.ip_address(dhcp_end)):
        raise SaltInvocationError(f"dhcp range {dhcp_start} - {dhcp_end} is backwards")
    return [str(dhcp_start), str(dhcp_end)]


def _ip(ip, netmask):
    if isinstance(ip, dict):  # Salt's 4th positional argument is ipv4_config
        raise SaltInvocationError("ip is a mapping: give Salt's form by name, ipv4_config={cidr: ...}")
    if netmask and not ip:
        raise SaltInvocationError("netmask needs ip=")
    if not ip:
        return None
    try:
        net = ipaddress.ip_interface(f"{ip}/{netmask}" if netmask else str(ip))
    except ValueError:
        raise SaltInvocationError(
            f"ip must be ADDRESS/PREFIX (e.g. 192.168.100.1/24) or ADDRESS with netmask=, got {ip!r} {netmask or ''}"
        ) from None
    if net.network.prefixlen == net.max_prefixlen:
        raise SaltInvocationError(f"ip {ip} needs a prefix or netmask (e.g. {net.ip}/24)")
    if net.version == 6:
        raise SaltInvocationError(f"ip {ip} is IPv6: give it as ipv6_config: {{cidr: {net.network}}}")
    return net


def _dhcp_host(entry, net, what):
    checks.check_keys(entry, what, HOST_KEYS)
    addr = _addr(entry.get("ip"), f"{what}:ip", net.version)
    if addr not in net.network:
        raise SaltInvocationError(f"{what}: {addr} is outside {net.network}")
    host = {"ip": str(addr)}
    if entry.get("mac") not in (None, ""):
        if net.version == 6:
            raise SaltInvocationError(f"{what}: an IPv6 host is matched by id (DUID) or name, not mac")
        mac = entry["mac"]
        if not isinstance(mac, str) or not checks.MAC_RE.match(mac):
            raise SaltInvocationError(f"{what}: mac must look like 52:54:00:12:34:56, got {mac!r}")
        host["mac"] = mac.lower()
    if entry.get("id") not in (None, ""):
        if net.version == 4 or not isinstance(entry["id"], str) or not _DUID_RE.match(entry["id"]):
            raise SaltInvocationError(f"{what}: id is an IPv6 host's DUID (hex pairs, ':'), got {entry['id']!r}")
        host["id"] = entry["id"].lower()
    if entry.get("name") not in (None, ""):
        host["name"] = _host(entry["name"], f"{what}:name")
    if len(host) == 1:
        needs = "a mac or a name" if net.version == 4 else "an id or a name"
        raise SaltInvocationError(f"{what}: host {addr} needs {needs}")
    return host


def _dhcp_hosts(value, net, what):
    """Salt's ``hosts``: {ip: {mac, name, id}} (its template) or [{ip, mac, name, id}] (its docs)."""
    if isinstance(value, dict):
        entries = []
        for ip, host in value.items():
            checks.check_keys(host if host is not None else {}, f"{what}:{ip}", HOST_KEYS[1:])
            entries.append(dict(host or {}, ip=ip))
    elif isinstance(value, list):
        entries = value
    else:
        raise SaltInvocationError(f"{what} must be a mapping {{ip: {{mac, name}}}} or a list of {{ip, mac, name}}")
    out, seen = [], set()
    for entry in entries:
        host = _dhcp_host(entry, net, what)
        for key in ("ip", "mac", "id", "name"):
            if key in host and (key, host[key]) in seen:
                raise SaltInvocationError(f"{what}: {key} {host[key]} is given twice")
            if key in host:
                seen.add((key, host[key]))
        out.append(host)
    return sorted(out, key=lambda h: ipaddress.ip_address(h["ip"]))


def _ip_config(config, version):
    """Salt's ``ipv4_config``/``ipv6_config`` -> (interface, range, hosts, bootp); libvirt's address is
    the first host of ``cidr``, as Salt's."""
    what = f"ipv{version}_config"
    checks.check_keys(config, what, IP_CONFIG_KEYS, IP_CONFIG_REFUSED)
    try:
        network = ipaddress.ip_network(str(config.get("cidr")), strict=False)
    except ValueError:
        network = None
    if network is None or network.version != version or network.prefixlen >= network.max_prefixlen - 1:
        example = "192.168.100.0/24" if version == 4 else "fd00:100::/64"
        raise SaltInvocationError(
            f"{what}:cidr must be an IPv{version} network like {example}, got {config.get('cidr')!r}"
        )
    net = ipaddress.ip_interface(f"{network[1]}/{network.prefixlen}")
    ranges = config.get("dhcp_ranges") or []
    if not isinstance(ranges, list) or len(ranges) > 1:
        raise SaltInvocationError(f"{what}:dhcp_ranges: salt-virt supports one range [{{start: ..., end: ...}}]")
    dhcp = None
    if ranges:
        checks.check_keys(ranges[0], f"{what}:dhcp_ranges", ("start", "end"))
        dhcp = _dhcp_range(net, ranges[0].get("start"), ranges[0].get("end"))
    hosts = None  # IPv4: None leaves the network's hosts, [] (hosts: {}) declares none
    if config.get("hosts") not in (None, "") and (config["hosts"] or version == 4):
        hosts = _dhcp_hosts(config["hosts"], net, f"{what}:hosts")
    bootp = None
    if config.get("bootp"):
        if version == 6:
            raise SaltInvocationError("ipv6_config:bootp: BOOTP is IPv4 only")
        checks.check_keys(config["bootp"], "ipv4_config:bootp", ("file", "server"))
        file = config["bootp"].get("file")
        if not isinstance(file, str) or not _FILE_RE.match(file) or ".." in file.split("/"):
            raise SaltInvocationError(f"ipv4_config:bootp:file must be a boot file name like pxelinux.0, got {file!r}")
        bootp = {"file": file}
        if config["bootp"].get("server"):
            bootp["server"] = validate.host_name(str(config["bootp"]["server"]), "ipv4_config:bootp:server")
    return net, dhcp, hosts, bootp


def _vport(value, bridge):
    if isinstance(value, str):
        value = {"type": value}
    checks.check_keys(value, "vport", ("type", "parameters"))
    if value.get("type") not in VPORT_TYPES:
        raise SaltInvocationError(f"vport:type must be one of {', '.join(VPORT_TYPES)}, got {value.get('type')!r}")
    out = {"type": value["type"]}
    params = value.get("parameters") or {}
    checks.check_keys(params, "vport:parameters", VPORT_PARAMS)
    for key, val in params.items():
        if not isinstance(val, (str, int)) or not _PARAM_RE.match(str(val)):
            raise SaltInvocationError(f"vport:parameters:{key} must be a plain identifier, got {val!r}")
    if "interfaceid" in params:
        try:
            params = dict(params, interfaceid=str(uuid.UUID(str(params["interfaceid"]))))
        except ValueError:
            raise SaltInvocationError(
                f"vport:parameters:interfaceid must be a UUID, got {params['interfaceid']!r}"
            ) from None
    if params:
        out["parameters"] = {k: str(v) for k, v in sorted(params.items())}
    if value["type"] == "openvswitch" and not bridge:
        raise SaltInvocationError("vport openvswitch needs bridge=<an existing openvswitch bridge> and forward=bridge")
    return out


def _vlan(value):
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = {"tags": [{"id": value}]}
    checks.check_keys(value, "tag", ("tags", "trunk"))
    tags = value.get("tags")
    if not isinstance(tags, list) or not tags:
        raise SaltInvocationError("tag:tags must be a list of {id, nativeMode}")
    out: dict[str, Any] = {"tags": []}
    for tag in tags:
        checks.check_keys(tag, "tag:tags", ("id", "nativeMode"))
        item = {"id": validate.int_in(tag.get("id"), "tag:tags:id (VLAN id)", 0, 4095)}
        if tag.get("nativeMode") is not None:
            if tag["nativeMode"] not in ("tagged", "untagged"):
                raise SaltInvocationError(f"tag:tags:nativeMode must be tagged or untagged, got {tag['nativeMode']!r}")
            item["nativeMode"] = tag["nativeMode"]
        out["tags"].append(item)
    if value.get("trunk") is not None:
        out["trunk"] = _bool_word(value["trunk"], "tag:trunk")
    if len(out["tags"]) > 1 and not out.get("trunk"):
        raise SaltInvocationError("tag: several VLAN ids need trunk: True")
    return out


def _domain(value):
    if isinstance(value, str):
        value = {"name": value}
    checks.check_keys(value, "domain", ("name", "localOnly"))
    out = {"name": _dns_name(value.get("name"), "domain:name")}
    if value.get("localOnly") is not None:
        out["localOnly"] = _bool_word(value["localOnly"], "domain:localOnly")
    return out


def _nat(value):
    checks.check_keys(value, "nat", ("address", "port"))
    out = {}
    if value.get("address"):
        out["address"] = [str(a) for a in _range(value["address"], "nat:address", lambda v, w: _addr(v, w, 4))]
    if value.get("port"):
        out["port"] = _range(value["port"], "nat:port", lambda v, w: validate.int_in(v, w, 1, 65535))
    return out


def _dns_forwarders(value):
    out = []
    for fwd in value or []:
        checks.check_keys(fwd, "dns:forwarders", ("domain", "addr"))
        item = {}
        if fwd.get("domain"):
            item["domain"] = _dns_name(fwd["domain"], "dns:forwarders:domain")
        if fwd.get("addr"):
            item["addr"] = str(_addr(fwd["addr"], "dns:forwarders:addr"))
        if not item:
            raise SaltInvocationError("dns:forwarders: each forwarder needs a domain, an addr or both")
        out.append(item)
    return out


def _dns_txt(txt):
    if not isinstance(txt, dict):
        raise SaltInvocationError("dns:txt must be a mapping {name: text}")
    for name, text in txt.items():
        _dns_name(name, "dns:txt name")
        if not isinstance(text, str) or not _TXT_RE.match(text):
            raise SaltInvocationError(
                f"dns:txt:{name} must be printable text (no quotes, backslashes, newlines), got {text!r}"
            )
    return dict(sorted(txt.items()))


def _dns_hosts(hosts):
    if not isinstance(hosts, dict):
        raise SaltInvocationError("dns:hosts must be a mapping {ip: [host names]}")
    out = {}
    for ip, value in hosts.items():
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names:
            raise SaltInvocationError(f"dns:hosts:{ip} must be a list of host names")
        out[str(_addr(ip, "dns:hosts ip"))] = [_host(n, f"dns:hosts:{ip}") for n in names]
    return dict(sorted(out.items()))


def _dns_srv(srv):
    checks.check_keys(srv, "dns:srvs", SRV_KEYS)
    if not isinstance(srv.get("name"), str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$", srv["name"]):
        raise SaltInvocationError(f"dns:srvs:name must be a service name like ldap, got {srv.get('name')!r}")
    if srv.get("protocol") not in ("tcp", "udp"):
        raise SaltInvocationError(f"dns:srvs:protocol must be tcp or udp, got {srv.get('protocol')!r}")
    item = {"name": srv["name"], "protocol": srv["protocol"]}
    if srv.get("domain"):
        item["domain"] = _dns_name(srv["domain"], "dns:srvs:domain")
    if srv.get("target"):
        item["target"] = srv["target"] if srv["target"] == "." else _dns_name(srv["target"], "dns:srvs:target")
    for key in ("port", "priority", "weight"):
        if srv.get(key) is not None:
            item[key] = validate.int_in(srv[key], f"dns:srvs:{key}", 1 if key == "port" else 0, 65535)
    return item


def _dns(value):
    checks.check_keys(value, "dns", DNS_KEYS)
    parts = {
        "forwarders": _dns_forwarders(value.get("forwarders")),
        "txt": _dns_txt(value.get("txt") or {}),
        "hosts": _dns_hosts(value.get("hosts") or {}),
        "srvs": [_dns_srv(srv) for srv in value.get("srvs") or []],
    }
    return {k: v for k, v in parts.items() if v}


def _pci(value):
    match = _PCI_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise SaltInvocationError(f"addresses: {value!r} is not a PCI address like 0000:04:00.1")
    dom, bus, slot, func = match.groups()
    return f"{int(dom or '0', 16):04x}:{int(bus, 16):02x}:{int(slot, 16):02x}.{func}"


def _forwarding(spec, forward, bridge, interfaces, physical_function, addresses, nat):
    """The forward element's parts; which modes take which."""
    if interfaces:
        if forward not in ("bridge", *MACVTAP_MODES):
            raise SaltInvocationError("interfaces are for forward=bridge/private/vepa/passthrough (macvtap) networks")
        spec["interfaces"] = [_iface(i, "interfaces") for i in _words(interfaces, "interfaces")]
    if physical_function:
        if forward not in ("bridge", *MACVTAP_MODES, "hostdev"):
            raise SaltInvocationError("physical_function is for forward=hostdev (or a macvtap mode) networks")
        spec["pf"] = _iface(physical_function, "physical_function")
    if addresses:
        if forward != "hostdev":
            raise SaltInvocationError("addresses (PCI functions) are for forward=hostdev networks")
        spec["addresses"] = [_pci(a) for a in _words(addresses, "addresses")]
    if nat:
        if forward != "nat":
            raise SaltInvocationError("nat (address and port ranges) needs forward=nat")
        spec["nat"] = _nat(nat) or None
    if forward == "bridge" and not (bridge or interfaces or physical_function):
        raise SaltInvocationError("forward=bridge needs bridge=<existing host bridge> or interfaces= (macvtap)")
    if forward in MACVTAP_MODES and not (interfaces or physical_function):
        raise SaltInvocationError(f"forward={forward} (macvtap) needs interfaces= or physical_function=")
    if forward == "hostdev" and not (physical_function or addresses):
        raise SaltInvocationError("forward=hostdev needs physical_function= (SR-IOV PF) or addresses= (PCI VFs)")
    if bridge and forward in (*MACVTAP_MODES, "hostdev"):
        raise SaltInvocationError(f"a forward={forward} network has no bridge: leave bridge out")


def network_spec(
    name: str,
    bridge: Any = None,
    forward: Any = "nat",
    ip: Any = None,
    dhcp_start: Any = None,
    dhcp_end: Any = None,
    netmask: Any = None,
    *,
    ipv4_config: Any = None,
    ipv6_config: Any = None,
    vport: Any = None,
    tag: Any = None,
    mtu: Any = None,
    domain: Any = None,
    nat: Any = None,
    interfaces: Any = None,
    addresses: Any = None,
    physical_function: Any = None,
    dns: Any = None,
) -> Data:
    """Normalised desired network: {name, bridge, forward, ip (IPv4 CIDR), dhcp: [start, end], and the
    OPTIONAL keys (None: not declared)}. ``ip`` as ADDRESS/PREFIX or ADDRESS with ``netmask``, or Salt's
    ``ipv4_config``; see _modules/virt_network.py for every argument."""
    validate.vm_name(name, "network name")
    if forward in ("isolated", "none", "None", ""):
        forward = None
    if forward not in FORWARD_MODES:
        raise SaltInvocationError(
            "forward must be one of nat, route, open, bridge, private, vepa, passthrough, hostdev or none, "
            f"got {forward!r}"
        )
    if bridge:
        validate.vm_name(bridge, "bridge name")
    spec = {"name": name, "bridge": bridge or None, "forward": forward, "ip": None, "dhcp": None}
    spec.update(dict.fromkeys(OPTIONAL))
    if ipv4_config:
        if ip or dhcp_start or dhcp_end or netmask:
            raise SaltInvocationError("network: give ipv4_config (Salt's form) or ip/dhcp_start/dhcp_end, not both")
        net, spec["dhcp"], spec["hosts"], spec["bootp"] = _ip_config(ipv4_config, 4)
    else:
        net = _ip(ip, netmask)
        spec["dhcp"] = _dhcp_range(net, dhcp_start, dhcp_end)
    spec["ip"] = str(net) if net else None
    if ipv6_config:
        net6, dhcp6, hosts6, _ = _ip_config(ipv6_config, 6)
        spec["ipv6"] = {"ip": str(net6), "dhcp": dhcp6, "hosts": hosts6}
    if (net or ipv6_config) and forward in ("bridge", *MACVTAP_MODES, "hostdev"):
        raise SaltInvocationError(f"a forward={forward} network has no ip: the host's own network is used")
    _forwarding(spec, forward, bridge, interfaces, physical_function, addresses, nat)
    if vport:
        spec["vport"] = _vport(vport, bridge)
    if tag not in (None, "", {}):
        spec["vlan"] = _vlan(tag)
    if mtu not in (None, ""):
        spec["mtu"] = validate.int_in(mtu, "mtu", 68, 65535)
    if domain:
        spec["domain"] = _domain(domain)
    if dns:
        spec["dns"] = _dns(dns) or None
    return spec


# XML -----------------------------------------------------------------------------------------------
def _yesno(value):
    return "yes" if value else "no"


def _sub(parent, tag, **attrs):
    return ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items() if v is not None})


def _dhcp_element(parent, dhcp, hosts, bootp):
    if not (dhcp or hosts or bootp):
        return
    el = _sub(parent, "dhcp")
    if dhcp:
        _sub(el, "range", start=dhcp[0], end=dhcp[1])
    for host in hosts or []:
        el.append(host_element(host))
    if bootp:
        _sub(el, "bootp", file=bootp["file"], server=bootp.get("server"))


def host_element(host: Mapping[str, Any]) -> ET.Element:
    """<host> of a static DHCP host (also the XML virNetworkUpdate takes)."""
    return ET.Element("host", {k: host[k] for k in ("mac", "id", "name", "ip") if k in host})


def _ip_element(cidr, dhcp, hosts, bootp):
    net = ipaddress.ip_interface(cidr)
    attrs = {"address": str(net.ip), "prefix": str(net.network.prefixlen)}
    if net.version == 6:
        attrs = {"family": "ipv6", **attrs}
    el = ET.Element("ip", attrs)
    _dhcp_element(el, dhcp, hosts, bootp)
    return el


def _forward_element(spec, old):
    fwd = ET.Element("forward", mode=spec["forward"])
    if spec["forward"] == "hostdev":
        fwd.set("managed", "yes")
    keep = old if old is not None and old.get("mode", "nat") == spec["forward"] else None
    nat = spec["nat"] if spec["nat"] is not None else None
    if nat is None and keep is not None and keep.find("nat") is not None:
        fwd.append(keep.find("nat"))
    elif nat:
        nat_el = _sub(fwd, "nat")
        if "address" in nat:
            _sub(nat_el, "address", start=nat["address"][0], end=nat["address"][1])
        if "port" in nat:
            _sub(nat_el, "port", start=nat["port"][0], end=nat["port"][1])
    pf = (
        spec["pf"]
        if spec["pf"] is not None
        else (keep.find("pf").get("dev") if keep is not None and keep.find("pf") is not None else None)
    )
    if pf:
        _sub(fwd, "pf", dev=pf)
    ifaces = spec["interfaces"]
    if ifaces is None and keep is not None:
        ifaces = [i.get("dev") for i in keep.findall("interface")]
    for dev in ifaces or []:
        _sub(fwd, "interface", dev=dev)
    addrs = spec["addresses"]
    if addrs is None and keep is not None:
        addrs = _parse_addresses(keep)
    for addr in addrs or []:
        dom, bus, rest = addr.split(":")
        slot, func = rest.split(".")
        _sub(fwd, "address", type="pci", domain=f"0x{dom}", bus=f"0x{bus}", slot=f"0x{slot}", function=f"0x{func}")
    return fwd


def _replace(root, tag, new, after=("name", "uuid")):
    """Put ``new`` (or nothing) where the ``tag`` element is, else after the last of ``after`` present."""
    old = root.find(tag)
    children = list(root)
    if old is not None:
        pos = children.index(old)
        root.remove(old)
    else:
        present = [children.index(el) + 1 for el in (root.find(t) for t in after) if el is not None]
        pos = max(present) if present else len(children)
    if new is not None:
        root.insert(pos, new)


def network_xml(spec: Data, base: str | None = None) -> str:
    """Network XML for ``spec``. With ``base`` (the current definition) only what the spec declares
    changes: uuid, MAC, the bridge name libvirt picked and every undeclared part stay."""
    if base is None:
        root = ET.Element("network")
        _sub(root, "name").text = spec["name"]
    else:
        root = ET.fromstring(base)
    order = ("name", "uuid", "forward", "bridge", "mtu", "mac", "virtualport", "vlan", "domain", "dns")
    after = lambda tag: order[: order.index(tag)]  # noqa: E731 - the elements before ``tag`` in libvirt's order
    old_fwd = root.find("forward")
    _replace(root, "forward", _forward_element(spec, old_fwd) if spec["forward"] else None, after("forward"))
    if spec["bridge"]:
        br = root.find("bridge")
        if br is None:
            br = ET.Element("bridge")
            _replace(root, "bridge", br, after("bridge"))
        br.set("name", spec["bridge"])
    if spec["mtu"] is not None:
        _replace(root, "mtu", ET.Element("mtu", size=str(spec["mtu"])), after("mtu"))
    if spec["vport"] is not None:
        vp = ET.Element("virtualport", type=spec["vport"]["type"])
        if spec["vport"].get("parameters"):
            _sub(vp, "parameters", **spec["vport"]["parameters"])
        _replace(root, "virtualport", vp, after("virtualport"))
    if spec["vlan"] is not None:
        vlan = ET.Element("vlan")
        if "trunk" in spec["vlan"]:
            vlan.set("trunk", _yesno(spec["vlan"]["trunk"]))
        for tag in spec["vlan"]["tags"]:
            _sub(vlan, "tag", id=tag["id"], nativeMode=tag.get("nativeMode"))
        _replace(root, "vlan", vlan, after("vlan"))
    if spec["domain"] is not None:
        dom = ET.Element("domain", name=spec["domain"]["name"])
        if "localOnly" in spec["domain"]:
            dom.set("localOnly", _yesno(spec["domain"]["localOnly"]))
        _replace(root, "domain", dom, after("domain"))
    if spec["dns"] is not None:
        _replace(root, "dns", _dns_element(spec["dns"]), after("dns"))
    _set_ips(root, spec)
    return ET.tostring(root, encoding="unicode")


def _dns_element(dns):
    el = ET.Element("dns")
    for fwd in dns.get("forwarders", []):
        _sub(el, "forwarder", domain=fwd.get("domain"), addr=fwd.get("addr"))
    for name, value in dns.get("txt", {}).items():
        _sub(el, "txt", name=name, value=value)
    for ip, names in dns.get("hosts", {}).items():
        host = _sub(el, "host", ip=ip)
        for name in names:
            _sub(host, "hostname").text = name
    for srv in dns.get("srvs", []):
        attrs = {"service": srv["name"], "protocol": srv["protocol"]}
        attrs.update((k, srv[k]) for k in ("domain", "target", "port", "priority", "weight") if k in srv)
        _sub(el, "srv", **attrs)
    return el


def _set_ips(root, spec):
    """The IPv4 element follows ``ip``/``dhcp`` (and ``hosts``/``bootp`` when declared); the IPv6 one
    ``ipv6`` when declared. An element whose facts differ is rebuilt in place."""
    for family in (4, 6):
        cur = _first_ip(root, family)
        facts = _ip_facts(cur) if cur is not None else None
        if family == 4:
            want = {"ip": spec["ip"], "dhcp": spec["dhcp"]}
            kept = facts if facts is not None and facts["ip"] == spec["ip"] else {}  # only on the same address
            if spec["ip"]:
                want["hosts"] = spec["hosts"] if spec["hosts"] is not None else kept.get("hosts")
                want["bootp"] = spec["bootp"] if spec["bootp"] is not None else kept.get("bootp")
        elif spec["ipv6"] is None:
            continue
        else:
            want = dict(spec["ipv6"], bootp=None)
        if facts is not None and all((facts.get(k) or None) == (want.get(k) or None) for k in facts):
            continue
        new = _ip_element(want["ip"], want["dhcp"], want.get("hosts"), want.get("bootp")) if want["ip"] else None
        if cur is not None:
            pos = list(root).index(cur)
            root.remove(cur)
            if new is not None:
                root.insert(pos, new)
        elif new is not None:
            root.append(new)


def _first_ip(root, family=4):
    for el in root.findall("ip"):
        fam = 6 if el.get("family") == "ipv6" or ":" in (el.get("address") or "") else 4
        if el.get("address") and fam == family:
            return el
    return None


def _ip_facts(ip_el):
    prefix = ip_el.get("prefix")
    if not prefix:
        prefix = ipaddress.ip_network(f"0.0.0.0/{ip_el.get('netmask')}").prefixlen if ip_el.get("netmask") else 24
    net = ipaddress.ip_interface(f"{ip_el.get('address')}/{prefix}")
    rng = ip_el.find("dhcp/range")
    hosts = [
        {k: (h.get(k).lower() if k in ("mac", "id") else h.get(k)) for k in ("ip", "mac", "id", "name") if h.get(k)}
        for h in ip_el.findall("dhcp/host")
    ]
    bootp = ip_el.find("dhcp/bootp")
    return {
        "ip": str(net),
        "dhcp": [rng.get("start"), rng.get("end")] if rng is not None else None,
        "hosts": sorted(hosts, key=lambda h: ipaddress.ip_address(h["ip"])) or None,
        "bootp": {k: bootp.get(k) for k in ("file", "server") if bootp.get(k)} if bootp is not None else None,
    }


def _parse_addresses(fwd):
    out = []
    for a in fwd.findall("address"):
        if a.get("type", "pci") == "pci":
            vals = [int(a.get(k, "0"), 16) for k in ("domain", "bus", "slot", "function")]
            out.append(f"{vals[0]:04x}:{vals[1]:02x}:{vals[2]:02x}.{vals[3]}")
    return out


def _parse_dns(el):
    out: dict[str, Any] = {}
    fwds = [{k: f.get(k) for k in ("domain", "addr") if f.get(k)} for f in el.findall("forwarder")]
    if fwds:
        out["forwarders"] = fwds
    txt = {t.get("name"): t.get("value") for t in el.findall("txt")}
    if txt:
        out["txt"] = dict(sorted(txt.items()))
    hosts = {h.get("ip"): [n.text for n in h.findall("hostname")] for h in el.findall("host")}
    if hosts:
        out["hosts"] = dict(sorted(hosts.items()))
    srvs = []
    for s in el.findall("srv"):
        item = {"name": s.get("service"), "protocol": s.get("protocol")}
        item.update((k, s.get(k)) for k in ("domain", "target") if s.get(k))
        item.update((k, int(s.get(k))) for k in ("port", "priority", "weight") if s.get(k))
        srvs.append(item)
    if srvs:
        out["srvs"] = srvs
    return out or None


def _parse_forward(fwd):
    if fwd is None:
        return {"forward": None, "nat": None, "interfaces": None, "pf": None, "addresses": None}
    nat = fwd.find("nat")
    nat_facts = None
    if nat is not None:
        nat_facts = {}
        if nat.find("address") is not None:
            nat_facts["address"] = [nat.find("address").get("start"), nat.find("address").get("end")]
        if nat.find("port") is not None:
            nat_facts["port"] = [int(nat.find("port").get("start")), int(nat.find("port").get("end"))]
    return {
        "forward": fwd.get("mode", "nat"),
        "nat": nat_facts or None,
        "interfaces": [i.get("dev") for i in fwd.findall("interface")] or None,
        "pf": fwd.find("pf").get("dev") if fwd.find("pf") is not None else None,
        "addresses": _parse_addresses(fwd) or None,
    }


def parse_network(xml: str) -> Data:
    """The facts of a network's XML, in the spec's shape (absent parts None)."""
    root = ET.fromstring(xml)
    br, ip4, ip6 = root.find("bridge"), _first_ip(root, 4), _first_ip(root, 6)
    facts = _ip_facts(ip4) if ip4 is not None else {"ip": None, "dhcp": None, "hosts": None, "bootp": None}
    out: Data = {"name": root.findtext("name"), "bridge": br.get("name") if br is not None else None}
    out.update(_parse_forward(root.find("forward")))
    out.update(facts)
    out["ipv6"] = None
    if ip6 is not None:
        f6 = _ip_facts(ip6)
        out["ipv6"] = {"ip": f6["ip"], "dhcp": f6["dhcp"], "hosts": f6["hosts"]}
    mtu, vp, vlan, dom, dns = (root.find(t) for t in ("mtu", "virtualport", "vlan", "domain", "dns"))
    out["mtu"] = validate.int_or_none(mtu.get("size")) if mtu is not None else None
    out["vport"] = None
    if vp is not None:
        out["vport"] = {"type": vp.get("type")}
        params = vp.find("parameters")
        if params is not None and params.attrib:
            out["vport"]["parameters"] = dict(sorted(params.attrib.items()))
    out["vlan"] = None
    if vlan is not None:
        out["vlan"] = {
            "tags": [
                {
                    "id": validate.int_or_none(t.get("id")),
                    **({"nativeMode": t.get("nativeMode")} if t.get("nativeMode") else {}),
                }
                for t in vlan.findall("tag")
            ]
        }
        if vlan.get("trunk"):
            out["vlan"]["trunk"] = vlan.get("trunk") == "yes"
    out["domain"] = None
    if dom is not None:
        out["domain"] = {"name": dom.get("name")}
        if dom.get("localOnly"):
            out["domain"]["localOnly"] = dom.get("localOnly") == "yes"
    out["dns"] = _parse_dns(dns) if dns is not None else None
    return out


def network_diff(spec: Data, current: Data) -> Data:
    """Fields that differ; an undeclared (None) ``bridge`` or OPTIONAL key is whatever the network has."""
    out = {}
    for key in ("forward", "ip", "dhcp", "bridge", *OPTIONAL):
        if spec[key] is None and (key == "bridge" or key in OPTIONAL):
            continue
        want = spec[key] or None if key == "hosts" else spec[key]  # [] declares: no hosts
        if want != current.get(key):
            out[key] = {"old": current.get(key), "new": want}
    return out


def host_changes(old: Iterable[Data], new: Iterable[Data]) -> list[tuple[str, Data]]:
    """virNetworkUpdate steps from DHCP hosts ``old`` to ``new``: [(command, host)] with command
    'delete', 'modify' or 'add' (a host is the same when its mac, id or name is)."""
    old, new = old or [], new or []

    def ident(h):
        return h.get("mac") or h.get("id") or h.get("name")

    old_by, new_by = {ident(h): h for h in old}, {ident(h): h for h in new}
    steps = [("delete", h) for k, h in old_by.items() if k not in new_by]
    steps += [("modify", h) for k, h in new_by.items() if k in old_by and old_by[k] != h]
    steps += [("add", h) for k, h in new_by.items() if k not in old_by]
    return steps
