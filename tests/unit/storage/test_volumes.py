"""saltvirt.storage.volumes through virt.init / virt.purge / vm_info on libvirt's test:/// driver: Salt's
``disks=[{name, pool, size, format, image | source_file}]``. Real pools and guests booting from volumes:
tests/integration/test_storage_real.py."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.saltloader import make_minion_mods


@pytest.fixture
def conn(default_pools_conn):
    return default_pools_conn


def test_disks_on_pool_volumes_init_info_purge(tmp_path, virt_test, conn):
    """Salt's ``disks=[{name, pool, size}]``: the volume is made in the pool, attached as type='volume',
    owned by the VM (purge deletes it, never a volume it attached with source_file). An existing volume
    is attached only from a pool the operator lists in virt:pools, as what is on it (raw here)."""
    v = virt_test
    target = tmp_path / "cd1"  # the test driver makes no files: the attached volume's file is made here
    target.mkdir()
    v["virt.pool_define"]("cd1", "dir", target=str(target))
    v["virt.volume_define"]("cd1", "shared", 4)
    (target / "shared").write_bytes(b"\0" * 4096)
    disks = [{"name": "data", "pool": "cd1", "size": 16}, {"name": "old", "pool": "cd1", "source_file": "shared"}]
    with pytest.raises(SaltInvocationError, match="pool 'cd1' is not one the operator made available to VMs"):
        v["virt.init"]("pv1", 1, 128, disk=None, nic=None, start=False, disks=disks)
    v = make_minion_mods(tmp_path, "test:///default", pools=["cd1"])
    ret = v["virt.init"]("pv1", 1, 128, disk=None, nic=None, start=False, disks=disks)
    assert [(d["pool"], d["volume"], d["format"]) for d in ret["disks"]] == [("cd1", "pv1_data", "qcow2")]
    assert ret["attached"] == [{"name": "old", "path": str(target / "shared"), "format": "raw"}]
    xml = v["virt.get_xml"]("pv1")
    assert "<source pool='cd1' volume='pv1_data'/>" in xml and "<source pool='cd1' volume='shared'/>" in xml
    assert v["virt.volume_infos"]("cd1", "pv1_data")["cd1"]["pv1_data"]["used_by"] == ["pv1"]
    v["virt.volume_define"]("cd1", "pv9_data", 1)  # not ours: a new VM must not take it over
    with pytest.raises(SaltInvocationError, match="volume 'pv9_data' already exists in pool cd1: refusing"):
        v["virt.init"](
            "pv9", 1, 128, disk=None, nic=None, start=False, disks=[{"name": "data", "pool": "cd1", "size": 1}]
        )
    assert "pv9" not in v["virt.list_domains"]()
    v["virt.pool_stop"]("cd1")  # Salt's #60132: VM queries read the XML, a stopped pool does not break them
    disks = v["virt.get_disks"]("pv1")
    assert disks["vda"]["pool"] == "cd1" and disks["vda"]["volume"] == "pv1_data"
    assert v["virt.vm_info"]("pv1")["pv1"]["disks"]["vdb"]["volume"] == "shared"
    v["virt.pool_start"]("cd1")
    purged = v["virt.purge"]("pv1")
    assert purged["volumes"]["removed"] == ["cd1/pv1_data"]
    assert purged["volumes"]["kept"] == {"cd1/shared": "not created by salt-virt for this VM (not in its manifest)"}
    assert v["virt.pool_list_volumes"]("cd1") == ["pv9_data", "shared"]


def test_disks_on_pool_volumes_bad_input(tmp_path, virt_test, conn):
    v = virt_test
    with pytest.raises(CommandExecutionError, match="pool 'nopool' is not defined"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=[{"name": "d", "pool": "nopool", "size": 1}])
    with pytest.raises(SaltInvocationError, match="needs a size"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=[{"name": "d", "pool": "default-pool"}])
    nope = [{"name": "d", "pool": "default-pool", "source_file": "nope"}]
    with pytest.raises(SaltInvocationError, match="pool 'default-pool' is not one the operator made available"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=nope)
    v = make_minion_mods(tmp_path, "test:///default", pools=["default-pool"])
    with pytest.raises(SaltInvocationError, match="volume 'nope' does not exist in pool default-pool"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=nope)
    with pytest.raises(SaltInvocationError, match="pool 'cd9' is not one the operator made available to VMs"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=[{"name": "d", "pool": "cd9", "size": 1}])
    assert "pv2" not in v["virt.list_domains"]()


def test_update_and_running_state_add_a_volume_disk(virt_test, conn):
    """virt.update / virt.running with a pool disk: the volume is made (test=True: only said), attached,
    owned by the VM; a second run changes nothing."""
    from tests.support.saltloader import load_states

    v = virt_test
    v["virt.pool_define"]("cd2", "dir", target="/srv/test-pools/cd2")
    v["virt.init"]("pv3", 1, 128, disk=None, nic=None, start=False, disks=[{"name": "system", "size": 8}])
    disks = [{"name": "system", "size": 8}, {"name": "data", "pool": "cd2", "size": 16}]
    would = v["virt.update"]("pv3", disks=disks, test=True)
    added = would["changes"]["disks"]["added"]
    assert [(d["target"], d["pool"], d["volume"]) for d in added] == [("vdb", "cd2", "pv3_data")]
    assert v["virt.pool_list_volumes"]("cd2") == []  # test: nothing made
    done = v["virt.update"]("pv3", disks=disks)
    assert done["changes"]["disks"]["added"][0]["volume"] == "pv3_data"
    assert v["virt.get_disks"]("pv3")["vdb"]["volume"] == "pv3_data"
    assert v["virt.pool_list_volumes"]("cd2") == ["pv3_data"]
    st = load_states(v)
    again = st["virt.defined"]("pv3", cpu=1, mem=128, disk=None, nic=None, disks=disks)
    assert again["result"] is True and again["changes"] == {}
    purged = v["virt.purge"]("pv3")
    assert purged["volumes"]["removed"] == ["cd2/pv3_data"] and v["virt.pool_list_volumes"]("cd2") == []
