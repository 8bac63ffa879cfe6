"""Names and paths: full-match validation (a trailing newline or '..' never passes)."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt import migrate, netpool, spec, validate

HOSTILE_NAMES = ["web1\n", "a\n", "../x", "..", ".", "a/b", "-a", "a b", "", "x" * 64, "a\0b", "\nweb1"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_vm_names_refused(name):
    with pytest.raises(SaltInvocationError, match="VM name"):
        validate.vm_name(name)


@pytest.mark.parametrize("name", ["a\n", "../x"])
def test_hostile_names_refused_for_every_kind(name):
    with pytest.raises(SaltInvocationError, match="network name"):
        netpool.network_spec(name)
    with pytest.raises(SaltInvocationError, match="pool name"):
        netpool.pool_spec(name, target="/srv/x")
    with pytest.raises(SaltInvocationError, match="VM name"):
        spec.build(name, 1, 64, disk=None, nic=None, images_dir="/srv/vms")
    with pytest.raises(SaltInvocationError, match="disk name"):
        spec.build("ok", 1, 64, disks=[{"name": name, "size": 1}], nic=None, images_dir="/srv/vms")
    with pytest.raises(SaltInvocationError, match="host name"):
        migrate.destination_uri(name)


def test_good_names_pass():
    assert validate.vm_name("web-1.example_2") == "web-1.example_2"
    assert validate.host_name("hv1.example.com") == "hv1.example.com"
    assert validate.host_name("fd00::1") == "fd00::1"
    with pytest.raises(SaltInvocationError):
        validate.host_name("hv1\n")
