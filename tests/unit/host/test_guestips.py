"""saltvirt.host.guestips: guest addresses per NIC, matched by MAC and labelled by source (agent, lease, arp),
asked only of running VMs; guest-claimed data is validated before it is reported.

libvirt's test driver answers ``interfaceAddresses`` for every source with made-up addresses (one per
NIC, by MAC), which is what the source order and the merge need. What it cannot do is hang like a guest
agent that never answers: that one case uses a stand-in domain object (see test_a_hung_agent_...)."""

import threading
import time

import libvirt
import pytest

from saltvirt.host import guestips, query

MAC1, MAC2 = "52:54:00:6b:10:01", "52:54:00:6b:10:02"


@pytest.fixture
def conn(test_conn):
    """The private test driver with a libvirt network ``default`` (the lease source needs the network)."""
    net = test_conn.networkDefineXML(
        "<network><name>default</name><bridge name='virbr9'/><ip address='192.168.122.1' prefix='24'>"
        "<dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp></ip></network>"
    )
    net.create()
    return test_conn


def _define(conn, name, nics, agent=False, start=True):
    devices = "".join(
        f"<interface type='{kind}'><mac address='{mac}'/><source {'dev' if kind == 'direct' else kind}='{src}'/>"
        "</interface>"
        for kind, src, mac in nics
    )
    if agent:
        devices += "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"
    dom = conn.defineXML(
        f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os>"
        f"<devices>{devices}</devices></domain>"
    )
    if start:
        dom.create()
    return dom


def test_sources_in_order_each_asked_once_per_vm(conn):
    _define(conn, "agentvm", [("bridge", "br0", MAC1)], agent=True)
    _define(conn, "leasevm", [("network", "default", MAC1)])
    _define(conn, "arpvm", [("bridge", "br0", MAC1)])
    _define(conn, "offvm", [("bridge", "br0", MAC1)], start=False)
    info = query.vm_info(conn)
    agent = info["agentvm"]["nics"][MAC1]["ips"]
    assert agent == [{"address": agent[0]["address"], "prefix": 24, "type": "ipv4", "source": "agent"}]
    assert info["agentvm"]["guest_agent"] == "unknown"  # the test driver reports no channel state
    assert [ip["source"] for ip in info["leasevm"]["nics"][MAC1]["ips"]] == ["lease"]
    assert [ip["source"] for ip in info["arpvm"]["nics"][MAC1]["ips"]] == ["arp"]
    assert info["arpvm"]["guest_agent"] is None and "ips_note" not in info["arpvm"]
    assert info["offvm"]["state"] == "shutoff" and info["offvm"]["nics"][MAC1]["ips"] == []


class Counting:
    """A real test-driver domain whose interfaceAddresses calls are counted per source."""

    def __init__(self, dom):
        self.dom, self.calls = dom, []

    def interfaceAddresses(self, source):
        self.calls.append(source)
        return self.dom.interfaceAddresses(source)


def test_no_source_is_asked_twice_and_a_found_nic_stops_the_search(conn):
    dom = _define(conn, "two", [("network", "default", MAC1), ("bridge", "br0", MAC2)], agent=True)
    counted = Counting(dom)
    infos = {"two": query.describe(dom, "hv")}
    guestips.annotate({"two": counted}, infos)
    src = libvirt
    # the agent gave both NICs an address: neither leases nor ARP are asked
    assert counted.calls == [src.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT]
    assert {ip["source"] for nic in infos["two"]["nics"].values() for ip in nic["ips"]} == {"agent"}

    # no agent: leases only for a VM with a network NIC, ARP only for a bridged one
    for name, nics, asked in (
        ("net", [("network", "default", MAC1)], [src.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE]),
        ("br", [("bridge", "br0", MAC1)], [src.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP]),
        ("direct", [("direct", "eth0", MAC1)], []),  # a macvtap guest is never in the host's ARP table
    ):
        counted = Counting(_define(conn, name, nics))
        infos = {name: query.describe(counted.dom, "hv")}
        guestips.annotate({name: counted}, infos)
        assert counted.calls == asked, name


def test_paused_vm_is_not_asked(conn):
    dom = _define(conn, "paused", [("bridge", "br0", MAC1)], agent=True)
    dom.suspend()
    counted = Counting(dom)
    infos = {"paused": query.describe(dom, "hv")}
    guestips.annotate({"paused": counted}, infos)
    assert counted.calls == [] and infos["paused"]["nics"][MAC1]["ips"] == []


HOSTILE = {
    "eth0": {
        "hwaddr": "52:54:00:6B:10:01",  # upper case: matched all the same
        "addrs": [
            {"addr": "10.0.0.5", "prefix": 24, "type": 0},
            {"addr": "10.0.0.5", "prefix": 24, "type": 0},  # a duplicate is shown once
            {"addr": "10.0.0.6\n\x1b[31mPWNED", "prefix": 24, "type": 0},
            {"addr": "<script>", "prefix": 24, "type": 0},
            {"addr": "127.0.0.1", "prefix": 8, "type": 0},
            {"addr": "fe80::1", "prefix": 64, "type": 1},
            {"addr": "2001:db8::5", "prefix": 999, "type": 0},  # libvirt's type is not trusted either
            {"addr": 167772167, "prefix": 24, "type": 0},
            "not a mapping",
        ],
    },
    "lo": {"hwaddr": "00:00:00:00:00:00", "addrs": [{"addr": "127.0.0.1", "prefix": 8, "type": 0}]},
    "evil": {"hwaddr": "52:54:00:6b:10:01\n", "addrs": [{"addr": "10.9.9.9", "prefix": 24}]},
    "bogus": {"hwaddr": "zz", "addrs": [{"addr": "10.9.9.8", "prefix": 24}]},
    "flood": {"hwaddr": MAC2, "addrs": [{"addr": f"10.1.0.{i}", "prefix": 32} for i in range(1, 200)]},
}


def test_guest_claimed_addresses_are_validated():
    found = guestips.clean(HOSTILE, "agent")
    # "evil"'s hwaddr with a trailing newline is the same MAC once stripped: its well-formed address counts
    assert found[MAC1] == [
        {"address": "10.0.0.5", "prefix": 24, "type": "ipv4", "source": "agent"},
        {"address": "2001:db8::5", "prefix": None, "type": "ipv6", "source": "agent"},
        {"address": "10.9.9.9", "prefix": 24, "type": "ipv4", "source": "agent"},
    ]
    assert len(found[MAC2]) == guestips.MAX_PER_NIC
    assert set(found) == {MAC1, MAC2}
    assert guestips.clean(None, "arp") == {} and guestips.clean({"x": "y"}, "arp") == {}


def test_a_source_failing_host_wide_is_asked_once_per_query(conn):
    """libvirt 9.0's ARP source fails on the lab's kernel ("internal error: wrong nlmsg len"): every VM
    names the failure, but it is not asked again for every VM."""
    doms = {f"b{i}": _define(conn, f"b{i}", [("bridge", "br0", MAC1)]) for i in range(12)}

    class BrokenArp(Counting):
        def interfaceAddresses(self, source):
            self.calls.append(source)
            conn.lookupByName("no-such-vm-here")  # a real libvirt error, code VIR_ERR_NO_DOMAIN ...

    class InternalError(Counting):
        def interfaceAddresses(self, source):
            self.calls.append(source)
            # ... and the source's own failure, as libvirt 9.0 raises it (the test driver's ARP never fails)
            exc = libvirt.libvirtError("internal error: wrong nlmsg len")
            exc.err = (libvirt.VIR_ERR_INTERNAL_ERROR, 0, "internal error: wrong nlmsg len", 2, None, None, None, 0, 0)
            raise exc

    for kind, host_wide in ((BrokenArp, False), (InternalError, True)):
        counted = {n: kind(d) for n, d in doms.items()}
        infos = {n: query.describe(d, "hv") for n, d in doms.items()}
        guestips.annotate(counted, infos)
        calls = sum(len(c.calls) for c in counted.values())
        # lookups run in LOOKUP_WORKERS threads: at most that many ask before the first failure is known
        assert calls <= guestips.LOOKUP_WORKERS if host_wide else calls == len(doms), (kind, calls)
        notes = {info["ips_note"] for info in infos.values()}
        assert len(notes) == 1 and next(iter(notes)).startswith("arp: "), notes


def test_a_failing_source_is_named_and_the_others_still_answer(conn):
    dom = _define(conn, "flaky", [("network", "default", MAC1), ("bridge", "br0", MAC2)])

    class NoLeases(Counting):
        def interfaceAddresses(self, source):
            if source == libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE:
                raise libvirt.libvirtError("no leases here")
            return super().interfaceAddresses(source)

    infos = {"flaky": query.describe(dom, "hv")}
    guestips.annotate({"flaky": NoLeases(dom)}, infos)
    assert infos["flaky"]["ips_note"].startswith("lease: ")
    # ARP, asked next, covers the network NIC as well
    assert [ip["source"] for ip in infos["flaky"]["nics"][MAC1]["ips"]] == ["arp"]


class HungAgent:
    """Stands in for a domain whose guest agent never answers: the test driver has no agent that could
    hang (a real one needs a guest whose agent we control), so this object blocks until released."""

    def __init__(self):
        self.release = threading.Event()

    def interfaceAddresses(self, source):
        self.release.wait(30)
        return {}


def test_a_hung_agent_costs_the_budget_once_and_is_named(conn):
    hung = [HungAgent() for _ in range(guestips.AGENT_WORKERS * 2)]
    doms = {f"h{i}": d for i, d in enumerate(hung)}
    good = _define(conn, "good", [("bridge", "br0", MAC1)], agent=True)
    doms["good"] = good
    try:
        answers = guestips.ask_agents(doms, timeout=0.3)
    finally:
        for d in hung:
            d.release.set()
    assert answers["h0"] == ({}, "agent: no answer within 0.3 s", False)
    assert set(answers) == set(doms)
    # every worker is stuck on a hung agent: "good" may or may not have had its turn, but it is listed
    assert answers["good"][1] in (None, "agent: no answer within 0.3 s")


def test_agent_threads_do_not_outlive_their_work(conn):
    doms = {f"a{i}": _define(conn, f"a{i}", [("bridge", "br0", MAC1)], agent=True) for i in range(20)}
    answers = guestips.ask_agents(doms, timeout=10)
    assert all(note is None and found[MAC1][0]["source"] == "agent" for found, note, _ in answers.values())
    deadline = time.monotonic() + 5
    while any(t.name == "saltvirt-ips" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "saltvirt-ips" for t in threading.enumerate())


@pytest.mark.parametrize("state", ["connected", "unknown"])
def test_agent_asked_unless_reported_disconnected(state):
    assert guestips._wants_agent({"guest_agent": state})
    assert not guestips._wants_agent({"guest_agent": "disconnected"})
    assert not guestips._wants_agent({"guest_agent": None})


class LeasingConn:
    """The test driver's connection with a network-wide lease call: libvirt's test driver has no
    virNetworkGetDHCPLeases (a real libvirtd reads dnsmasq's lease file), so this object answers it for
    the ``default`` network and passes everything else to the real connection."""

    def __init__(self, conn, leases):
        self.conn, self.leases, self.asked = conn, leases, []

    def networkLookupByName(self, name):
        net = self.conn.networkLookupByName(name)  # a real lookup: an unknown network fails as libvirt does
        outer = self

        class Net:
            def DHCPLeases(self):
                outer.asked.append(name)
                return outer.leases

        return Net() if net else None


def test_network_leases_answer_first_in_one_call_per_network(conn):
    """Leases of libvirt's networks are the cheapest source: asked once per network for all its VMs; the
    agent and per-VM sources are asked only for NICs still without an address."""
    doms = {
        "n1": _define(conn, "n1", [("network", "default", MAC1)], agent=True),
        "n2": _define(conn, "n2", [("network", "default", MAC2), ("bridge", "br0", "52:54:00:6b:10:03")]),
    }
    leases = [
        {"mac": MAC1.upper(), "ipaddr": "192.168.122.10", "prefix": 24, "hostname": "evil\n\x1b"},
        {"mac": MAC2, "ipaddr": "192.168.122.11", "prefix": 24},
        {"mac": MAC2, "ipaddr": "not an address", "prefix": 24},
        {"mac": "52:54:00:ff:ff:ff", "ipaddr": "192.168.122.99", "prefix": 24},  # another VM's: not ours
    ]
    counted = {n: Counting(d) for n, d in doms.items()}
    infos = {n: query.describe(d, "hv") for n, d in doms.items()}
    leasing = LeasingConn(conn, leases)
    guestips.annotate(counted, infos, conn=leasing)
    assert leasing.asked == ["default"]
    assert infos["n1"]["nics"][MAC1]["ips"] == [
        {"address": "192.168.122.10", "prefix": 24, "type": "ipv4", "source": "lease"}
    ]
    assert [ip["address"] for ip in infos["n2"]["nics"][MAC2]["ips"]] == ["192.168.122.11"]
    assert counted["n1"].calls == []  # its only NIC had a lease: no agent, no ARP
    # n2's bridged NIC: no per-VM lease call (the network answered), ARP as the fallback
    assert counted["n2"].calls == [libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP]


def test_without_network_leases_each_vm_is_asked(conn):
    """The test driver has no network-wide lease call: each VM's leases are asked, as before."""
    dom = _define(conn, "solo", [("network", "default", MAC1)])
    counted = Counting(dom)
    infos = {"solo": query.describe(dom, "hv")}
    guestips.annotate({"solo": counted}, infos, conn=conn)
    assert counted.calls == [libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE]
    assert [ip["source"] for ip in infos["solo"]["nics"][MAC1]["ips"]] == ["lease"]
