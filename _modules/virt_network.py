"""
Execution module ``virt`` (continued): virtual networks (``saltvirt.host.netpool``).
"""

import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltInvocationError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
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
    from saltvirt.base import install as _install
    from saltvirt.base import operators as _operators
    from saltvirt.base import validate as _validate
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.host import netpool as _np
    from saltvirt.model import netargs as _netargs
    from saltvirt.xml import netxml as _nx

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions

    __salt__: SaltFunctions

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _conn(connection=None):
    return _c.salt_connect(__salt__, connection)


def _refuse_unknown(kwargs, fun):
    _validate.no_credentials(kwargs.pop("username", None), kwargs.pop("password", None), fun)
    unknown = sorted(k for k in kwargs if not k.startswith("__"))
    if unknown:
        raise SaltInvocationError(f"{fun}: unknown argument(s) {', '.join(unknown)}")


def _spec(name, basic, kwargs, fun):
    """The one network spec (saltvirt.xml.netxml) from this module's arguments: ``basic`` the values of
    ``saltvirt.model.netargs.BASIC`` in the signature's order, Salt's nested ones (``NESTED``) in kwargs."""
    nested = {k: kwargs.pop(k) for k in _netargs.NESTED if k in kwargs}
    _refuse_unknown(kwargs, fun)
    return _nx.network_spec(name, **_netargs.spec_kwargs({**dict(zip(_netargs.BASIC, basic, strict=True)), **nested}))


_ARGS_DOC = """
    Arguments (Salt's names and shapes; each nested key is checked, an unknown one names the nearest):
    ``forward``: nat, route, open, bridge (onto an existing ``bridge``, or macvtap over ``interfaces``),
    private/vepa/passthrough (macvtap over ``interfaces`` or ``physical_function``), hostdev (SR-IOV:
    ``physical_function`` or PCI ``addresses``) or none. ``ip`` as ADDRESS/PREFIX or ADDRESS with
    ``netmask`` and a DHCP range ``dhcp_start``/``dhcp_end``; or ``ipv4_config``/``ipv6_config``:
    ``{cidr, dhcp_ranges: [{start, end}], hosts: {IP: {mac, name}} or [{ip, mac, name, id}],
    bootp: {file, server}}`` (the address is the first host of ``cidr``; one range; IPv6 hosts by
    ``id``/``name``). ``nat: {address: {start, end}, port: {start, end}}``; ``vport``: openvswitch
    or ``{type, parameters: {interfaceid, profileid}}``; ``tag``: a VLAN id or ``{trunk, tags:
    [{id, nativeMode}]}``; ``mtu``; ``domain``: a name or ``{name, localOnly}``; ``dns: {forwarders:
    [{domain, addr}], txt: {name: text}, hosts: {IP: [names]}, srvs: [{name, protocol, domain,
    target, port, priority, weight}]}``; ``interfaces``/``addresses``: a list or a whitespace
    separated string. Left out on an existing network: kept as it is.
"""


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
    **kwargs,
):
    """
    Define a virtual network (arguments below); started and set to autostart by default, as Salt's.
    Returns True. Bad input is refused before anything is defined.

    CLI Example::

        salt 'hyper1' virt.network_define lab forward=none ip=10.50.0.1/24 dhcp_start=10.50.0.10 dhcp_end=10.50.0.99
        salt 'hyper1' virt.network_define lab None nat \\
            ipv4_config='{cidr: 10.51.0.0/24, hosts: {10.51.0.5: {mac: "52:54:00:00:00:05", name: db}}}'
    """
    spec = _spec(name, (bridge, forward, ip, netmask, dhcp_start, dhcp_end), kwargs, "virt.network_define")
    with _conn(connection) as conn:
        _np.define(conn, "network", spec)
        if _bool(autostart):
            _np.set_autostart(conn, "network", name, True)
        if _bool(start):
            _np.start(conn, "network", name)
        return True


def network_update(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    test=False,
    connection=None,
    **kwargs,
):
    """
    Bring an existing network to this definition (the arguments of ``virt.network_define``). Returns
    True when it needed (``test=True``: needs) an update, False when it was as declared (Salt's
    return). Changed static DHCP hosts of a running network are applied live (virNetworkUpdate: dnsmasq
    gets them, no restart); any other change is written and used after the network's restart.

    CLI Example:: salt 'hyper1' virt.network_update lab forward=none ip=10.50.0.1/24
    """
    spec = _spec(name, (bridge, forward, ip, netmask, dhcp_start, dhcp_end), kwargs, "virt.network_update")
    with _conn(connection) as conn:
        _np.get(conn, "network", name)  # an update needs an existing network
        ret = _np.ensure(conn, "network", spec, test=_bool(test))
    return bool(ret["changes"])


for _fun in (network_define, network_update):
    if _fun.__doc__:  # None under python -OO
        _fun.__doc__ += _ARGS_DOC


def network_start(name, connection=None, **kwargs):
    """Start a defined network. Returns True (it runs).

    CLI Example:: salt 'hyper1' virt.network_start isolated
    """
    _refuse_unknown(kwargs, "virt.network_start")
    with _conn(connection) as conn:
        _np.start(conn, "network", name)
        return True


def network_stop(name, connection=None, **kwargs):
    """Stop a running network. Returns True (it is stopped).

    CLI Example:: salt 'hyper1' virt.network_stop isolated
    """
    _refuse_unknown(kwargs, "virt.network_stop")
    with _conn(connection) as conn:
        _np.stop(conn, "network", name)
        return True


def network_undefine(name, connection=None, **kwargs):
    """Stop and remove a network definition. Returns True.

    CLI Example:: salt 'hyper1' virt.network_undefine isolated
    """
    _refuse_unknown(kwargs, "virt.network_undefine")
    with _conn(connection) as conn:
        return bool(_np.undefine(conn, "network", name))


def network_get_xml(name, connection=None, **kwargs):
    """The network's libvirt XML.

    CLI Example:: salt 'hyper1' virt.network_get_xml default
    """
    _refuse_unknown(kwargs, "virt.network_get_xml")
    with _conn(connection) as conn:
        net = _np.get(conn, "network", name)
        with _c.lv_errors(f"read network {name!r}"):
            return net.XMLDesc(0)


def network_set_autostart(name, state="on", connection=None, **kwargs):
    """Start the network when the host boots (``state=on``) or not (``off``). Returns True.

    CLI Example:: salt 'hyper1' virt.network_set_autostart default off
    """
    _refuse_unknown(kwargs, "virt.network_set_autostart")
    if str(state).lower() not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise SaltInvocationError(f"virt.network_set_autostart: state must be on or off, got {state!r}")
    with _conn(connection) as conn:
        _np.set_autostart(conn, "network", name, _bool(state) or str(state).lower() == "on")
        return True


def network_info(name=None, connection=None):
    """``{name: {bridge, forward, ip, dhcp, hosts, bootp, ipv6, nat, interfaces, pf, addresses, mtu,
    vport, vlan, domain, dns, active, autostart, persistent}}`` of one network or all (absent parts None);
    ``{}`` for a network that is not defined, as Salt.

    CLI Example:: salt 'hyper1' virt.network_info
    """
    with _conn(connection) as conn:
        return _np.info(conn, "network", name)


def list_networks(connection=None):
    """Names of all virtual networks.

    CLI Example:: salt 'hyper1' virt.list_networks
    """
    return sorted(network_info(connection=connection))


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
