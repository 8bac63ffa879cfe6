"""saltvirt.spec.compat: Salt's old spellings (config keys, arguments, URI migration targets)."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.spec import compat


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
