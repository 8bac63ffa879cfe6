"""saltvirt.model.vmgrains: a VM's ``virt_vm`` resource grains from its hypervisor's facts, the one mapping the
resource type (minion side) and ``salt-run virt.* select=`` (master side) share."""

from saltvirt.model import vmgrains

UUID = "0B7E2C57-6A2F-4A7B-9C51-7D3A1F2E9A01"


def test_grains_from_a_vm_info_entry():
    facts = {
        "uuid": UUID,
        "name": "db1",
        "state": "running",
        "cpu": 2,
        "mem": 1024,
        "group": "db",
        "owner": {"tenant": "acme", "creator": "alice"},
        "image": "debian12",
        "ha": True,
        "persistent": True,
        "autostart": True,
        "nics": {
            "52:54:00:00:00:0b": {"mac": "52:54:00:00:00:0b"},
            "nic1": {"mac": None},
            "x": {"mac": "52:54:00:00:00:0a"},
        },
        "disks": {"vda": {}},  # not a grain
    }
    uuid = UUID.lower()
    assert vmgrains.grains(facts, "hv1") == {
        "id": uuid,
        "uuid": uuid,
        "name": "db1",
        "virt_vm": True,
        "hypervisor": "hv1",
        "state": "running",
        "vcpus": 2,
        "mem_mib": 1024,
        "group": "db",
        "tenant": "acme",
        "image": "debian12",
        "ha": True,
        "persistent": True,
        "autostart": True,
        "macs": ["52:54:00:00:00:0a", "52:54:00:00:00:0b"],
    }
    assert set(vmgrains.grains(facts, "hv1")) == set(vmgrains.NAMES)


def test_an_operators_vm_and_an_unreadable_one():
    got = vmgrains.grains({"uuid": UUID, "name": "ops1", "owner": None, "nics": {}}, "hv1")
    assert (got["tenant"], got["group"], got["image"], got["ha"], got["macs"]) == (None, None, None, False, [])
    assert vmgrains.grains({"name": "odd", "state": "unknown", "error": "cannot read"}, "hv1") == {}
