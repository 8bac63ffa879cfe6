"""saltvirt.host.netpool: network and pool specs and XML (ElementTree), desired-vs-current on libvirt's test
driver, the virt.network_* / pool_* module functions and the network/pool states through Salt's loaders."""

import xml.etree.ElementTree as ET

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import netpool
from saltvirt.xml import netxml, poolxml
from tests.support.saltloader import load_states


@pytest.fixture
def conn():
    """test:///default (shared in this process: what the loader modules see too); cleaned up after."""
    c = libvirt.open("test:///default")
    nets, pools = {n.name() for n in c.listAllNetworks(0)}, {p.name() for p in c.listAllStoragePools(0)}
    yield c
    for obj in c.listAllNetworks(0) + c.listAllStoragePools(0):
        if obj.name() not in nets | pools:
            if obj.isActive():
                obj.destroy()
            obj.undefine()
    c.close()


UNSET = dict.fromkeys(netxml.OPTIONAL)  # the spec keys a plain ip/dhcp network does not declare


@pytest.fixture
def states(virt_test, conn):
    return lambda test=False: load_states(virt_test, test)


# specs ----------------------------------------------------------------------------------------------
def test_network_spec_normalises():
    assert netxml.network_spec(
        "n", ip="10.1.0.1", netmask="255.255.0.0", dhcp_start="10.1.0.10", dhcp_end="10.1.9.9"
    ) == {
        **UNSET,
        "name": "n",
        "bridge": None,
        "forward": "nat",
        "ip": "10.1.0.1/16",
        "dhcp": ["10.1.0.10", "10.1.9.9"],
    }
    for isolated in (None, "none", "isolated", ""):
        assert netxml.network_spec("n", forward=isolated, ip="10.2.0.1/24")["forward"] is None
    assert netxml.network_spec("lan", forward="bridge", bridge="br0") == {
        **UNSET,
        "name": "lan",
        "bridge": "br0",
        "forward": "bridge",
        "ip": None,
        "dhcp": None,
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"forward": "masquerade"}, "forward must be one of"),
        ({"forward": "bridge"}, "needs bridge="),
        ({"forward": "bridge", "bridge": "br0", "ip": "10.0.0.1/24"}, "has no ip"),
        ({"ip": "10.0.0.1"}, "needs a prefix or netmask"),
        ({"ip": "ten.0.0.1/24"}, "ADDRESS/PREFIX"),
        ({"netmask": "255.255.255.0"}, "netmask needs ip="),
        ({"ip": "10.0.0.1/24", "dhcp_start": "10.0.1.5", "dhcp_end": "10.0.0.9"}, "outside 10.0.0.0/24"),
        ({"ip": "10.0.0.1/24", "dhcp_start": "10.0.0.50", "dhcp_end": "10.0.0.9"}, "backwards"),
        ({"ip": "10.0.0.1/24", "dhcp_start": "10.0.0.5"}, "both dhcp_start and dhcp_end"),
        ({"dhcp_start": "10.0.0.5", "dhcp_end": "10.0.0.9"}, "needs ip="),
        ({"bridge": "br 0"}, "invalid bridge name"),
    ],
)
def test_network_spec_refuses_bad_input(kwargs, message):
    with pytest.raises(SaltInvocationError, match=message):
        netxml.network_spec("n", **kwargs)
    with pytest.raises(SaltInvocationError, match="invalid network name"):
        netxml.network_spec("a/b")


def test_network_xml_round_trip_and_redefinition_keeps_the_rest():
    spec = netxml.network_spec("iso", forward=None, ip="10.3.0.1/24", dhcp_start="10.3.0.10", dhcp_end="10.3.0.20")
    xml = netxml.network_xml(spec)
    assert ET.fromstring(xml).find("forward") is None
    assert netxml.parse_network(xml) == spec
    base = (
        "<network><name>iso</name><uuid>4b1e0000-0000-4000-8000-000000000001</uuid><bridge name='virbr7' stp='on'/>"
        "<mac address='52:54:00:11:22:33'/><domain name='lab'/>"
        "<ip address='10.3.0.1' netmask='255.255.255.0'/></network>"
    )
    nat = netxml.network_spec("iso", ip="10.4.0.1/24")
    root = ET.fromstring(netxml.network_xml(nat, base))
    assert root.findtext("uuid") == "4b1e0000-0000-4000-8000-000000000001"
    assert root.find("bridge").get("name") == "virbr7" and root.find("mac").get("address") == "52:54:00:11:22:33"
    assert root.find("domain").get("name") == "lab" and root.find("forward").get("mode") == "nat"
    assert [ip.get("address") for ip in root.findall("ip")] == ["10.4.0.1"]
    kept = {"bridge": "virbr7", "domain": {"name": "lab"}}  # undeclared: left as the network has it
    assert netxml.parse_network(ET.tostring(root, encoding="unicode")) == dict(nat, **kept)
    same = ET.fromstring(netxml.network_xml(netxml.network_spec("iso", forward=None, ip="10.3.0.1/24"), base))
    assert same.find("ip").get("netmask") == "255.255.255.0"  # unchanged ip element left as written


def test_pool_spec_and_xml():
    spec = poolxml.pool_spec("images", target="/srv/images/")
    assert (spec["name"], spec["type"], spec["target"]) == ("images", "dir", "/srv/images")
    assert poolxml.pool_diff(spec, poolxml.parse_pool(poolxml.pool_xml(spec))) == {}
    base = (
        "<pool type='dir'><name>images</name><uuid>u</uuid><capacity>1</capacity>"
        "<target><path>/old</path></target></pool>"
    )
    root = ET.fromstring(poolxml.pool_xml(spec, base))
    assert (
        root.findtext("uuid") == "u" and root.find("capacity") is None and root.findtext("target/path") == "/srv/images"
    )
    with pytest.raises(SaltInvocationError, match="pool type"):
        poolxml.pool_spec("images", ptype="lvm", target="/srv")  # every type: tests/unit/test_poolxml.py
    with pytest.raises(SaltInvocationError, match="absolute path"):
        poolxml.pool_spec("images", target="relative/dir")


# on the test driver ---------------------------------------------------------------------------------
def test_parse_what_libvirt_reports(conn):
    default = netpool.info(conn, "network", "default")["default"]
    assert default == {
        **UNSET,
        "name": "default",
        "bridge": "virbr0",
        "forward": "nat",
        "ip": "192.168.122.1/24",
        "dhcp": ["192.168.122.2", "192.168.122.254"],
        "active": True,
        "autostart": False,
        "persistent": True,
        "uuid": default["uuid"],  # Salt's keys
        "leases": default["leases"],
    }
    assert isinstance(default["uuid"], str) and isinstance(default["leases"], list)
    pool = netpool.info(conn, "pool", "default-pool")["default-pool"]
    assert pool["type"] == "dir" and pool["target"] == "/default-pool" and pool["capacity"] > 0
    assert netpool.info(conn, "network", "nope") == {}  # Salt's "not found"


def test_ensure_network_defines_starts_and_converges(conn):
    spec = netxml.network_spec("np1", forward=None, ip="10.5.0.1/24", dhcp_start="10.5.0.10", dhcp_end="10.5.0.20")
    preview = netpool.ensure(conn, "network", spec, autostart=True, run=True, test=True)
    assert preview["changes"] == {"defined": spec, "autostart": {"old": False, "new": True}, "started": True}
    assert netpool.lookup(conn, "network", "np1") is None  # test: nothing made
    done = netpool.ensure(conn, "network", spec, autostart=True, run=True)
    assert done["changes"] == preview["changes"] and done["comment"] == "network np1 defined, autostart on, started"
    net = conn.networkLookupByName("np1")
    assert net.isActive() and net.autostart()
    assert netpool.ensure(conn, "network", spec, autostart=True, run=True) == {
        "changes": {},
        "comment": "network np1 is as declared",
    }
    netpool.stop(conn, "network", "np1")
    moved = netxml.network_spec("np1", ip="10.6.0.1/24")
    changed = netpool.ensure(conn, "network", moved, autostart=None)
    assert changed["changes"] == {
        "redefined": {
            "forward": {"old": None, "new": "nat"},
            "ip": {"old": "10.5.0.1/24", "new": "10.6.0.1/24"},
            "dhcp": {"old": ["10.5.0.10", "10.5.0.20"], "new": None},
        }
    }
    assert (
        conn.networkLookupByName("np1").UUIDString() == net.UUIDString() and conn.networkLookupByName("np1").autostart()
    )
    assert netpool.ensure(conn, "network", moved)["changes"] == {}


def test_ensure_pool(conn, tmp_path):
    spec = poolxml.pool_spec("pp1", target=str(tmp_path / "pool"))
    done = netpool.ensure(conn, "pool", spec, autostart=False, run=True)
    assert done["changes"] == {"defined": spec, "started": True}
    assert netpool.ensure(conn, "pool", spec, autostart=False, run=True)["changes"] == {}
    netpool.stop(conn, "pool", "pp1")
    other = poolxml.pool_spec("pp1", target=str(tmp_path / "other"))
    assert netpool.ensure(conn, "pool", other)["changes"] == {
        "redefined": {"target": {"old": spec["target"], "new": other["target"]}}
    }


def test_module_functions(virt_test, conn):
    v = virt_test
    assert (
        v["virt.network_define"](
            "np2", forward="route", ip="10.7.0.1", netmask="255.255.255.0", autostart=True, start=True
        )
        is True
    )  # Salt's return
    made = v["virt.network_info"]("np2")["np2"]
    assert (made["forward"], made["ip"], made["active"], made["autostart"]) == ("route", "10.7.0.1/24", True, True)
    with pytest.raises(SaltInvocationError, match="already defined"):
        v["virt.network_define"]("np2")
    assert "np2" in v["virt.list_networks"]() and v["virt.network_info"]("np2")["np2"]["ip"] == "10.7.0.1/24"
    assert v["virt.network_stop"]("np2") is True
    assert v["virt.network_info"]("np2")["np2"]["active"] is False
    assert v["virt.network_stop"]("np2") is True  # already stopped
    assert v["virt.network_start"]("np2") is True
    assert v["virt.network_info"]("np2")["np2"]["active"] is True
    assert v["virt.network_undefine"]("np2") is True
    assert "np2" not in v["virt.list_networks"]()

    assert v["virt.pool_define"]("pp2", target="/srv/test-pools/pp2") is True  # Salt's return; start=True by default
    pool = v["virt.pool_info"]("pp2")["pp2"]
    assert (pool["type"], pool["target"], pool["active"], pool["autostart"]) == (
        "dir",
        "/srv/test-pools/pp2",
        True,
        False,
    )
    assert (pool["state"], pool["target_path"], pool["free"]) == ("running", "/srv/test-pools/pp2", pool["available"])
    assert v["virt.pool_list_volumes"]("pp2") == [] and "pp2" in v["virt.list_pools"]()
    assert v["virt.pool_stop"]("pp2") == {"name": "pp2", "stopped": True}
    with pytest.raises(CommandExecutionError, match="pool 'pp2' is not running"):
        v["virt.pool_list_volumes"]("pp2")
    assert v["virt.pool_start"]("pp2", build=False) == {"name": "pp2", "started": True}
    assert v["virt.pool_info"]("pp2")["pp2"]["capacity"] > 0
    assert v["virt.pool_undefine"]("pp2") == {"name": "pp2", "undefined": True}
    assert "default-pool" in v["virt.list_pools"]() and v["virt.pool_list_volumes"]("default-pool") == []


def test_info_of_a_missing_network_or_pool_is_empty(virt_test, conn):
    # Salt's network_info/pool_info: {} for a name that is not defined; SLS files test
    # ``virt.network_info(n).get(n, {}).get('active')`` before creating the object.
    assert virt_test["virt.network_info"]("no-such-net") == {}
    assert virt_test["virt.pool_info"]("no-such-pool") == {}
    assert virt_test["virt.network_info"]("no-such-net").get("no-such-net", {}).get("active") is None
    assert netpool.info(conn, "network", "no-such-net") == {}
    assert "default" in virt_test["virt.network_info"]()  # all of them without a name


def test_network_and_pool_states(states, conn):
    st, preview = states(), states(test=True)
    args = {"forward": "none", "ip": "10.8.0.1/24", "dhcp_start": "10.8.0.10", "dhcp_end": "10.8.0.20"}
    would = preview["virt.network_running"]("np3", **args)
    assert would["result"] is None and set(would["changes"]) == {"defined", "autostart", "started"}
    assert netpool.lookup(conn, "network", "np3") is None
    made = st["virt.network_running"]("np3", **args)
    assert made["result"] is True and made["changes"] == would["changes"]
    assert st["virt.network_running"]("np3", **args) == {
        "name": "np3",
        "result": True,
        "changes": {},
        "comment": "network np3 is as declared",
    }
    assert preview["virt.network_defined"]("np3", **args)["result"] is True  # as declared: True even in test mode
    bad = st["virt.network_defined"]("np3", forward="bridge")
    assert bad["result"] is False and "needs bridge=" in bad["comment"]

    pool = {"target": "/srv/test-pools/pp3"}
    assert preview["virt.pool_defined"]("pp3", **pool)["changes"] == {
        "defined": poolxml.pool_spec("pp3", target="/srv/test-pools/pp3"),
        "autostart": {"old": False, "new": True},
    }
    assert st["virt.pool_defined"]("pp3", **pool)["result"] is True
    assert not conn.storagePoolLookupByName("pp3").isActive()  # defined only: starting is pool_running's job
    assert st["virt.pool_running"]("pp3", **pool)["changes"] == {"started": True}
    assert st["virt.pool_running"]("pp3", **pool)["changes"] == {}
    assert st["virt.pool_running"]("pp3")["changes"] == {}  # an existing pool keeps what is not declared
    assert st["virt.pool_running"]("pp4")["result"] is False  # a new dir pool needs a target
