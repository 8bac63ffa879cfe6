"""kvm vs qemu: libvirt's capabilities plus a real probe of /dev/kvm (runs guest code in a child)."""

import os

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import hosttype
from tests.support.spies import Counting

CAPS = """<capabilities><host/>
<guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/><domain type='kvm'/></arch></guest>
<guest><os_type>hvm</os_type><arch name='i686'><domain type='qemu'/></arch></guest>
</capabilities>"""


def test_capability_types_per_arch():
    assert hosttype.capability_types(CAPS, "x86_64") == ["qemu", "kvm"]
    assert hosttype.capability_types(CAPS, "i686") == ["qemu"]
    assert hosttype.capability_types(CAPS, "aarch64") == []


@pytest.mark.parametrize(
    "uri, local",
    [
        (None, True),
        ("qemu:///system", True),
        ("qemu+unix:///system?socket=/run/x", True),
        ("qemu+tcp://hyper2/system", False),
        ("qemu+tls://hyper2/system", False),
        ("qemu+ssh://root@hyper2/system", False),
    ],
)
def test_local_uri(uri, local):
    assert hosttype.is_local_uri(uri) is local


def test_probe_gives_a_verdict_with_a_reason():
    ok, reason = hosttype.probe_kvm()
    assert isinstance(ok, bool) and reason
    if not os.path.exists("/dev/kvm"):
        assert not ok and "/dev/kvm" in reason


def test_the_probe_runs_where_saltvirt_is_not_on_the_path(monkeypatch, tmp_path):
    """A minion gets saltvirt through saltutil.sync_all (its extension modules' directory), not installed:
    the probe's child must find it all the same, or every host would be taken for TCG."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(tmp_path)
    ok, reason = hosttype.probe_kvm()
    assert not reason.startswith("the KVM probe failed"), reason


def test_detect_on_test_driver_and_override(test_conn):
    assert hosttype.detect(test_conn)["type"] == "test"
    assert hosttype.detect(test_conn, "qemu") == {
        "type": "qemu",
        "reason": "set by configuration (virt:type) or argument",
    }
    with pytest.raises(SaltInvocationError, match="not one of"):
        hosttype.detect(test_conn, "xen")


def test_a_given_type_needs_no_capabilities_rpc(test_conn):
    """virt:type / vtype given: no getCapabilities round trip per init (a spy over the real connection)."""

    spy = Counting(test_conn)
    assert hosttype.detect(spy, "kvm")["type"] == "kvm" and spy.calls == []
    with pytest.raises(SaltInvocationError, match="not one of"):  # another name: checked against libvirt's offer
        hosttype.detect(spy, "xen")
    assert spy.calls == ["getCapabilities"]
