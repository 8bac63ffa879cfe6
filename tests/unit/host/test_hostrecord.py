"""saltvirt.host.hostrecord on libvirt's test driver: two file-based test:/// connections are two hosts."""

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import hostrecord
from saltvirt.xml.domain import metadata
from tests.support.paths import TEST_NODE_XML


def xml(name, disk, uuid="3f6ba1d4-1111-4c1b-9a40-0123456789ab", ro=None):
    extra = f"<disk type='file' device='cdrom'><source file='{ro}'/><target dev='hdc'/><readonly/></disk>" if ro else ""
    return (
        f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>128</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type></os><devices>"
        f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk}'/>"
        f"<target dev='vda' bus='virtio'/></disk>{extra}</devices></domain>"
    )


@pytest.fixture
def storage(tmp_path):
    shared, local = tmp_path / "shared", tmp_path / "local"
    shared.mkdir()
    local.mkdir()
    (shared / "web1.qcow2").write_bytes(b"x")
    (local / "db1.qcow2").write_bytes(b"x")
    return shared, local


def test_record_keeps_definitions_and_marks_the_storage(test_conn, storage, tmp_path):
    shared, local = storage
    test_conn.defineXML(xml("web1", shared / "web1.qcow2"))
    test_conn.defineXML(xml("db1", local / "db1.qcow2", uuid="3f6ba1d4-2222-4c1b-9a40-0123456789ab"))
    rec = hostrecord.record(test_conn, str(local), [str(shared)])
    web = rec["vms"]["web1"]
    assert web["uuid"] == "3f6ba1d4-1111-4c1b-9a40-0123456789ab" and web["mem"] == 128 and "<domain" in web["xml"]
    assert web["disks"] == [
        {"target": "vda", "path": str(shared / "web1.qcow2"), "type": "file", "readonly": False, "root": str(shared)}
    ]
    token = (shared / hostrecord.MARKER).read_text()
    assert rec["storage"][str(shared)] == {"path": str(shared / hostrecord.MARKER), "token": token}
    # written once: a second record (or another host) reads the same token
    assert hostrecord.record(test_conn, str(local), [str(shared)])["storage"][str(shared)]["token"] == token


def test_record_keeps_the_owner_and_the_ha_flag(test_conn, storage, tmp_path):
    """Automatic HA trusts a VM's group and HA flag only from the operator's VMs unless told otherwise: the record
    says whose, and whether it is flagged HA."""
    shared, local = storage
    meta = (
        f"<metadata><sv:vm xmlns:sv='{metadata.METADATA_NS}'><sv:owner tenant='t1' creator='alice'/>"
        "<sv:ha>true</sv:ha></sv:vm></metadata>"
    )
    test_conn.defineXML(xml("web1", shared / "web1.qcow2").replace("<os>", meta + "<os>"))
    test_conn.defineXML(xml("db1", local / "db1.qcow2", uuid="3f6ba1d4-2222-4c1b-9a40-0123456789ab"))
    vms = hostrecord.record(test_conn, str(local), [str(shared)])["vms"]
    assert vms["web1"]["owner"] == {"tenant": "t1", "creator": "alice"}
    assert vms["db1"]["owner"] is None
    assert vms["web1"]["ha"] is True and vms["db1"]["ha"] is False  # a dead host's HA VMs: from this record


def test_a_disk_outside_the_roots_is_flagged(test_conn, tmp_path):
    test_conn.defineXML(xml("odd", "/var/lib/elsewhere/odd.qcow2"))
    rec = hostrecord.record(test_conn, str(tmp_path), [])
    assert "outside virt:images and virt:allowed_paths" in rec["vms"]["odd"]["disks"][0]["why"]


def test_restart_on_another_host_only_where_it_sees_the_same_storage(test_conn, storage, tmp_path):
    shared, local = storage
    test_conn.defineXML(xml("web1", shared / "web1.qcow2"))
    test_conn.defineXML(xml("db1", local / "db1.qcow2", uuid="3f6ba1d4-2222-4c1b-9a40-0123456789ab"))
    rec = hostrecord.record(test_conn, str(local), [str(shared)])
    other = libvirt.open(f"test://{TEST_NODE_XML}")  # a second host: its own state
    try:
        other_images = tmp_path / "other-images"
        other_images.mkdir()
        checks = hostrecord.check_all(
            {n: v["xml"] for n, v in rec["vms"].items()}, rec["storage"], str(other_images), [str(shared)]
        )
        assert checks["web1"] == []
        assert "outside the directories salt-virt may use" in checks["db1"][0]
        done = hostrecord.restart(
            other, "web1", rec["vms"]["web1"]["xml"], rec["storage"], str(other_images), [str(shared)]
        )
        assert done["state"] == "running" and done["uuid"] == rec["vms"]["web1"]["uuid"]
        with pytest.raises(CommandExecutionError, match="already defined"):
            hostrecord.restart(
                other, "web1", rec["vms"]["web1"]["xml"], rec["storage"], str(other_images), [str(shared)]
            )
        with pytest.raises(CommandExecutionError, match="cannot restart 'db1'"):
            hostrecord.restart(other, "db1", rec["vms"]["db1"]["xml"], rec["storage"], str(other_images), [str(shared)])
        assert [d.name() for d in other.listAllDomains(0) if d.name() == "db1"] == []
    finally:
        other.close()


def test_same_path_other_storage_is_not_shared(storage, tmp_path):
    shared, _local = storage
    recorded = {str(shared): {"path": str(shared / hostrecord.MARKER), "token": "aaaa"}}
    (shared / hostrecord.MARKER).write_text("bbbb")  # another filesystem at the same path: its own marker
    facts = {
        "disks": [
            {"target": "vda", "file": str(shared / "web1.qcow2"), "type": "file", "readonly": False, "device": "disk"}
        ],
        "boot": {"kernel": str(tmp_path / "missing-vmlinuz")},
    }
    reasons = hostrecord.check(facts, recorded, [str(shared), str(tmp_path)])
    assert "does not see the down host's storage there" in reasons[0] and "not shared" in reasons[0]
    assert "kernel/initrd" in reasons[1]
    facts["disks"], facts["boot"] = [], {"kernel": "/etc/shadow"}  # a recorded definition never names host files
    assert "is outside the directories salt-virt may use" in hostrecord.check(facts, recorded, [str(shared)])[0]


def test_hostile_restart_input(test_conn, tmp_path):
    with pytest.raises(SaltInvocationError, match="does not parse"):
        hostrecord.restart(test_conn, "web1", "<domain", {}, str(tmp_path))
    with pytest.raises(SaltInvocationError, match="defines 'other'"):
        hostrecord.restart(test_conn, "web1", xml("other", tmp_path / "x"), {}, str(tmp_path))
    with pytest.raises(SaltInvocationError):
        hostrecord.restart(test_conn, "../x", xml("../x", tmp_path / "x"), {}, str(tmp_path))


def test_probe_reports_unreachable(tmp_path):
    ans = hostrecord.probe(f"qemu+unix:///system?socket={tmp_path}/nothing-listens", wait=10)
    assert ans["reachable"] is False and ans["down"] == "refused" and "nothing-listens" in ans["error"]
    assert hostrecord.probe(f"test://{TEST_NODE_XML}")["reachable"] is True
    with pytest.raises(SaltInvocationError, match="libvirt URI"):
        hostrecord.probe("hv1")


def test_probe_counts_only_refused_and_timeout_as_down(tmp_path):
    import socket

    with socket.socket() as srv:  # a port nothing listens on: bound, never listening -> refused
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        ans = hostrecord.probe(f"qemu+tcp://127.0.0.1:{port}/system", wait=10)
    assert ans["reachable"] is False and ans["down"] == "refused" and "Connection refused" in ans["error"]
    with socket.socket() as srv:  # listening, never answering: a hung libvirtd is a timeout
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        ans = hostrecord.probe(f"qemu+tcp://127.0.0.1:{srv.getsockname()[1]}/system", wait=1)
    assert ans == {"uri": ans["uri"], "reachable": False, "down": "timeout", "error": "no answer within 1 s"}
    # errors on the checking side say nothing about the peer: not down
    for uri, why in (
        (f"qemu+tls://127.0.0.1/system?pkipath={tmp_path}/no-pki", "Cannot read CA certificate"),
        ("qemu+tcp://no-such-host.invalid/system", "Unable to resolve address"),
    ):
        ans = hostrecord.probe(uri, wait=10)
        assert ans["reachable"] is None and "down" not in ans and why in ans["error"], ans


def test_where_and_disarm(test_conn, tmp_path):
    uuid = "3f6ba1d4-1111-4c1b-9a40-0123456789ab"
    dom = test_conn.defineXML(xml("web1", tmp_path / "w.qcow2", uuid=uuid))
    dom.setAutostart(1)
    seen = [{"name": "web1", "uuid": uuid, "state": "shutoff", "autostart": True}]
    assert hostrecord.where(test_conn, "web1") == seen
    assert hostrecord.where(test_conn, "renamed", uuid) == seen  # by UUID, whatever its name now
    assert hostrecord.where(test_conn, "other", "3f6ba1d4-0000-4c1b-9a40-0123456789ab") == []
    assert hostrecord.disarm(test_conn, ["web1", "absent"]) == {"web1": True}
    assert dom.autostart() == 0 and hostrecord.disarm(test_conn, ["web1"]) == {"web1": False}
    with pytest.raises(SaltInvocationError):
        hostrecord.where(test_conn, "../x")


def test_module_functions_through_salts_loader(virt_test, tmp_path):
    funs = (
        "recovery_record",
        "recovery_probe",
        "recovery_check",
        "recovery_restart",
        "recovery_where",
        "recovery_disarm",
    )
    for fun in funs:
        assert f"virt.{fun}" in virt_test and "CLI Example" in virt_test[f"virt.{fun}"].__doc__
    rec = virt_test["virt.recovery_record"]()
    assert rec["vms"]["test"]["uuid"] and "<domain" in rec["vms"]["test"]["xml"]
    # a call's probe URI is a plain remote system daemon (issue 23): nothing listens on port 1
    assert virt_test["virt.recovery_probe"]("hv2", uri="qemu+tcp://127.0.0.1:1/system")["reachable"] is False
    # the test driver's own domain has its disk at /guest/diskimage1: outside this host's directories
    checked = virt_test["virt.recovery_check"]({"test": rec["vms"]["test"]["xml"]}, rec["storage"])
    assert "/guest/diskimage1 is outside the directories salt-virt may use" in checked["test"][0]
    with pytest.raises(CommandExecutionError, match="already defined"):
        virt_test["virt.recovery_restart"]("test", rec["vms"]["test"]["xml"], rec["storage"])


def test_a_probe_uri_given_by_the_master_uses_this_hosts_client_certificate(tmp_path):
    """Issue 36 (seen with Salt's ``qemu+tls://HOST/system`` migration form): the master's
    ``virt:recovery:probe_uri`` reached libvirt without this hypervisor's ``virt:migration:pkipath``, so a
    host whose client files are elsewhere probed with /etc/pki's and could call a live peer unreachable."""
    from tests.support.saltloader import make_minion_mods

    pki = tmp_path / "pki dir"
    mods = make_minion_mods(tmp_path, "test:///default", migration={"pkipath": str(pki)})
    tls = mods["virt.recovery_probe"]("hv2", uri="qemu+tls://127.0.0.1:1/system", wait=2)
    assert tls["uri"] == "qemu+tls://127.0.0.1:1/system?pkipath=" + str(pki).replace(" ", "%20"), tls
    assert tls["reachable"] is not True and "pki dir" in tls["error"], tls  # the files it read: this host's
    tcp = mods["virt.recovery_probe"]("hv2", uri="qemu+tcp://127.0.0.1:1/system", wait=2)
    assert tcp["uri"] == "qemu+tcp://127.0.0.1:1/system", tcp  # no TLS: nothing to add
