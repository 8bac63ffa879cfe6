"""saltvirt.host.hosttype on a real libvirtd: the kvm probe against a real kvm boot, detect() on hv1."""

from saltvirt.host import hosttype
from tests.support import lab
from tests.support.spies import Counting


def test_probe_verdict_matches_a_real_kvm_boot(hv1, guest, tmp_path):
    """Ground truth: boot the test guest with type='kvm'. The probe must say kvm works exactly when
    the guest really boots (on this machine's nested KVM it does not: the probe must say qemu)."""
    import libvirt

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


def test_detect_on_real_libvirtd(hv1, tmp_path):
    import libvirt

    conn = libvirt.open(hv1.uri)
    try:
        kind = hosttype.detect(conn)
        assert kind["type"] == ("kvm" if hosttype.probe_kvm()[0] else "qemu")
        assert hosttype.detect(conn, "kvm")["type"] == "kvm"
        # kept on disk (issue #40): the next job's process asks neither for the capabilities nor KVM
        cache = str(tmp_path / "saltvirt")
        assert hosttype.detect(conn, cache_dir=cache) == kind
        spy = Counting(conn)
        assert hosttype.detect(spy, cache_dir=cache) == kind
        assert "getCapabilities" not in spy.calls and "getVersion" in spy.calls, spy.calls
    finally:
        conn.close()
