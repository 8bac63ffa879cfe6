"""The arguments of Salt's virtual network calls, declared once: ``virt.network_define`` /
``network_update`` (``_modules/virt_network.py``) and the ``virt.network_defined`` / ``network_running``
states (``_states/virt.py``).

Each :class:`Arg` is one argument of the network's definition: its name and default (the same in every
function, and in :func:`saltvirt.xml.netxml.network_spec`, which checks it), what it takes, and whether it
is one of Salt's nested arguments, which the execution functions take as keywords (``**kwargs``) and the
states as parameters. Each function's own arguments (``autostart``, ``start``, ``test``, ``connection``) are
in :data:`CALLS`. tests/unit/model/test_netargs.py checks every signature against the table and exercises
each argument through the real loaders.

Adding an argument: a row here, its parameter in ``netxml.network_spec`` (same default) and in the two
states (a nested one) or in the two functions (a basic one), and its handling in ``netxml``.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from saltvirt.base.salttypes import Data


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    default: object
    takes: str  # what it takes, in words
    nested: bool = False  # Salt's nested argument: a keyword of virt.network_define/update, a state parameter
    salt: bool = True  # Salt's own argument (False: salt-virt's shorthand for Salt's ipv4_config)


ARGS = (
    Arg("bridge", None, "the bridge's name (forward=bridge: an existing host bridge)"),
    Arg("forward", "nat", "nat, route, open, bridge, private, vepa, passthrough, hostdev or none (isolated)"),
    Arg("ip", None, "ADDRESS/PREFIX, or ADDRESS with netmask", salt=False),
    Arg("netmask", None, "the netmask of a bare ip", salt=False),
    Arg("dhcp_start", None, "the first address of the DHCP range", salt=False),
    Arg("dhcp_end", None, "the last address of the DHCP range", salt=False),
    Arg("ipv4_config", None, "{cidr, dhcp_ranges: [{start, end}], hosts, bootp: {file, server}}", nested=True),
    Arg("ipv6_config", None, "{cidr, dhcp_ranges: [{start, end}], hosts}", nested=True),
    Arg("vport", None, "openvswitch, or {type, parameters: {interfaceid, profileid}}", nested=True),
    Arg("tag", None, "a VLAN id, or {trunk, tags: [{id, nativeMode}]}", nested=True),
    Arg("mtu", None, "int (68-65535)", nested=True),
    Arg("domain", None, "a name, or {name, localOnly}", nested=True),
    Arg("nat", None, "{address: {start, end}, port: {start, end}}", nested=True),
    Arg("interfaces", None, "host interfaces (a list or a whitespace separated string)", nested=True),
    Arg("addresses", None, "PCI addresses (a list or a whitespace separated string)", nested=True),
    Arg("physical_function", None, "an SR-IOV physical function's interface", nested=True),
    Arg("dns", None, "{forwarders: [{domain, addr}], txt: {name: text}, hosts: {IP: [names]}, srvs: [...]}",
        nested=True),
)  # fmt: skip
BY_NAME = {a.name: a for a in ARGS}
BASIC = tuple(a.name for a in ARGS if not a.nested)  # parameters of every network function, after name
NESTED = tuple(a.name for a in ARGS if a.nested)  # Salt's nested arguments (11)
# each function's own arguments (and defaults) after the basic ones; a state's nested parameters follow
CALLS: dict[str, dict[str, Any]] = {
    "virt.network_define": {"autostart": True, "start": True, "connection": None},
    "virt.network_update": {"test": False, "connection": None},
    "virt.network_defined": {"autostart": True, "connection": None},
    "virt.network_running": {"autostart": True, "connection": None},
}
STATES = ("virt.network_defined", "virt.network_running")


def spec_kwargs(values: Mapping[str, Any]) -> Data:
    """The keywords of :func:`saltvirt.xml.netxml.network_spec` besides ``name`` from a function's arguments
    ``values``: every basic one (its default when absent), the nested ones given (not None)."""
    out = {name: values.get(name, BY_NAME[name].default) for name in BASIC}
    out.update({name: values[name] for name in NESTED if values.get(name) is not None})
    return out
