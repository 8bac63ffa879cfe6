"""kvm vs qemu: libvirt's capabilities plus a real probe of /dev/kvm (runs guest code in a child)."""

import os

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt import hosttype

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


def test_detect_on_test_driver_and_override(test_conn):
    assert hosttype.detect(test_conn)["type"] == "test"
    assert hosttype.detect(test_conn, "qemu") == {
        "type": "qemu",
        "reason": "set by configuration (virt:type) or argument",
    }
    with pytest.raises(SaltInvocationError, match="not one of"):
        hosttype.detect(test_conn, "xen")


def test_probe_verdict_matches_a_real_kvm_boot(hv1, guest, tmp_path):
    """Ground truth: boot the test guest with type='kvm'. The probe must say kvm works exactly when
    the guest really boots (on this machine's nested KVM it does not: the probe must say qemu)."""
    import libvirt

    import lab

    log = tmp_path / "kvm-serial.log"
    xml = f"""<domain type='kvm'><name>kvmprobe</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>
      <os><type arch='x86_64'>hvm</type><kernel>{guest["kernel"]}</kernel><initrd>{guest["initrd"]}</initrd>
      <cmdline>console=ttyS0 quiet</cmdline></os><features><acpi/></features><devices>
      <serial type='pty'><log file='{log}' append='on'/><target port='0'/></serial>
      <memballoon model='none'/></devices></domain>"""
    conn = libvirt.open(hv1.uri)
    try:
        dom = conn.createXML(xml, 0)
    except libvirt.libvirtError as exc:  # no usable kvm at all
        booted = False
        assert not hosttype.probe_kvm()[0], exc
    else:
        try:
            lab.wait_for_text(str(log), "GUEST-BOOT-OK", timeout=15)
            booted = True
        except AssertionError:
            booted = False
        finally:
            dom.destroy()
    finally:
        conn.close()
    ok, reason = hosttype.probe_kvm()
    assert ok is booted, f"probe says kvm usable={ok} ({reason}) but a kvm guest booted={booted}"


def test_detect_on_real_libvirtd(hv1):
    import libvirt

    conn = libvirt.open(hv1.uri)
    try:
        kind = hosttype.detect(conn)
        assert kind["type"] == ("kvm" if hosttype.probe_kvm()[0] else "qemu")
        assert hosttype.detect(conn, "kvm")["type"] == "kvm"
    finally:
        conn.close()
