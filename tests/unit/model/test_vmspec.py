"""saltvirt.model.vmspec: the one VM spec (init, update and the states), no libvirt needed."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.model import vmargs
from saltvirt.model import vmspec as spec


def test_defaults_one_virtio_nic_on_br0_and_system_disk_from_image():
    s = spec.build(
        vmargs.InitRequest("web1", 2, 512, image="/img/base.qcow2"), image_format="qcow2", images_dir="/srv/vms"
    )
    assert [(n.name, n.type, n.source, n.model) for n in s.nics] == [("eth0", "bridge", "br0", "virtio")]
    assert [(d.name, d.path, d.format, d.target, d.overlay) for d in s.disks] == [
        ("system", "/srv/vms/web1/system.qcow2", "qcow2", "vda", False)
    ]
    assert s.vm_dir == "/srv/vms/web1"
    assert s.graphics is None


def test_overlay_forces_qcow2_and_full_copy_keeps_image_format():
    over = spec.build(
        vmargs.InitRequest("a", 1, 64, image="/i.raw", enable_qcow=True), image_format="raw", images_dir="/v"
    )
    assert (over.disks[0].format, over.disks[0].overlay, over.disks[0].path) == ("qcow2", True, "/v/a/system.qcow2")
    full = spec.build(vmargs.InitRequest("a", 1, 64, image="/i.raw"), image_format="raw", images_dir="/v")
    assert (full.disks[0].format, full.disks[0].overlay, full.disks[0].path) == ("raw", False, "/v/a/system.raw")


def test_profiles_merge_with_explicit_entries_by_name():
    profiles = {
        "nic": {"dual": {"eth0": {"bridge": "br0"}, "eth1": {"network": "isolated", "eth": "e1000"}}},
        "disk": {"big": [{"system": {"size": 20480}}, {"data": {"size": 1024, "format": "raw"}}]},
    }
    s = spec.build(
        vmargs.InitRequest(
            "db1",
            4,
            4096,
            image="/i.qcow2",
            nic="dual",
            disk="big",
            interfaces=[{"name": "eth1", "source": "other"}, {"name": "eth2", "type": "bridge", "source": "br1"}],
            disks=[{"name": "data", "size": 2048}],
        ),
        image_format="qcow2",
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
    args = {"name": "ok1", "cpu": 1, "mem": 64}
    args.update(kwargs)
    images_dir = args.pop("images_dir", "/v")
    with pytest.raises(SaltInvocationError, match=message):
        spec.build(
            vmargs.InitRequest(args.pop("name"), args.pop("cpu"), args.pop("mem"), **args), images_dir=images_dir
        )


@pytest.mark.parametrize(
    "disks",
    [
        None,
        [{"name": "data", "size": 1024}, {"name": "logs", "size": 512, "format": "raw"}],
        {"system": {"size": 4096}, "data": {"size": 100}},  # a bigger system disk: virt.init grows the copy
        [{"name": "system", "size": 1000}],  # smaller than the image: the image's size
        [{"name": "scratch", "size": 300, "pool": "acme"}, {"name": "old", "source_file": "acme-old", "pool": "acme"}],
    ],
)
def test_new_disks_mib_is_what_the_spec_allocates(disks):
    """The disk a tenant's quota counts for virt.init: every disk of the spec virt.init builds, the image-backed
    system disk at the image's size (2048 MiB here) unless it is given a bigger one; an attached volume: none."""
    built = spec.build(vmargs.InitRequest("web1", 1, 256, image="/srv/salt-images/base.qcow2", disks=disks))
    allocated = sum(max(d.size or 0, 2048 if d.image else 0) for d in built.disks if not d.attach)
    assert spec.new_disks_mib(disks, 2048) == allocated


def test_new_disks_mib_refuses_a_bad_size():
    with pytest.raises(SaltInvocationError, match=r"size of disk data \(MiB\)"):
        spec.new_disks_mib([{"name": "data", "size": "lots"}], 2048)


def test_tcg_translation_cache_is_the_operators_and_only_for_tcg():
    """virt:tcg_tb_cache_mib (minion config): 128 MiB by default for an emulated VM, none for KVM (it
    translates nothing), 0 for QEMU's own default; anything else is refused with what to fix."""
    assert spec.tb_cache_mib(None, "qemu") == spec.DEFAULT_TCG_TB_CACHE_MIB == 128
    assert spec.tb_cache_mib("256", "qemu") == 256 and spec.tb_cache_mib(256, "kvm") is None
    assert spec.tb_cache_mib(0, "qemu") is None and spec.tb_cache_mib("0", "qemu") is None
    for bad in (-1, "lots", 1 << 20, True):
        with pytest.raises(SaltInvocationError, match=r"virt:tcg_tb_cache_mib \(MiB, 0: QEMU's default\)"):
            spec.tb_cache_mib(bad, "qemu")


@pytest.mark.parametrize(
    ("image", "recorded"),
    [
        (
            "https://alice:pa55@images.example.com:8443/cloud/web.qcow2?token=s3cret#x",
            "https://images.example.com:8443/cloud/web.qcow2",
        ),
        ("https://images.example.com/web.qcow2?X-Amz-Signature=s3cret", "https://images.example.com/web.qcow2"),
        ("https://tok@images.example.com/web.qcow2", "https://images.example.com/web.qcow2"),
        ("salt://images/web.qcow2?saltenv=dev", "salt://images/web.qcow2"),
        (" /srv/salt-images/base/web.qcow2 ", "/srv/salt-images/base/web.qcow2"),
        (None, None),
    ],
)
def test_the_recorded_image_is_the_source_without_its_secrets(image, recorded):
    """What virt.init keeps in <metadata> (and every vm_info shows): never user:password, a query or a fragment."""
    assert spec.image_origin(image) == recorded


def test_the_recorded_image_is_the_catalog_name_when_the_runner_gives_one():
    assert spec.image_origin("salt://images/debian12.qcow2", "debian12") == "debian12"
    with pytest.raises(SaltInvocationError, match="invalid catalog image name '../x'"):
        spec.image_origin("salt://images/x.qcow2", "../x")
    with pytest.raises(SaltInvocationError, match="image= is missing"):
        spec.image_origin(None, "debian12")
    with pytest.raises(SaltInvocationError, match="not repeated here") as err:
        spec.image_origin("https://u:s3cret@[::1/x")
    assert "s3cret" not in str(err.value)
