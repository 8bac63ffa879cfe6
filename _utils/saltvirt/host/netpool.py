"""The lifecycle of libvirt virtual networks and storage pools: look up, define or redefine to a spec, start,
stop, undefine, autostart. Their specs and XML are :mod:`saltvirt.xml.netxml` and :mod:`saltvirt.xml.poolxml`;
Salt's pool and volume calls over this lifecycle, :mod:`saltvirt.storage.pools`."""

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

import saltvirt.host.conn  # its define: this module has one of its own
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import libvirt, lv_errors
from saltvirt.xml import netxml, poolxml


# objects ------------------------------------------------------------------------------------------
def lookup(conn: Conn, kind: str, name: str) -> Any:
    finder = conn.networkLookupByName if kind == "network" else conn.storagePoolLookupByName
    code = libvirt.VIR_ERR_NO_NETWORK if kind == "network" else libvirt.VIR_ERR_NO_STORAGE_POOL
    try:
        return finder(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == code:
            return None
        raise CommandExecutionError(f"looking up {kind} {name!r}: {exc.get_error_message()}") from None


def get(conn: Conn, kind: str, name: str) -> Any:
    obj = lookup(conn, kind, name)
    if obj is None:
        raise CommandExecutionError(f"{kind} {name!r} is not defined on {conn.getHostname()}")
    return obj


def read_xml(obj: Any, kind: str, inactive: bool = False) -> str:
    """The XML of network or pool ``obj`` (``kind``: ``network``/``pool``); ``inactive``: as defined (what a
    running object uses after a restart), where the driver can tell."""
    flag = getattr(libvirt, "VIR_NETWORK_XML_INACTIVE" if kind == "network" else "VIR_STORAGE_XML_INACTIVE", 1)
    with lv_errors(f"read the definition of {kind} {obj.name()!r}"):
        if inactive and obj.isPersistent():
            try:
                return obj.XMLDesc(flag)
            except libvirt.libvirtError as exc:  # drivers without the flag (test:///) have one definition
                if exc.get_error_code() not in (libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT):
                    raise
        return obj.XMLDesc(0)


def info(conn: Conn, kind: str, name: str | None = None, inactive: bool = False) -> dict[str, Data]:
    """{name: {..., active, autostart, persistent}} for one network/pool or all (``inactive``: as
    defined, which a running object only uses after a restart). A ``name`` that is not defined gives
    ``{}``, as Salt's ``network_info``/``pool_info`` (callers test ``.get(name)`` before creating it)."""
    if name:
        obj = lookup(conn, kind, name)
        objs = [obj] if obj is not None else []
    else:
        objs = conn.listAllNetworks(0) if kind == "network" else conn.listAllStoragePools(0)
    parse = netxml.parse_network if kind == "network" else poolxml.parse_pool
    out = {}
    for obj in objs:
        facts = parse(read_xml(obj, kind, inactive))
        facts.update(active=bool(obj.isActive()), autostart=bool(obj.autostart()), persistent=bool(obj.isPersistent()))
        if kind == "pool" and obj.isActive():
            cap, alloc, avail = obj.info()[1:4]
            facts.update(capacity=cap, allocation=alloc, available=avail)
        if kind == "network":  # Salt's keys besides ours
            facts.update(uuid=obj.UUIDString(), leases=_leases(obj))
        out[obj.name()] = facts
    return out


LEASE_TYPES = {0: "ipv4", 1: "ipv6"}  # VIR_IP_ADDR_TYPE_*


def _leases(net):
    """The network's DHCP leases as Salt's ``network_info`` gives them (libvirt's dicts, ``type``
    ipv4/ipv6); [] for a stopped network or a driver without leases."""
    if not net.isActive():
        return []
    try:
        leases = net.DHCPLeases()
    except libvirt.libvirtError:
        return []
    return [dict(lease, type=LEASE_TYPES.get(lease.get("type"), "unknown")) for lease in leases]


def define(conn: Conn, kind: str, spec: Data, replace: bool = False) -> Any:
    """Define a network/pool; ``replace``: redefine an existing one, keeping what the spec does not
    manage (uuid, MAC, bridge name libvirt picked, ...)."""
    existing = lookup(conn, kind, spec["name"])
    if existing is not None and not replace:
        raise SaltInvocationError(
            f"{kind} {spec['name']!r} is already defined: undefine it first, or use the virt.{kind}_defined state"
        )
    base = read_xml(existing, kind, inactive=True) if existing is not None else None
    xml = netxml.network_xml(spec, base) if kind == "network" else poolxml.pool_xml(spec, base)
    with lv_errors(f"define {kind} {spec['name']!r}"):
        return saltvirt.host.conn.define(conn, kind, xml)


def _live_host_steps(diff):
    """virNetworkUpdate steps when ``diff`` changes only static DHCP hosts (IPv4 ``hosts`` and/or the
    hosts of ``ipv6``), else None (the network must be redefined and restarted)."""
    steps = []
    for key, change in diff.items():
        old, new = change["old"], change["new"]
        if key == "hosts":
            steps += netxml.host_changes(old, new)
        elif key == "ipv6" and old and new and dict(old, hosts=None) == dict(new, hosts=None):
            steps += netxml.host_changes(old["hosts"], new["hosts"])
        else:
            return None
    return steps


def update_hosts(conn: Conn, name: str, steps: Iterable[tuple[str, Data]]) -> None:
    """Apply DHCP host ``steps`` (netxml.host_changes) to the running network and its definition
    (virNetworkUpdate, live + config): dnsmasq gets the new hosts without a restart of the network."""
    obj = get(conn, "network", name)
    commands = {
        "delete": libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
        "modify": libvirt.VIR_NETWORK_UPDATE_COMMAND_MODIFY,
        "add": libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
    }
    flags = libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG
    ips = ET.fromstring(read_xml(obj, "network")).findall("ip")
    for command, host in steps:
        xml = ET.tostring(netxml.host_element(host), encoding="unicode")
        family = "ipv6" if ":" in host["ip"] else "ipv4"
        # parentIndex: the <ip> element of the host's family (libvirt's -1 takes the first one, any family)
        parent = next(i for i, el in enumerate(ips) if el.get("family", "ipv4") == family and el.get("address"))
        with lv_errors(f"{command} DHCP host {host['ip']} of network {name!r}"):
            obj.update(commands[command], libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST, parent, xml, flags)


def ensure(
    conn: Conn,
    kind: str,
    spec: Data,
    autostart: bool | None = None,
    run: bool = False,
    test: bool = False,
    build: bool = True,
) -> Data:
    """The ``virt.network_*`` / ``virt.pool_*`` states: bring the object to ``spec`` (define or
    redefine), ``autostart`` (None: leave it) and, with ``run``, active (a pool built first unless not
    ``build``). Returns {'changes', 'comment'};
    with ``test`` the same changes, nothing done. A running network whose only change is its static
    DHCP hosts gets them live (change ``live``), without a restart."""
    name = spec["name"]
    obj = lookup(conn, kind, name)
    changes: Data = {}
    active = bool(obj is not None and obj.isActive())
    live_steps: Any = None
    if obj is None:
        changes["defined"] = spec
    else:
        current = info(conn, kind, name, inactive=True)[name]
        diff = netxml.network_diff(spec, current) if kind == "network" else poolxml.pool_diff(spec, current)
        live_steps = _live_host_steps(diff) if kind == "network" and active and current["persistent"] else None
        if diff and live_steps is not None:
            changes["live"] = diff
        elif diff or not current["persistent"]:
            changes["redefined"] = diff
    if autostart is not None and bool(obj is not None and obj.autostart()) != bool(autostart):
        changes["autostart"] = {"old": bool(obj is not None and obj.autostart()), "new": bool(autostart)}
    if run and not active:
        changes["started"] = True
    later = "redefined" in changes and active
    words = {
        "defined": "defined",
        "redefined": f"redefined ({', '.join(changes.get('redefined') or ['made persistent'])})",
        "live": f"updated live ({', '.join(changes.get('live') or [])}: DHCP hosts, no restart needed)",
        "autostart": f"autostart {'on' if autostart else 'off'}",
        "started": "started",
    }
    done = ", ".join(words[k] for k in ("defined", "redefined", "live", "autostart", "started") if k in changes)
    if test:
        comment = f"{kind} {name} would be {done}" if changes else f"{kind} {name} is as declared"
    else:
        if "defined" in changes or "redefined" in changes:
            define(conn, kind, spec, replace=True)
        if "live" in changes:
            update_hosts(conn, name, live_steps)
        if "autostart" in changes:
            set_autostart(conn, kind, name, autostart)
        if "started" in changes:
            start(conn, kind, name, build=build and kind == "pool")
        comment = f"{kind} {name} {done}" if changes else f"{kind} {name} is as declared"
    if later:
        comment += (
            f"; the running {kind} uses the new definition after a restart (virt.{kind}_stop + virt.{kind}_start)"
        )
    return {"changes": changes, "comment": comment}


def start(conn: Conn, kind: str, name: str, build: bool = False) -> bool:
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


def stop(conn: Conn, kind: str, name: str) -> bool:
    obj = get(conn, kind, name)
    if not obj.isActive():
        return False
    with lv_errors(f"stop {kind} {name!r}"):
        obj.destroy()
    return True


def undefine(conn: Conn, kind: str, name: str) -> bool:
    obj = get(conn, kind, name)
    with lv_errors(f"undefine {kind} {name!r}"):
        if obj.isActive():
            obj.destroy()
        obj.undefine()
    return True


def set_autostart(conn: Conn, kind: str, name: str, value: Any) -> bool:
    obj = get(conn, kind, name)
    if bool(obj.autostart()) == bool(value):
        return False
    with lv_errors(f"set autostart of {kind} {name!r}"):
        obj.setAutostart(1 if value else 0)
    return True


def list_volumes(conn: Conn, pool: str) -> list[str]:
    obj = get(conn, "pool", pool)
    if not obj.isActive():
        raise CommandExecutionError(f"pool {pool!r} is not running")
    with lv_errors(f"list volumes of pool {pool!r}"):
        obj.refresh(0)
        return sorted(obj.listVolumes())
