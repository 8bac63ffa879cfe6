"""saltvirt.model.compat: Salt's old spellings (config keys, arguments, URI migration targets)."""

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.model import compat
from tests.support.saltloader import load_states, make_minion_mods


def test_migration_target_accepts_a_libvirt_uri():
    assert compat.migration_target("hv2") == ("hv2", None)
    assert compat.migration_target("qemu+tls://hv2/system") == ("hv2", "qemu+tls://hv2/system")
    assert compat.migration_target("qemu+tcp://10.0.0.2:16509/system") == (
        "10.0.0.2",
        "qemu+tcp://10.0.0.2:16509/system",
    )
    assert compat.migration_target("qemu+ssh://root@[fd00::2]/system")[0] == "fd00::2"


@pytest.mark.parametrize(
    "uri, message",
    [
        ("xen://hv2/", "not a remote QEMU libvirtd"),
        ("qemu+tls://hv2/session", "system daemon"),
        ("qemu+tls://hv2/system\n", "invalid target URI"),
        ("qemu+tls://hv2;rm/system", "host name or an IP address"),
        ("qemu+tls:///system", "host name or an IP address"),
    ],
)
def test_migration_target_refuses_other_uris(uri, message):
    with pytest.raises(SaltInvocationError, match=message):
        compat.migration_target(uri)


def test_uri_target_and_target_uri_together_must_agree():
    with pytest.raises(SaltInvocationError, match="leave target_uri out"):
        compat.migration_target("qemu+tls://hv2/system", "qemu+tcp://hv2/system")


def test_vm_type_is_salts_name_for_vtype(virt_test):
    """The states' ``vm_type`` (Salt's name for the hypervisor type) is vtype, no deprecation."""
    kwargs = {"vm_type": "KVM"}
    assert compat.init_args(kwargs, "virt.running/defined") == [] and kwargs == {"vtype": "kvm"}
    with pytest.raises(SaltInvocationError, match="vm_type='xen' is not supported"):
        compat.init_args({"vm_type": "xen"})
    with pytest.raises(SaltInvocationError, match="give vtype= or vm_type="):
        compat.init_args({"vm_type": "kvm", "vtype": "qemu"})
    assert compat.init_args({"vm_type": None}) == []
    made = virt_test["virt.init"]("vmtype1", 1, 64, disk=None, nic=None, start=False, vm_type="qemu")
    assert made["name"] == "vmtype1" and "<domain type='qemu'" in virt_test["virt.get_xml"]("vmtype1")


def test_images_names_virt_images_or_an_allowed_directory(virt_test, tmp_path):
    """Old Salt's per-call images directory: honoured inside virt:images / virt:allowed_paths, refused
    elsewhere with the settings that would allow it."""
    images = virt_test["config.get"]("virt:images")
    assert compat.images_dir(None, images, ()) == images
    assert compat.images_dir(images, images, ()) == images
    sources = str(tmp_path / "sources")  # in the fixture's virt:allowed_paths
    made = virt_test["virt.init"]("imgs1", 1, 64, nic=None, start=False, seed=False, images=sources)
    assert made["name"] == "imgs1"
    assert virt_test["virt.get_disks"]("imgs1")["vda"]["file"].startswith(sources + "/imgs1/")
    with pytest.raises(SaltInvocationError, match=r"images= /srv is outside .*virt:images.*virt:allowed_paths"):
        virt_test["virt.init"]("imgs2", 1, 64, nic=None, start=False, seed=False, images="/srv")
    assert "imgs2" not in virt_test["virt.list_domains"]()
    virt_test["virt.purge"]("imgs1")


def test_libvirts_image_directory_is_allowed_unless_the_operator_says_otherwise():
    assert compat.validate.configured_allowed_paths({}) == ("/var/lib/libvirt/images",)
    assert compat.validate.configured_allowed_paths({"virt": {"images": "/srv/vms"}}) == ("/var/lib/libvirt/images",)
    assert compat.validate.configured_allowed_paths({"virt": {"allowed_paths": []}}) == []
    assert compat.validate.configured_allowed_paths({"virt": {"allowed_paths": ["/srv/x"]}}) == ["/srv/x"]
    # the tutorial's image=/var/lib/libvirt/images/...: inside the default roots
    roots = ("/srv/vms", *compat.validate.configured_allowed_paths({}))
    assert compat.validate.confined("/var/lib/libvirt/images/centos.img", "image", roots)


def test_images_unused_when_every_disk_names_a_pool():
    """Issue 36 #5: images= places the VM's disk files; with every disk on a pool it places none."""
    pooled = [{"name": "system", "pool": "p1", "size": 8}, {"name": "data", "pool": "p2", "size": 8}]
    note = compat.images_unused("/srv/vms", "web1", {}, None, pooled)
    assert note == (
        "images=/srv/vms: no disk of VM web1 is made there, every disk names a pool (its volume is made in the "
        "pool); only the VM's manifest and cloud-init seed go there. Leave images= out"
    )
    profiles = {"disk": {"pooled": [{"system": {"pool": "p1"}}]}}
    assert compat.images_unused("/srv/vms", "web1", profiles, "pooled") == note.replace(" data", "")
    assert compat.images_unused(None, "web1", {}, None, pooled) is None
    assert compat.images_unused("/srv/vms", "web1", {}, "default", pooled[1:]) is None  # the system disk: a file
    assert compat.images_unused("/srv/vms", "web1", {}, None, None) is None  # no disk at all: nothing to say


def test_virt_init_and_the_state_warn_when_images_places_no_disk(tmp_path):
    held = libvirt.open("test:///default")  # the test driver keeps its state while a connection is open
    v = make_minion_mods(tmp_path, "test:///default", pools=["imgpool"])
    target = tmp_path / "imgpool"
    target.mkdir()
    v["virt.pool_define"]("imgpool", "dir", target=str(target))
    sources = str(tmp_path / "sources")  # in the fixture's virt:allowed_paths
    args = {"disk": None, "nic": None, "start": False, "seed": False, "images": sources}
    pooled = [{"name": "data", "pool": "imgpool", "size": 16}]
    try:
        ret = v["virt.init"]("imgs3", 1, 64, disks=pooled, **args)
        assert [w.split(",")[0] for w in ret.get("warnings", [])] == [
            f"images={sources}: no disk of VM imgs3 is made there"
        ]
        assert "warnings" not in v["virt.init"]("imgs4", 1, 64, disks=[{"name": "data", "size": 16}], **args)
        states = load_states(v, test=True)
        del args["start"]  # virt.defined does not start it
        state = states["virt.defined"]("imgs5", cpu=1, mem=64, disks=pooled, **args)
        assert state["result"] is None, state
        assert [w.split(",")[0] for w in state.get("warnings", [])] == [
            f"images={sources}: no disk of VM imgs5 is made there"
        ]
    finally:
        for vm in ("imgs3", "imgs4"):
            if vm in v["virt.list_domains"]():
                v["virt.purge"](vm)
        pool = held.storagePoolLookupByName("imgpool")
        if pool.isActive():
            pool.destroy()
        pool.undefine()
        held.close()
