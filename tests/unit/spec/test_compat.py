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
