"""The detected domain type kept on disk (issue #40): a minion forks a process per job, so without it every
``virt.init`` asked libvirt for its capabilities and ran the KVM probe's child again (~80 ms)."""

import json
import os
import pathlib
import stat

import pytest

from saltvirt.host import hosttype


class QemuLike:
    """The test driver's connection answering as a local QEMU libvirtd would: a real QEMU libvirtd cannot
    run in unit tests (tests/integration/test_hosttype.py checks the cache against one). Every libvirt
    call made through it is counted."""

    def __init__(self, conn, emulator, uri="qemu:///system"):
        self.conn, self.uri, self.version, self.calls = conn, uri, 8002000, []
        self.caps = f"""<capabilities><host/><guest><os_type>hvm</os_type><arch name='x86_64'>
          <emulator>{emulator}</emulator><domain type='qemu'/><domain type='kvm'/></arch></guest></capabilities>"""

    def getType(self):
        self.calls.append("getType")
        return "QEMU"

    def getURI(self):
        return self.uri

    def getCapabilities(self):
        self.calls.append("getCapabilities")
        return self.caps

    def getVersion(self):
        self.calls.append("getVersion")
        return self.version

    def getLibVersion(self):
        self.calls.append("getLibVersion")
        return self.conn.getLibVersion()


@pytest.fixture
def host(test_conn, tmp_path, monkeypatch):
    """A QEMU-like connection, KVM's files and the boot id in tmp_path, the real probe behind a counter."""
    emulator = tmp_path / "qemu-system-x86_64"
    emulator.write_text("v1")
    kvm = tmp_path / "kvm"
    kvm.write_text("")
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(hosttype, "KVM_PATHS", (str(kvm), str(tmp_path / "kvm_intel")))
    monkeypatch.setattr(hosttype, "BOOT_ID", str(boot))
    probes = []
    real = hosttype.probe_kvm

    def counted():
        probes.append(1)
        return real()

    monkeypatch.setattr(hosttype, "probe_kvm", counted)
    cache = tmp_path / "cache" / "saltvirt"
    return {"conn": QemuLike(test_conn, emulator), "probes": probes, "cache": str(cache), "tmp": tmp_path}


def detect(h):
    h["conn"].calls.clear()
    n = len(h["probes"])
    kind = hosttype.detect(h["conn"], cache_dir=h["cache"])
    return kind, "getCapabilities" in h["conn"].calls, len(h["probes"]) > n


def test_the_answer_is_kept_for_the_next_process(host):
    first, asked, probed = detect(host)
    assert asked and probed and first["type"] in ("kvm", "qemu")
    again, asked, probed = detect(host)  # the next job's process: no memo of its own
    assert again == first and not asked and not probed, host["conn"].calls
    path = os.path.join(host["cache"], hosttype.CACHE_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(host["cache"]).st_mode) == 0o700


def _newer_qemu(h):
    h["conn"].version += 1


def _qemu_replaced(h):
    path = h["tmp"] / "qemu-system-x86_64"
    path.unlink()
    path.write_text("v2")  # a package upgrade: a new file


def _kvm_module_loaded(h):
    (h["tmp"] / "kvm_intel").mkdir()


def _kvm_device_gone(h):
    (h["tmp"] / "kvm").unlink()


def _rebooted(h):
    (h["tmp"] / "boot_id").write_text("boot-2\n")


def _rewrite(h, change):
    path = pathlib.Path(h["cache"], hosttype.CACHE_FILE)
    data = json.loads(path.read_text())
    for entry in data.values():
        change(entry)
    path.write_text(json.dumps(data))


def _an_hour_old(h):
    _rewrite(h, lambda entry: entry.update(at=entry["at"] - hosttype.CACHE_MAX_AGE - 1))


@pytest.mark.parametrize(
    "change", [_newer_qemu, _qemu_replaced, _kvm_module_loaded, _kvm_device_gone, _rebooted, _an_hour_old]
)
def test_a_changed_host_is_asked_again(host, change):
    """A stale answer must never choose the type: whatever it rests on changed, libvirt and KVM are asked."""
    detect(host)
    change(host)
    _kind, asked, probed = detect(host)
    assert asked and probed
    _kind, asked, probed = detect(host)  # and the fresh answer is kept
    assert not asked and not probed


def test_an_answer_others_could_write_is_not_used(host):
    detect(host)
    path = os.path.join(host["cache"], hosttype.CACHE_FILE)
    os.chmod(path, 0o644)
    _kind, asked, probed = detect(host)
    assert asked and probed
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # rewritten ours alone
    os.chmod(host["cache"], 0o777)
    _kind, asked, _probed = detect(host)
    assert asked  # nor in a directory others can write to
    _kind, asked, _probed = detect(host)
    assert asked  # and nothing is written there either


def test_a_cached_answer_names_only_a_valid_type(host):
    detect(host)
    _rewrite(host, lambda entry: entry["answer"].update(type="xen"))
    kind, asked, _probed = detect(host)
    assert asked and kind["type"] in ("kvm", "qemu")


def test_a_remote_libvirtd_is_asked_every_time(host):
    """Nothing of a remote host can be checked from here: no answer kept for it."""
    host["conn"].uri = "qemu+tls://hyper2/system"
    for _ in range(2):
        kind, asked, probed = detect(host)
        assert kind["type"] == "kvm" and asked and not probed
    assert not os.path.exists(os.path.join(host["cache"], hosttype.CACHE_FILE))


def test_without_a_cache_dir_nothing_is_kept(host):
    host["conn"].calls.clear()
    hosttype.detect(host["conn"])
    hosttype.detect(host["conn"])
    assert host["conn"].calls.count("getCapabilities") == 2
    assert not os.path.exists(host["cache"])


def test_a_driver_without_a_version_is_asked_every_time(host):
    """No fingerprint, no cache: the init goes on as before (the test driver's own getVersion is real)."""

    def no_version():
        import libvirt

        raise libvirt.libvirtError("this hypervisor does not support this function")

    host["conn"].getVersion = no_version
    for _ in range(2):
        kind, asked, probed = detect(host)
        assert kind["type"] in ("kvm", "qemu") and asked and probed
    assert not os.path.exists(os.path.join(host["cache"], hosttype.CACHE_FILE))


def test_a_device_node_counts_by_who_may_open_it(host, monkeypatch):
    """/dev/kvm: a chmod that changes nothing (scripts/setup.sh's, each run) keeps the answer; one that changes
    who may open it does not."""
    node = host["tmp"] / "kvm-node"
    os.mknod(node, 0o660 | stat.S_IFCHR, os.makedev(10, 232))
    os.chmod(node, 0o660)  # past the umask
    monkeypatch.setattr(hosttype, "KVM_PATHS", (str(node),))
    detect(host)
    os.chmod(node, 0o660)  # its ctime moves, nothing else
    _kind, asked, probed = detect(host)
    assert not asked and not probed
    os.chmod(node, 0o600)
    _kind, asked, probed = detect(host)
    assert asked and probed
