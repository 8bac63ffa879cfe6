"""
Execution module ``virt`` (continued): virtual networks (``saltvirt.netpool``).
"""

import ipaddress
import os
import sys

from salt.exceptions import SaltInvocationError


try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{modules,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt import conn as _c
    from saltvirt import netpool as _np
    from saltvirt import speckeys
    from saltvirt.validate import to_bool as _bool

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, "virt: the saltvirt library is missing (run saltutil.sync_all, or pip install salt-virt)"
    if _c.libvirt is None:
        return False, "virt: the libvirt python bindings are not installed (pip install libvirt-python)"
    return __virtualname__


def _conn(connection=None):
    return _c.salt_connect(__salt__, connection)


def _ipv4_config(ipv4_config, ip, dhcp_start, dhcp_end):
    """Salt's ``ipv4_config: {cidr, dhcp_ranges: [{start, end}]}`` -> ``ip``/``dhcp_start``/``dhcp_end``
    (libvirt's address is the first host of ``cidr``, as Salt's)."""
    if not ipv4_config:
        return ip, dhcp_start, dhcp_end
    if ip or dhcp_start or dhcp_end:
        raise SaltInvocationError("network: give ipv4_config (Salt's form) or ip/dhcp_start/dhcp_end, not both")
    speckeys.check_keys(
        ipv4_config,
        "ipv4_config",
        ("cidr", "dhcp_ranges"),
        {"hosts": "ipv4_config:hosts (static DHCP hosts) is not supported by salt-virt yet"},
    )
    try:
        net = ipaddress.ip_network(str(ipv4_config.get("cidr")), strict=False)
    except ValueError:
        raise SaltInvocationError(
            f"ipv4_config:cidr must be a network like 192.168.100.0/24, got {ipv4_config.get('cidr')!r}"
        ) from None
    ranges = ipv4_config.get("dhcp_ranges") or []
    if not isinstance(ranges, list) or len(ranges) > 1:
        raise SaltInvocationError("ipv4_config:dhcp_ranges: salt-virt supports one range [{start: ..., end: ...}]")
    start = end = None
    if ranges:
        speckeys.check_keys(ranges[0], "ipv4_config:dhcp_ranges", ("start", "end"))
        start, end = ranges[0].get("start"), ranges[0].get("end")
    return f"{net[1]}/{net.prefixlen}", start, end


_NOT_YET = {
    "ipv6_config": "IPv6",
    "vport": "openvswitch virtual ports",
    "tag": "VLAN tags",
    "mtu": "the MTU",
    "domain": "the DNS domain",
    "nat": "NAT port ranges",
    "interfaces": "macvtap/hostdev interfaces",
    "addresses": "hostdev addresses",
    "physical_function": "SR-IOV physical functions",
    "dns": "DNS settings",
}


def _refuse_not_yet(kwargs, fun):
    for key, what in _NOT_YET.items():
        if kwargs.pop(key, None) not in (None, "", [], {}):
            raise SaltInvocationError(f"{fun}: {key} ({what}) is not supported by salt-virt yet: leave it out")
    kwargs.pop("username", None), kwargs.pop("password", None)
    unknown = sorted(k for k in kwargs if not k.startswith("__"))
    if unknown:
        raise SaltInvocationError(f"{fun}: unknown argument(s) {', '.join(unknown)}")


def network_define(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    autostart=True,
    start=True,
    connection=None,
    ipv4_config=None,
    **kwargs,
):
    """
    Define a virtual network (``forward``: nat, route, open, bridge (onto an existing ``bridge``) or
    none; ``ip`` as ADDRESS/PREFIX or ADDRESS with ``netmask``, with an optional DHCP range; or Salt's
    ``ipv4_config: {cidr, dhcp_ranges: [{start, end}]}``). Started and set to autostart by default, as
    Salt's. Returns True.

    CLI Example::

        salt 'hyper1' virt.network_define lab forward=none ip=10.50.0.1/24 dhcp_start=10.50.0.10 dhcp_end=10.50.0.99
    """
    _refuse_not_yet(kwargs, "virt.network_define")
    ip, dhcp_start, dhcp_end = _ipv4_config(ipv4_config, ip, dhcp_start, dhcp_end)
    np = _np
    spec = np.network_spec(name, bridge, forward, ip, dhcp_start, dhcp_end, netmask=netmask)
    with _conn(connection) as conn:
        np.define(conn, "network", spec)
        if _bool(autostart):
            np.set_autostart(conn, "network", name, True)
        if _bool(start):
            np.start(conn, "network", name)
        return True


def network_update(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    ipv4_config=None,
    test=False,
    connection=None,
    **kwargs,
):
    """
    Bring an existing network to this definition (the arguments of ``virt.network_define``, Salt's
    ``ipv4_config`` too). Returns True when it needed (``test=True``: needs) an update, False when it
    was as declared (Salt's return). A running network uses the new definition after a restart.

    CLI Example:: salt 'hyper1' virt.network_update lab forward=none ip=10.50.0.1/24
    """
    _refuse_not_yet(kwargs, "virt.network_update")
    ip, dhcp_start, dhcp_end = _ipv4_config(ipv4_config, ip, dhcp_start, dhcp_end)
    spec = _np.network_spec(name, bridge, forward, ip, dhcp_start, dhcp_end, netmask=netmask)
    with _conn(connection) as conn:
        _np.get(conn, "network", name)  # an update needs an existing network
        ret = _np.ensure(conn, "network", spec, test=_bool(test))
    return bool(ret["changes"])


def network_start(name, connection=None, **kwargs):
    """Start a defined network. Returns True (it runs).

    CLI Example:: salt 'hyper1' virt.network_start isolated
    """
    _refuse_not_yet(kwargs, "virt.network_start")
    with _conn(connection) as conn:
        _np.start(conn, "network", name)
        return True


def network_stop(name, connection=None, **kwargs):
    """Stop a running network. Returns True (it is stopped).

    CLI Example:: salt 'hyper1' virt.network_stop isolated
    """
    _refuse_not_yet(kwargs, "virt.network_stop")
    with _conn(connection) as conn:
        _np.stop(conn, "network", name)
        return True


def network_undefine(name, connection=None, **kwargs):
    """Stop and remove a network definition. Returns True.

    CLI Example:: salt 'hyper1' virt.network_undefine isolated
    """
    _refuse_not_yet(kwargs, "virt.network_undefine")
    with _conn(connection) as conn:
        return bool(_np.undefine(conn, "network", name))


def network_get_xml(name, connection=None, **kwargs):
    """The network's libvirt XML.

    CLI Example:: salt 'hyper1' virt.network_get_xml default
    """
    _refuse_not_yet(kwargs, "virt.network_get_xml")
    with _conn(connection) as conn:
        net = _np.get(conn, "network", name)
        with _c.lv_errors(f"read network {name!r}"):
            return net.XMLDesc(0)


def network_set_autostart(name, state="on", connection=None, **kwargs):
    """Start the network when the host boots (``state=on``) or not (``off``). Returns True.

    CLI Example:: salt 'hyper1' virt.network_set_autostart default off
    """
    _refuse_not_yet(kwargs, "virt.network_set_autostart")
    if str(state).lower() not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise SaltInvocationError(f"virt.network_set_autostart: state must be on or off, got {state!r}")
    with _conn(connection) as conn:
        _np.set_autostart(conn, "network", name, _bool(state) or str(state).lower() == "on")
        return True


def network_info(name=None, connection=None):
    """``{name: {bridge, forward, ip, dhcp, active, autostart}}`` of one network or all.

    CLI Example:: salt 'hyper1' virt.network_info
    """
    with _conn(connection) as conn:
        return _np.info(conn, "network", name)


def list_networks(connection=None):
    """Names of all virtual networks.

    CLI Example:: salt 'hyper1' virt.list_networks
    """
    return sorted(network_info(connection=connection))
