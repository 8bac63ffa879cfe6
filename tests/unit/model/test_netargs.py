"""saltvirt.model.netargs: the network arguments declared once, and the coverage test (as virtinst's
test_checkprops.py): every signature is the table, and every declared argument travels through the real
loaders (virt.network_define, the virt.network_running state) into libvirt's definition on the test driver,
where the reader finds what the spec asked for."""

import inspect
import re

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import netpool
from saltvirt.model import netargs
from saltvirt.xml import netxml
from tests.support.argtables import signature_mismatches
from tests.support.saltloader import load_states, make_minion_mods

# a value of every argument, and what else the network needs for it (None: nothing)
EXAMPLES = {
    "bridge": ("virbr77", {"forward": "none"}),
    "forward": ("route", {"ip": "10.77.1.1/24"}),
    "ip": ("10.77.2.1/24", None),
    "netmask": ("255.255.0.0", {"ip": "10.77.3.1"}),
    "dhcp_start": ("10.77.4.10", {"ip": "10.77.4.1/24", "dhcp_end": "10.77.4.99"}),
    "dhcp_end": ("10.77.5.99", {"ip": "10.77.5.1/24", "dhcp_start": "10.77.5.10"}),
    "ipv4_config": ({"cidr": "10.77.6.0/24", "hosts": {"10.77.6.5": {"mac": "52:54:00:77:00:05"}}}, None),
    "ipv6_config": ({"cidr": "fd00:77::/64"}, None),
    "vport": ("openvswitch", {"forward": "bridge", "bridge": "ovsbr77"}),
    "tag": (42, {"forward": "bridge", "bridge": "ovsbr78", "vport": "openvswitch"}),
    "mtu": (1400, {"forward": "none"}),
    "domain": ({"name": "lab.example", "localOnly": True}, {"forward": "none"}),
    "nat": ({"port": {"start": 2000, "end": 3000}}, {"ip": "10.77.9.1/24"}),
    "interfaces": ("eth77 eth78", {"forward": "passthrough"}),
    "addresses": ("0000:04:00.1", {"forward": "hostdev"}),
    "physical_function": ("eth79", {"forward": "hostdev"}),
    "dns": ({"forwarders": [{"addr": "8.8.8.8"}]}, {"forward": "none"}),
}


@pytest.fixture(scope="module")
def virt(tmp_path_factory):
    conn = libvirt.open("test:///default")  # test:///default keeps its networks while a connection is open
    yield make_minion_mods(tmp_path_factory.mktemp("netargs"), "test:///default")
    conn.close()


def _defaults(fun=None):
    return (
        {a.name: a.default for a in netargs.ARGS}
        | (netargs.CALLS[fun] if fun else {})
        | {"name": inspect.Parameter.empty}
    )


@pytest.mark.parametrize("fun", sorted(netargs.CALLS))
def test_signatures_are_the_table(virt, fun):
    state = fun in netargs.STATES
    func = load_states(virt)[fun] if state else virt[fun]
    names = ["name", *netargs.BASIC, *netargs.CALLS[fun], *(netargs.NESTED if state else ())]
    assert signature_mismatches(func, names, _defaults(fun), var_keyword=not state) == []


def test_the_spec_builder_takes_the_table():
    params = inspect.signature(netxml.network_spec).parameters
    assert set(params) == {"name", *netargs.BY_NAME}
    assert {n: p.default for n, p in params.items() if n != "name"} == {a.name: a.default for a in netargs.ARGS}


def test_the_signature_check_sees_a_drift():
    def drifted(name, bridge=None, forward="route", **kwargs):
        pass

    found = signature_mismatches(drifted, ["name", "bridge", "forward", "ip"], _defaults(), var_keyword=True)
    assert any(m.startswith("names:") for m in found) and any(m.startswith("forward: default") for m in found)


def test_every_argument_has_an_example():
    assert set(EXAMPLES) == set(netargs.BY_NAME)
    assert len(netargs.NESTED) == 11  # Salt's network arguments beyond the basic ones (issue 35: five lists)


@pytest.mark.parametrize("arg", [a.name for a in netargs.ARGS])
def test_every_argument_reaches_libvirt(virt, arg):
    """The argument changes the spec (or is required by what else is given), and libvirt's read-back of what
    virt.network_define and the virt.network_running state defined is that spec."""
    value, needs = EXAMPLES[arg]
    given = dict(needs or {}, **{arg: value})
    spec = netxml.network_spec("x", **netargs.spec_kwargs(given))
    try:
        without = netxml.network_spec("x", **netargs.spec_kwargs(dict(needs or {})))
    except SaltInvocationError:
        without = None  # what else is given needs this argument
    assert spec != without, f"{arg} changes nothing in the spec"
    declared = {k: v for k, v in spec.items() if k != "name"}
    conn = libvirt.open("test:///default")
    try:
        name = f"na-{arg}".replace("_", "-")
        assert virt["virt.network_define"](name, start=False, autostart=False, **given) is True
        assert {k: v for k, v in netpool.info(conn, "network", name)[name].items() if k in declared} == declared
        virt["virt.network_undefine"](name)
        ret = load_states(virt)["virt.network_running"](name + "-st", autostart=False, **given)
        assert ret["result"] is True, ret
        got = netpool.info(conn, "network", name + "-st")[name + "-st"]
        assert {k: v for k, v in got.items() if k in declared} == declared
        virt["virt.network_undefine"](name + "-st")
    finally:
        conn.close()


@pytest.mark.parametrize("fun", ["virt.network_define", "virt.network_update"])
def test_the_reference_names_every_argument(virt, fun):
    """The functions' docstrings are the reference (docs/reference): each argument of the table is named."""
    doc = virt[fun].__doc__
    assert [a.name for a in netargs.ARGS if not re.search(rf"``{a.name}(``|:)", doc)] == []
