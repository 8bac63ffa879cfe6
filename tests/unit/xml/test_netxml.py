"""saltvirt.xml.netxml: every network argument of Salt's virt (golden XML, libvirt's read-back on the test
driver), hostile values refused before anything is defined, live DHCP host updates (netpool.ensure) on
test:///default, through the module and the states as well.

openvswitch is not proven on a real libvirtd (see tests/integration/test_networks_real.py: this kernel has
no openvswitch module); the vport/VLAN XML is pinned by golden files and read back by libvirt's test
driver instead."""

import xml.etree.ElementTree as ET

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import netpool
from saltvirt.xml import netxml
from tests.support.saltloader import load_states, make_minion_mods

HOSTS = {"10.60.0.5": {"mac": "52:54:00:AA:00:05", "name": "db"}, "10.60.0.6": {"mac": "52:54:00:aa:00:06"}}
IPV4 = {
    "cidr": "10.60.0.0/24",
    "dhcp_ranges": [{"start": "10.60.0.100", "end": "10.60.0.199"}],
    "hosts": HOSTS,
    "bootp": {"file": "pxelinux.0", "server": "10.60.0.2"},
}
IPV6 = {
    "cidr": "fd00:60::/64",
    "dhcp_ranges": [{"start": "fd00:60::100", "end": "fd00:60::1ff"}],
    "hosts": [{"ip": "fd00:60::5", "name": "db"}, {"ip": "fd00:60::6", "id": "00:03:00:01:52:54:00:aa:00:06"}],
}
DNS = {
    "forwarders": [{"domain": "example.com", "addr": "192.168.1.1"}, {"addr": "8.8.8.8"}, {"domain": "local.lan"}],
    "txt": {"example.com": "v=spf1 a -all", "http.tcp.example.com": "name=value,paper=A4"},
    "hosts": {"10.60.0.7": ["mirror.acme.lab", "test.acme.lab"]},
    "srvs": [
        {"name": "ldap", "protocol": "tcp", "domain": "ldapserver.example.com", "target": ".", "port": 389}
        | {"priority": 1, "weight": 10}
    ],
}

CASES = {
    "net-nat-full": {
        "forward": "nat",
        "ipv4_config": IPV4,
        "ipv6_config": IPV6,
        "nat": {"address": {"start": "1.2.3.4", "end": "1.2.3.10"}, "port": {"start": 500, "end": 1000}},
        "mtu": 9000,
        "domain": {"name": "lab.acme.org", "localOnly": True},
        "dns": DNS,
    },
    "net-ovs-vlan-trunk": {
        "forward": "bridge",
        "bridge": "ovsbr0",
        "vport": {"type": "openvswitch", "parameters": {"interfaceid": "09b11c53-8b5c-4eeb-8f00-d84eaa0aaa4f"}},
        "tag": {"trunk": True, "tags": [{"id": 42, "nativeMode": "untagged"}, {"id": 47}]},
    },
    "net-ovs-vlan": {"forward": "bridge", "bridge": "ovsbr1", "vport": "openvswitch", "tag": 42},
    "net-macvtap-passthrough": {"forward": "passthrough", "interfaces": "eth10 eth11 eth12"},
    "net-macvtap-bridge": {"forward": "bridge", "interfaces": ["eth1"]},
    "net-hostdev-pf": {"forward": "hostdev", "physical_function": "eth0"},
    "net-hostdev-addresses": {"forward": "hostdev", "addresses": "0000:04:00.1 0000:e3:01.2"},
}


def _spec(name, args):
    args = dict(args)
    positional = [args.pop(k, None) for k in ("bridge",)]
    return netxml.network_spec(name, positional[0], args.pop("forward"), **args)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_and_read_back(golden, case):
    spec = _spec(case, CASES[case])
    xml = netxml.network_xml(spec)
    read_back = golden(f"netxml/{case}", xml)
    facts = netxml.parse_network(read_back)
    assert netxml.network_diff(spec, facts) == {}, "libvirt understood what we declared"
    assert netxml.parse_network(xml) == {**facts, "bridge": spec["bridge"]}


def test_salt_shapes_normalised():
    spec = _spec("n", CASES["net-nat-full"])
    assert spec["ip"] == "10.60.0.1/24" and spec["dhcp"] == ["10.60.0.100", "10.60.0.199"]
    assert spec["hosts"] == [
        {"ip": "10.60.0.5", "mac": "52:54:00:aa:00:05", "name": "db"},
        {"ip": "10.60.0.6", "mac": "52:54:00:aa:00:06"},
    ]
    assert spec["ipv6"]["ip"] == "fd00:60::1/64" and spec["ipv6"]["hosts"][1] == {
        "ip": "fd00:60::6",
        "id": "00:03:00:01:52:54:00:aa:00:06",
    }
    assert spec["nat"] == {"address": ["1.2.3.4", "1.2.3.10"], "port": [500, 1000]}
    assert spec["domain"] == {"name": "lab.acme.org", "localOnly": True} and spec["mtu"] == 9000
    # Salt's list form of hosts (its docs) is the same as its mapping form (its template)
    listed = dict(IPV4, hosts=[dict(h, ip=ip) for ip, h in HOSTS.items()])
    assert netxml.network_spec("n", ipv4_config=listed)["hosts"] == spec["hosts"]
    assert _spec("v", CASES["net-ovs-vlan"])["vlan"] == {"tags": [{"id": 42}]}
    assert _spec("h", CASES["net-hostdev-addresses"])["addresses"] == ["0000:04:00.1", "0000:e3:01.2"]


V4 = {"cidr": "10.9.0.0/24"}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ipv4_config": {"cidr": "10.9.0.0/33"}}, "must be an IPv4 network"),
        ({"ipv4_config": {"cidr": "fd00::/64"}}, "must be an IPv4 network"),
        ({"ipv6_config": {"cidr": "10.9.0.0/24"}}, "must be an IPv6 network"),
        ({"ipv4_config": {"cidr": "10.9.0.0/24", "tftp": "/srv"}}, "tftp"),
        ({"ipv4_config": dict(V4, hots={})}, "did you mean 'hosts'"),
        ({"ipv4_config": dict(V4, hosts={"10.9.0.5": {"mac": "52:54:00:zz:00:01"}})}, "mac must look like"),
        ({"ipv4_config": dict(V4, hosts={"10.9.0.5": {"name": "db\nexit"}})}, "must be a host name"),
        ({"ipv4_config": dict(V4, hosts={"10.9.0.5": {"nmae": "db"}})}, "did you mean 'name'"),
        ({"ipv4_config": dict(V4, hosts={"10.9.1.5": {"name": "db"}})}, "outside 10.9.0.0/24"),
        ({"ipv4_config": dict(V4, hosts={"10.9.0.5": {}})}, "needs a mac or a name"),
        ({"ipv4_config": dict(V4, hosts=[{"ip": "10.9.0.5", "name": "a"}, {"ip": "10.9.0.6", "name": "a"}])}, "twice"),
        ({"ipv6_config": {"cidr": "fd00::/64", "hosts": {"fd00::5": {"mac": "52:54:00:00:00:01"}}}}, "not mac"),
        ({"ipv4_config": dict(V4, bootp={"file": "../../etc/shadow"})}, "boot file name"),
        ({"ipv4_config": V4, "ip": "10.9.0.1/24"}, "not both"),
        ({"ip": "fd00::1/64"}, "give it as ipv6_config"),
        ({"ip": {"cidr": "10.9.0.0/24"}}, "by name, ipv4_config="),
        ({"tag": 4096}, "whole number 0-4095"),
        ({"tag": {"tags": [{"id": 1}, {"id": 2}]}}, "need trunk: True"),
        ({"tag": {"tags": [{"id": 1, "nativeMode": "raw"}]}}, "tagged or untagged"),
        ({"tag": {"tag": [{"id": 1}]}}, "did you mean 'tags'"),
        ({"mtu": "9000; reboot"}, "whole number"),
        ({"domain": {"name": "lab\n<x/>"}}, "DNS name"),
        ({"domain": {"name": "lab", "localonly": True}}, "did you mean 'localOnly'"),
        ({"nat": {"port": {"start": 1000, "end": 500}}}, "backwards"),
        ({"nat": {"adress": {}}}, "did you mean 'address'"),
        ({"forward": "route", "nat": {"port": {"start": 1, "end": 2}}}, "needs forward=nat"),
        ({"dns": {"forwarder": []}}, "did you mean 'forwarders'"),
        ({"dns": {"txt": {"a.example": 'x" injected="1'}}}, "no quotes"),
        ({"dns": {"txt": {"_http.tcp.example.com": "x"}}}, "DNS name"),  # libvirt's schema has no '_'
        ({"dns": {"hosts": {"10.9.0.7": ["ok", "bad name"]}}}, "must be a host name"),
        ({"dns": {"srvs": [{"name": "ldap", "protocol": "sctp"}]}}, "tcp or udp"),
        ({"dns": {"forwarders": [{"addr": "8.8.8.x"}]}}, "IP address"),
        ({"vport": "ovs", "bridge": "br0", "forward": "bridge"}, "vport:type must be one of"),
        ({"vport": {"type": "openvswitch", "parameters": {"interfaceid": "nope"}}, "bridge": "b"}, "UUID"),
        ({"vport": {"type": "openvswitch", "paramters": {}}, "bridge": "b"}, "did you mean 'parameters'"),
        ({"vport": {"type": "openvswitch", "parameters": {"x": "1"}}, "bridge": "b"}, "unknown key 'x'"),
        ({"forward": "passthrough"}, "needs interfaces= or physical_function="),
        ({"forward": "passthrough", "interfaces": "eth0 eth1/x"}, "interface name"),
        ({"forward": "passthrough", "interfaces": ["eth0;rm"]}, "interface name"),
        ({"forward": "nat", "interfaces": "eth0"}, "macvtap"),
        ({"forward": "hostdev"}, "needs physical_function="),
        ({"forward": "hostdev", "addresses": "0000:04:00.9"}, "not a PCI address"),
        ({"forward": "passthrough", "addresses": "0000:04:00.1", "interfaces": "eth0"}, "forward=hostdev"),
        ({"forward": "hostdev", "physical_function": "eth0", "ipv4_config": V4}, "has no ip"),
        ({"forward": "bridge"}, "needs bridge="),
    ],
)
def test_hostile_input_refused(kwargs, message):
    args = dict(kwargs)
    with pytest.raises(SaltInvocationError, match=message):
        netxml.network_spec("n", args.pop("bridge", None), args.pop("forward", "nat"), **args)


def test_redefinition_keeps_what_is_not_declared():
    full = netxml.network_xml(_spec("keep", CASES["net-nat-full"]))
    moved = netxml.network_spec("keep", ipv4_config={"cidr": "10.61.0.0/24"})
    root = ET.fromstring(netxml.network_xml(moved, full))
    assert root.find("mtu").get("size") == "9000" and root.find("domain").get("localOnly") == "yes"
    assert root.find("dns/txt") is not None and root.find("forward/nat/port").get("start") == "500"
    assert root.find("ip[@family='ipv6']").get("address") == "fd00:60::1"
    assert [(ip.get("address"), ip.find("dhcp")) for ip in root.findall("ip") if ip.get("family") != "ipv6"] == [
        ("10.61.0.1", None)
    ]
    # undeclared hosts on an unchanged address stay; declared ones replace them
    same_ip = netxml.network_spec("keep", ipv4_config={"cidr": "10.60.0.0/24"})
    facts = netxml.parse_network(netxml.network_xml(same_ip, full))
    assert facts["hosts"] == _spec("k", CASES["net-nat-full"])["hosts"] and facts["dhcp"] is None


# on the test driver ---------------------------------------------------------------------------------
@pytest.fixture
def conn():
    c = libvirt.open("test:///default")
    nets = {n.name() for n in c.listAllNetworks(0)}
    yield c
    for net in c.listAllNetworks(0):
        if net.name() not in nets:
            if net.isActive():
                net.destroy()
            net.undefine()
    c.close()


def test_live_dhcp_hosts_without_restart(conn):
    base = {"cidr": "10.62.0.0/24", "dhcp_ranges": [{"start": "10.62.0.100", "end": "10.62.0.150"}]}
    one = dict(base, hosts={"10.62.0.5": {"mac": "52:54:00:62:00:05", "name": "a"}})
    spec = netxml.network_spec("live1", forward=None, ipv4_config=one, ipv6_config={"cidr": "fd00:62::/64"})
    netpool.ensure(conn, "network", spec, run=True)
    two = dict(base, hosts={"10.62.0.6": {"mac": "52:54:00:62:00:05", "name": "a"}, "10.62.0.7": {"name": "b"}})
    v6 = {"cidr": "fd00:62::/64", "hosts": [{"ip": "fd00:62::9", "name": "b"}]}
    spec2 = netxml.network_spec("live1", forward=None, ipv4_config=two, ipv6_config=v6)
    assert netxml.host_changes(spec["hosts"], spec2["hosts"]) == [
        ("modify", {"ip": "10.62.0.6", "mac": "52:54:00:62:00:05", "name": "a"}),
        ("add", {"ip": "10.62.0.7", "name": "b"}),
    ]
    preview = netpool.ensure(conn, "network", spec2, test=True)
    assert set(preview["changes"]) == {"live"} and set(preview["changes"]["live"]) == {"hosts", "ipv6"}
    assert "updated live" in preview["comment"] and "restart" not in preview["comment"].split("(")[0]
    net = conn.networkLookupByName("live1")
    assert netxml.parse_network(net.XMLDesc(0))["hosts"] == spec["hosts"]  # test: nothing done
    done = netpool.ensure(conn, "network", spec2)
    assert done["changes"] == preview["changes"] and "after a restart" not in done["comment"]
    assert net.isActive()
    live = netxml.parse_network(net.XMLDesc(0))  # one definition on the test driver; live + config: real lab test
    assert live["hosts"] == spec2["hosts"] and live["ipv6"]["hosts"] == spec2["ipv6"]["hosts"]
    assert netpool.ensure(conn, "network", spec2)["changes"] == {}
    none = netxml.network_spec("live1", forward=None, ipv4_config=dict(base, hosts={}), ipv6_config=v6)
    assert netpool.ensure(conn, "network", none, test=True)["changes"]["live"] == {
        "hosts": {"old": spec2["hosts"], "new": None}
    }
    three = dict(base, hosts={"10.62.0.7": {"name": "b"}})
    spec3 = netxml.network_spec("live1", forward=None, ipv4_config=three, ipv6_config=dict(v6, hosts=[]))
    assert spec3["ipv6"]["hosts"] is None  # an empty list declares "no hosts"
    assert set(netpool.ensure(conn, "network", spec3)["changes"]) == {"live"}
    after = netxml.parse_network(net.XMLDesc(0))
    assert after["hosts"] == [{"ip": "10.62.0.7", "name": "b"}] and after["ipv6"]["hosts"] is None  # deleted live
    other = netxml.network_spec("live1", forward=None, ipv4_config=dict(two, cidr="10.62.0.0/23"))
    moved = netpool.ensure(conn, "network", other)
    assert set(moved["changes"]) == {"redefined"} and "after a restart" in moved["comment"]


def test_module_and_states_take_salt_arguments(virt_test, conn, tmp_path):
    v = virt_test
    assert v["virt.network_define"]("mod1", None, "nat", ipv4_config=IPV4, mtu=1400, dns=DNS, autostart=False)
    xml = v["virt.network_get_xml"]("mod1")
    assert "<host mac='52:54:00:aa:00:05' name='db' ip='10.60.0.5'/>" in xml and "<mtu size='1400'/>" in xml
    assert v["virt.network_update"]("mod1", None, "nat", ipv4_config=IPV4, mtu=1400, dns=DNS) is False
    more = dict(IPV4, hosts=dict(HOSTS, **{"10.60.0.8": {"name": "c"}}))
    assert v["virt.network_update"]("mod1", None, "nat", ipv4_config=more, test=True) is True
    assert "10.60.0.8" not in v["virt.network_get_xml"]("mod1")
    assert v["virt.network_update"]("mod1", None, "nat", ipv4_config=more) is True
    assert "<host name='c' ip='10.60.0.8'/>" in v["virt.network_get_xml"]("mod1")  # live: running network
    with pytest.raises(SaltInvocationError, match="did you mean 'forwarders'"):
        v["virt.network_update"]("mod1", None, "nat", dns={"forwarder": []})
    with pytest.raises(SaltInvocationError, match="unknown argument"):
        v["virt.network_define"]("mod2", None, "nat", ipv4_config=IPV4, vlan=3)
    assert "mod2" not in v["virt.list_networks"]()

    st, preview = load_states(virt_test, False), load_states(virt_test, True)
    args = {"forward": "none", "ipv4_config": IPV4, "ipv6_config": IPV6, "domain": "lab.acme.org"}
    would = preview["virt.network_running"]("st1", **args)
    assert would["result"] is None and set(would["changes"]) == {"defined", "autostart", "started"}
    assert "st1" not in v["virt.list_networks"]()
    assert st["virt.network_running"]("st1", **args)["changes"] == would["changes"]
    assert st["virt.network_running"]("st1", **args)["changes"] == {}
    hosts = dict(IPV4, hosts={"10.60.0.9": {"mac": "52:54:00:aa:00:09"}})
    would = preview["virt.network_defined"]("st1", **dict(args, ipv4_config=hosts))
    assert would["result"] is None and set(would["changes"]) == {"live"}
    made = st["virt.network_defined"]("st1", **dict(args, ipv4_config=hosts))
    assert (
        made["result"] is True
        and made["changes"] == would["changes"]
        and made["comment"] == ("network st1 updated live (hosts: DHCP hosts, no restart needed)")
    )
    bad = st["virt.network_defined"]("st1", forward="none", tag={"tags": [{"id": 1}, {"id": 2}]})
    assert bad["result"] is False and "trunk" in bad["comment"]


def test_network_states_open_libvirt_with_the_configured_connection_settings(tmp_path):
    """The network states connect through saltvirt.host.conn.salt_connect like every function: the
    configured keepalive (here an unusable one) and open_timeout apply to them too."""
    mods = make_minion_mods(tmp_path, "test:///default", connection={"uri": "test:///default", "keepalive": "often"})
    ret = load_states(mods, True)["virt.network_running"]("ka1", forward="none", ipv4_config=IPV4)
    assert ret["result"] is False and "virt:connection:keepalive must be a mapping" in ret["comment"], ret
