"""Shape conformance with Salt's virt: every key Salt documents for vm_info, full_info, node_info,
get_disks, get_nics, get_graphics, pool_info, network_info, volume_infos and list_snapshots has Salt's
type, recursively, also for empty and absent cases (libvirt's test driver, Salt's real loader). The
table (tests/support/salt_shapes.py) is held to saltext-virt's documented examples."""

import pathlib

import pytest

from tests.support import salt_shapes
from tests.support.salt_shapes import SHAPES, assert_all_conform, assert_conforms, check

SALTEXT_SITE = pathlib.Path("/var/cache/salt-virt/bench-saltext-venv/lib/python3.11/site-packages")
NICS = [
    {"name": "eth0", "type": "network", "source": "default", "model": "e1000"},
    {"name": "eth1", "type": "network", "source": "default", "mac": "52:54:00:aa:bb:02"},
]


@pytest.fixture
def v(virt_test):
    virt_test["virt.init"](
        "shape-full",
        1,
        64,
        start=False,
        seed=False,
        nic=None,
        interfaces=NICS,
        disk=None,
        disks=[{"name": "data", "size": 8}],
        graphics={"type": "vnc"},
    )
    virt_test["virt.init"]("shape-bare", 1, 64, start=False, seed=False, nic=None, disk=None)  # headless, no devices
    virt_test["virt.snapshot"]("shape-full", name="snap1")
    virt_test["virt.volume_define"]("default-pool", "shape-vol", 1)
    yield virt_test
    virt_test["virt.volume_delete"]("default-pool", "shape-vol")
    virt_test["virt.delete_snapshots"]("shape-full", all=True)  # the fixture's undefine refuses a VM with snapshots


def test_vm_facts_have_salts_types(v):
    assert_all_conform(v, ("shape-full", "shape-bare", "test"))  # the driver's own VM runs


def test_the_cases_a_client_iterates(v):
    full, bare = v["virt.vm_info"]("shape-full")["shape-full"], v["virt.vm_info"]("shape-bare")["shape-bare"]
    # Uyuni's virt_utils: infos[vm].get("graphics", {}).get("type"); a headless VM is Salt's "None" mapping
    assert bare["graphics"]["type"] == "None" and bare["graphics"]["port"] == "None"
    assert full["graphics"]["type"] == "vnc" and "passwd" not in full["graphics"]
    assert bare["nics"] == {} and bare["disks"] == {}
    nic = full["nics"]["52:54:00:aa:bb:02"]
    assert nic["source"]["network"] == "default" and nic["source_name"] == "default"
    assert {n["model"] for n in full["nics"].values() if "model" in n} >= {"e1000"}
    assert full["disks"]["vda"]["type"] == "disk"


def test_a_pool_volume_disk_is_salts_pool_slash_volume(virt_test):
    """Salt's ``file`` of a volume disk is ``<pool>/<volume>``: Uyuni's virt_utils takes the pool from it
    (``re.match("^[^/:]+/", disk["file"])``) to start a VM's pools before the VM."""
    v = virt_test
    v["virt.init"](
        "shape-pool",
        1,
        64,
        start=False,
        seed=False,
        nic=None,
        disk=None,
        disks=[{"name": "system", "pool": "default-pool", "size": 8}],
    )
    try:
        (disk,) = v["virt.get_disks"]("shape-pool").values()
        assert disk["file"] == "default-pool/shape-pool_system" and disk["pool"] == "default-pool"
        assert v["virt.vm_info"]("shape-pool")["shape-pool"]["disks"]["vda"]["file"] == disk["file"]
    finally:
        v["virt.purge"]("shape-pool")


def test_host_storage_network_and_snapshot_shapes(v):
    assert_conforms("pool_info", v["virt.pool_info"]())
    assert_conforms("network_info", v["virt.network_info"]())
    assert v["virt.network_stop"]("default") is True
    try:
        stopped = v["virt.network_info"]("default")
        assert_conforms("network_info", stopped)
        assert stopped["default"]["leases"] == []
    finally:
        v["virt.network_start"]("default")
    volumes = v["virt.volume_infos"]()
    assert "shape-vol" in volumes["default-pool"]
    assert_conforms("volume_infos", volumes)
    snaps = v["virt.list_snapshots"]()
    assert snaps["shape-bare"] == "N/A" and snaps["shape-full"][0]["name"] == "snap1"
    assert_conforms("list_snapshots", snaps)
    # absent: Salt's "not found" answers
    assert v["virt.network_info"]("no-such") == {} and v["virt.pool_info"]("no-such") == {}
    assert v["virt.volume_infos"]("default-pool", "no-such") == {}


def test_the_checker_catches_a_changed_type():
    assert check({"vm": {"source": "default", "type": "network", "mac": "m"}}, SHAPES["get_nics"])
    assert check(None, SHAPES["get_graphics"])
    assert check({"vm": "N/A"}, SHAPES["list_snapshots"]) == []
    assert check({"cpu": True}, {"cpu": int})  # a bool is not Salt's int
    assert check({}, {"file": str}) == ["ret: Salt's key 'file' is missing"]


@pytest.mark.skipif(not (SALTEXT_SITE / salt_shapes.SALTEXT_MODULE).is_file(), reason="run bench/setup-saltext.sh")
def test_the_table_holds_salts_documented_examples():
    examples = salt_shapes.documented_examples(SALTEXT_SITE)
    assert "vm_info" in examples
    for function, example in examples.items():
        for entry in example.values():  # every documented key is in the table, required, of the example's type
            table = SHAPES[function]["*"]
            assert set(entry) <= set(table)
            assert check(entry, {k: table[k] for k in entry}, function) == []
