"""saltvirt.spec.vmspec: the one VM spec (init, update and the states), no libvirt needed."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.spec import vmspec as spec


def test_defaults_one_virtio_nic_on_br0_and_system_disk_from_image():
    s = spec.build("web1", 2, 512, image="/img/base.qcow2", image_format="qcow2", images_dir="/srv/vms")
    assert [(n.name, n.type, n.source, n.model) for n in s.nics] == [("eth0", "bridge", "br0", "virtio")]
    assert [(d.name, d.path, d.format, d.target, d.overlay) for d in s.disks] == [
        ("system", "/srv/vms/web1/system.qcow2", "qcow2", "vda", False)
    ]
    assert s.vm_dir == "/srv/vms/web1"
    assert s.graphics is None


def test_overlay_forces_qcow2_and_full_copy_keeps_image_format():
    over = spec.build("a", 1, 64, image="/i.raw", image_format="raw", enable_qcow=True, images_dir="/v")
    assert (over.disks[0].format, over.disks[0].overlay, over.disks[0].path) == ("qcow2", True, "/v/a/system.qcow2")
    full = spec.build("a", 1, 64, image="/i.raw", image_format="raw", images_dir="/v")
    assert (full.disks[0].format, full.disks[0].overlay, full.disks[0].path) == ("raw", False, "/v/a/system.raw")


def test_profiles_merge_with_explicit_entries_by_name():
    profiles = {
        "nic": {"dual": {"eth0": {"bridge": "br0"}, "eth1": {"network": "isolated", "eth": "e1000"}}},
        "disk": {"big": [{"system": {"size": 20480}}, {"data": {"size": 1024, "format": "raw"}}]},
    }
    s = spec.build(
        "db1",
        4,
        4096,
        image="/i.qcow2",
        image_format="qcow2",
        nic="dual",
        disk="big",
        interfaces=[{"name": "eth1", "source": "other"}, {"name": "eth2", "type": "bridge", "source": "br1"}],
        disks=[{"name": "data", "size": 2048}],
        profiles=profiles,
        images_dir="/v",
    )
    assert [(n.name, n.type, n.source, n.model) for n in s.nics] == [
        ("eth0", "bridge", "br0", "virtio"),
        ("eth1", "network", "other", "e1000"),
        ("eth2", "bridge", "br1", "virtio"),
    ]
    assert [(d.name, d.size, d.format, d.target, bool(d.image)) for d in s.disks] == [
        ("system", 20480, "qcow2", "vda", True),
        ("data", 2048, "raw", "vdb", False),
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "../etc"}, "invalid VM name"),
        ({"name": "a/b"}, "invalid VM name"),
        ({"name": "x'><y"}, "invalid VM name"),
        ({"name": ""}, "non-empty"),
        ({"cpu": 0}, "positive integer"),
        ({"mem": -1}, "positive integer"),
        ({"cpu": "two"}, "positive integer"),
        ({"nic": "nosuch"}, "nic profile 'nosuch' is not defined"),
        ({"disk": "nosuch"}, "disk profile 'nosuch' is not defined"),
        ({"disks": [{"name": "data"}], "disk": None}, "needs a size"),
        ({"disks": [{"name": "../x", "size": 1}], "disk": None}, "invalid disk name"),
        ({"interfaces": [{"name": "eth0", "type": "bogus", "source": "x"}]}, "type must be one of"),
        ({"images_dir": "relative/dir"}, "absolute path"),
        ({"boot": {"kernel": "../vmlinuz"}, "disk": None}, "absolute path"),
        ({"graphics": {"type": "rdp"}, "disk": None}, "vnc or spice"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(kwargs, message):
    args = {"name": "ok1", "cpu": 1, "mem": 64, "images_dir": "/v"}
    args.update(kwargs)
    with pytest.raises(SaltInvocationError, match=message):
        spec.build(args.pop("name"), args.pop("cpu"), args.pop("mem"), **args)
