"""saltvirt.vm.backup through the loader (``virt.backup``, ``backup_list``, ``backup_delete``,
``backup_prune``) on libvirt's test driver with real qcow2 files: a stopped VM is copied offline
with qemu-img (live backups need QEMU: tests/integration/test_backup_real.py)."""

import json
import os
import pathlib
import subprocess

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.vm import backup, backupstore
from tests.support.saltloader import SOURCES, make_minion_mods


def qemu_io(path, command, check=True):
    cmd = ["qemu-io", "-f", "qcow2", "-c", command, str(path)]
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


def read_pattern(path, pattern, offset, length):
    """True if ``length`` bytes at ``offset`` of the qcow2 image ``path`` all hold ``pattern``."""
    out = qemu_io(path, f"read -P {pattern} {offset} {length}", check=False)  # exit 1 on a mismatch
    return "Pattern verification failed" not in out and f"read {length}/{length}" in out


@pytest.fixture
def bk(tmp_path):
    """virt.* on test:///default with virt:backup:dir set; a stopped VM 'bk1' whose one disk holds data."""
    (tmp_path / SOURCES).mkdir()
    src = tmp_path / SOURCES / "src.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(src), "16M"], check=True)
    qemu_io(src, "write -P 0x11 0 1M")
    (tmp_path / "backups").mkdir()
    mods = make_minion_mods(tmp_path, "test:///default", backup={"dir": str(tmp_path / "backups")})
    conn = libvirt.open("test:///default")  # test:///default keeps its state while a connection is open
    mods["virt.init"]("bk1", 1, 64, image=str(src), nic=None, start=False, seed=False)
    yield mods, tmp_path
    for name in ("bk1", "bk1-copy"):
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            continue
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    conn.close()


def test_offline_full_backup_records_chain_checksums_and_xml(bk):
    v, tmp = bk
    made = v["virt.backup"]("bk1", incremental=True)
    assert made["type"] == "full" and made["chain"] == [made["id"]] and made["parent"] is None
    assert made["note"] == "no earlier backup of this VM: made a full one"
    assert made["live"] is False and made["consistency"] == backup.OFFLINE and made["checkpoint"] is None
    assert made["mode"] == "offline"
    directory = tmp / "backups" / "bk1" / v["virt.vm_info"]("bk1")["bk1"]["uuid"]  # by uuid below the name
    assert made["dir"] == str(directory)
    (disk,) = made["disks"]
    path = directory / disk["file"]
    assert disk["sha256"] == backupstore.file_digest(path) and disk["virtual_size"] == 16 << 20
    manifest = json.loads((directory / f"{made['id']}.json").read_text())
    assert "<name>bk1</name>" in manifest["domain_xml"] and manifest["size"] == os.path.getsize(path)
    owned = json.loads((directory / ".salt-virt.json").read_text())
    assert owned["vm"] == "bk1" and str(path) in owned["files"]
    # the copy holds the data (qemu-io reads the pattern back)
    assert read_pattern(path, "0x11", 0, 1048576)
    listed = v["virt.backup_list"]("bk1")
    assert [b["id"] for b in listed["backups"]] == [made["id"]]
    assert listed["incomplete"] == [] and listed["broken"] == {}


def test_second_backup_of_a_stopped_vm_is_full_and_says_why(bk):
    v, _tmp = bk
    first = v["virt.backup"]("bk1")
    second = v["virt.backup"]("bk1", incremental=True)
    assert second["type"] == "full" and second["id"] != first["id"]
    assert "stopped" in second["note"]
    assert [b["id"] for b in v["virt.backup_list"]("bk1")["backups"]] == [first["id"], second["id"]]


def test_interrupted_backup_is_not_valid_and_is_cleaned_up_by_the_next(bk):
    v, tmp = bk
    done = v["virt.backup"]("bk1")
    directory = pathlib.Path(done["dir"])
    # what a killed backup leaves: its disk file, recorded as owned, but no manifest
    half = directory / "20200101T000000Z.vda.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(half), "16M"], check=True)
    from saltvirt.storage import images

    images.record_owned(str(directory), "bk1", [str(half)])
    listed = v["virt.backup_list"]("bk1")
    assert [b["id"] for b in listed["backups"]] == [done["id"]] and listed["incomplete"] == ["20200101T000000Z"]
    again = v["virt.backup"]("bk1")
    assert again["removed_incomplete"] == [half.name] and not half.exists()
    # a file nobody recorded is never removed
    stray = directory / "20200101T000001Z.vda.qcow2"
    stray.write_bytes(b"not ours")
    v["virt.backup"]("bk1")
    assert stray.exists()


def test_delete_refuses_a_needed_backup_and_prune_keeps_chains(bk):
    v, _tmp = bk
    full = v["virt.backup"]("bk1")
    directory = pathlib.Path(full["dir"])
    # an incremental on top of it, as a live backup records it (made here by hand: no QEMU in unit tests)
    inc = make_incremental(directory, full, "20990101T000000Z")
    with pytest.raises(CommandExecutionError, match="is needed by 20990101T000000Z"):
        v["virt.backup_delete"]("bk1", full["id"])
    assert [b["id"] for b in v["virt.backup_list"]("bk1")["backups"]] == [full["id"], inc]
    plan = v["virt.backup_prune"]("bk1", keep=1, test=True)
    assert plan["kept"] == [full["id"], inc] and plan["pruned"] == []
    gone = v["virt.backup_delete"]("bk1", inc)
    assert gone["removed"] == [f"{inc}.json", f"{inc}.vda.qcow2"] and gone["kept"] == {}
    assert v["virt.backup_delete"]("bk1", full["id"])["removed"][0] == f"{full['id']}.json"
    assert v["virt.backup_list"]("bk1")["backups"] == []
    with pytest.raises(SaltInvocationError, match="invalid backup id"):
        v["virt.backup_delete"]("bk1", "../bk2/x")


def backup_key(directory):
    """The key the bk fixture's minion signs manifests with (made in its pki_dir; ``directory``: a VM's)."""
    return backupstore.manifest_key(None, str(pathlib.Path(directory).parents[2] / "pki"))


def make_incremental(directory, parent, bid):
    """An incremental backup file + manifest built on ``parent`` (what a live incremental leaves)."""
    pfile = parent["disks"][0]["file"]
    path = directory / f"{bid}.vda.qcow2"
    cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", pfile, str(path)]
    subprocess.run(cmd, check=True, cwd=directory)
    qemu_io(path, "write -P 0x22 0 64k")
    from saltvirt.storage import images

    images.record_owned(str(directory), "bk1", [str(path), str(directory / f"{bid}.json")])
    m = json.loads((directory / f"{parent['id']}.json").read_text())
    disk = dict(m["disks"][0], file=path.name, backing=pfile, sha256=backupstore.file_digest(path))
    m.update(id=bid, type="incremental", parent=parent["id"], chain=[parent["id"], bid], disks=[disk])
    m["finished"] = "2099-01-01T00:00:00Z"
    backupstore.write_manifest(str(directory), m, backup_key(directory))
    return bid


def test_callers_never_reach_outside_the_backup_dir(bk):
    v, _tmp = bk
    for target in ("../x", "/etc", "a/b"):
        with pytest.raises(SaltInvocationError):
            v["virt.backup"]("bk1", target=target)
    with pytest.raises(SaltInvocationError):
        v["virt.backup_list"]("../bk1")
    made = v["virt.backup"]("bk1", target="weekly")
    assert made["dir"].endswith(f"/backups/weekly/bk1/{v['virt.vm_info']('bk1')['bk1']['uuid']}")


def test_no_backup_dir_configured_is_refused(tmp_path):
    mods = make_minion_mods(tmp_path, "test:///default")
    with pytest.raises(CommandExecutionError, match="set virt:backup:dir in the minion config"):
        mods["virt.backup_list"]("bk1")


def test_unknown_or_unsupported_disk_is_refused(bk):
    v, _tmp = bk
    with pytest.raises(SaltInvocationError, match="has no disk 'vdz'"):
        v["virt.backup"]("bk1", disks="vdz")


def test_choose_disks_skips_cdroms_and_shared_disks():
    facts = {
        "name": "x",
        "disks": [
            {"target": "vda", "device": "disk", "type": "file", "readonly": False, "shareable": False, "file": "/a"},
            {"target": "sda", "device": "cdrom", "type": "file", "readonly": True, "shareable": False, "file": "/i"},
            {"target": "vdb", "device": "disk", "type": "file", "readonly": False, "shareable": True, "file": "/s"},
        ],
    }
    assert [d["target"] for d in backup.choose_disks(facts)] == ["vda"]
    with pytest.raises(SaltInvocationError, match="cannot be backed up"):
        backup.choose_disks(facts, ["vdb"])


def test_a_lost_checkpoint_is_redefined_only_with_libvirts_check_of_the_bitmaps():
    """A parent whose checkpoint metadata is gone (a migration): the redefinition always asks libvirt to
    validate the bitmaps in the disks; the test driver cannot (no QEMU), so the backup is full and says
    why. The redefinition itself, after a real live migration: tests/integration/test_backup_real.py."""
    conn = libvirt.open("test:///default")
    try:
        dom = conn.lookupByName("test")  # running, one disk vda
        parent = {
            "id": "20260101T020000Z",
            "uuid": dom.UUIDString(),
            "checkpoint": "salt-backup-20260101T020000Z",
            "started": "2026-01-01T02:00:00Z",
            "disks": [{"target": "vda"}],
        }
        chosen = [{"target": "vda", "format": "qcow2"}]
        got, note = backup.plan(dom, chosen, [parent], True, ["vda"])
        assert got is None
        assert note.startswith(
            "the checkpoint of backup 20260101T020000Z is gone from the VM and its bitmaps are not usable in the "
            "disks (libvirt: unsupported flags (0x4)"
        ), note
        assert backup._checkpoints(dom) == []  # nothing was redefined unchecked
        made_none = dict(parent, checkpoint=None)
        assert "and it made none to redefine" in backup.plan(dom, chosen, [made_none], True, ["vda"])[1]
    finally:
        conn.close()


def test_guest_freeze_decision_and_thaw_on_the_test_driver(bk):
    """The freeze/thaw decision logic. libvirt's test driver implements fsFreeze/fsThaw itself (it
    counts the filesystems it froze; no guest agent is involved), so no mock is needed. The real agent
    in a real guest: tests/integration/test_backup_real.py (the busybox guest's qemu-ga variant)."""
    conn = libvirt.open("test:///default")
    try:
        dom = conn.lookupByName("test")  # running
        assert backup._freeze(dom, {"guest_agent": None}) == (None, backup.CRASH)  # no agent channel
        assert backup._freeze(dom, {"guest_agent": "disconnected"}) == (None, backup.CRASH)  # agent not up
        assert dom.fsThaw() == 0  # neither asked for a freeze
        assert backup._freeze(dom, {"guest_agent": "connected"}) == (2, backup.CONSISTENT)  # the count
        assert dom.fsThaw() == 2  # frozen by _freeze: thawed here
        # an agent that does not freeze (here: a stopped VM) gives a crash-consistent backup, not a failure
        assert backup._freeze(conn.lookupByName("bk1"), {"guest_agent": "connected"}) == (None, backup.CRASH)
        # the backup job does not start (the test driver has none): the guest is thawed all the same
        facts = {"guest_agent": "connected", "disks": [{"target": "vda", "device": "disk"}]}
        chosen = [{"target": "vda", "format": "qcow2"}]
        with pytest.raises(CommandExecutionError, match="start the backup of VM 'test'"):
            backup._live(dom, facts, chosen, {"vda": "/nonexistent/x.qcow2"}, None, None, 60, None)
        assert dom.fsThaw() == 0  # already thawed by _live
    finally:
        conn.close()


def test_a_refused_pull_job_falls_back_to_push_and_leaves_no_socket(caplog, tmp_path, monkeypatch):
    """libvirt's test driver refuses every backup job (it runs none): the pull job's refusal is logged and
    push mode is tried (refused too, so the backup fails); the socket directory and scratch files go."""
    made = []
    real_mkdtemp = backup.backuppull.tempfile.mkdtemp
    monkeypatch.setattr(backup.backuppull.tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    conn = libvirt.open("test:///default")
    try:
        dom = conn.lookupByName("test")
        facts = {"guest_agent": None, "disks": [{"target": "vda", "device": "disk"}]}
        chosen = [{"target": "vda", "format": "qcow2", "file": str(tmp_path / "disk.qcow2")}]
        files = {"vda": str(tmp_path / "1.vda.qcow2")}
        with caplog.at_level("WARNING"), pytest.raises(CommandExecutionError, match="start the backup"):
            backup._live(dom, facts, chosen, files, None, None, 60, None, mode="pull")
        assert "pull-mode backup refused" in caplog.text and "push mode" in caplog.text
        assert made and not os.path.exists(made[0]) and os.listdir(tmp_path) == []
        caplog.clear()
        with caplog.at_level("WARNING"), pytest.raises(CommandExecutionError, match="start the backup"):
            backup._live(dom, facts, chosen, files, None, None, 60, None, mode="push")
        assert "pull-mode" not in caplog.text and len(made) == 1  # push mode asks for no socket
    finally:
        conn.close()


def test_a_new_vm_with_the_name_of_a_purged_one_backs_up_fine(bk):
    """Backups are kept by VM uuid below the name: a purged VM's backups never block a later VM of its name
    (whoever made it), and stay listed and restorable beside the new one's."""
    v, tmp = bk
    old_uuid = v["virt.vm_info"]("bk1")["bk1"]["uuid"]
    old = v["virt.backup"]("bk1")
    v["virt.purge"]("bk1")
    v["virt.init"]("bk1", 1, 64, image=str(tmp / SOURCES / "src.qcow2"), nic=None, start=False, seed=False)
    new_uuid = v["virt.vm_info"]("bk1")["bk1"]["uuid"]
    new = v["virt.backup"]("bk1", incremental=True)
    assert new["type"] == "full" and new["note"] == "no earlier backup of this VM: made a full one"
    assert (old["dir"], new["dir"]) == (
        str(tmp / "backups" / "bk1" / old_uuid),
        str(tmp / "backups" / "bk1" / new_uuid),
    )
    listed = v["virt.backup_list"]("bk1")
    assert [(b["id"], b["uuid"]) for b in listed["backups"]] == [(old["id"], old_uuid), (new["id"], new_uuid)]
    assert v["virt.restore"]("bk1", old["id"], as_name="bk1-copy")["chain"] == [old["id"]]
    assert v["virt.backup_prune"]("bk1", keep=1)["pruned"] == []  # each VM keeps its own newest


def with_disks(name, *disks):
    """Add ``disks`` (``<disk>`` XML) to VM ``name`` on test:///default, as an operator's virsh would."""
    conn = libvirt.open("test:///default")
    xml = conn.lookupByName(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    conn.defineXML(xml.replace("</devices>", "".join(disks) + "</devices>", 1))
    conn.close()


POOL_DISK = (
    "<disk type='volume' device='disk'><driver name='qemu' type='raw'/><source pool='{pool}' volume='{volume}'/>"
    "<target dev='vdb' bus='virtio'/></disk>"
)
SHARED = (
    "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{path}'/>"
    "<target dev='vdc' bus='virtio'/><shareable/></disk>"
)
CDROM = (
    "<disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='{path}'/>"
    "<target dev='sda' bus='sata'/><readonly/></disk>"
)


def test_the_result_says_which_disks_a_backup_does_not_hold_and_why(bk):
    """A pool volume is never copied: the result, the manifest and the listing say so, per disk."""
    v, _tmp = bk
    with_disks("bk1", POOL_DISK.format(pool="default-pool", volume="data"), CDROM.format(path="/srv/x.iso"))
    made = v["virt.backup"]("bk1")
    want = {
        "vdb": "a volume of pool default-pool (data): not backed up (file disks only; back the pool up)",
        "sda": "a cdrom: not backed up",
    }
    assert [d["target"] for d in made["disks"]] == ["vda"] and made["skipped"] == want
    assert v["virt.backup_list"]("bk1")["backups"][0]["skipped"] == want
    assert v["virt.backup"]("bk1", disks="vda")["skipped"] == want  # asked for vda alone: the same


class EndingJob:
    """A domain whose backup job ends after ``polls`` looks. libvirt's test driver has no backup jobs
    (backupBegin needs QEMU), so this stands in for the two calls _wait_job makes; the real job:
    tests/integration/test_backup_real.py."""

    def __init__(self, polls):
        self.polls = polls

    def name(self):
        return "vm"

    def jobInfo(self):
        self.polls -= 1
        return [libvirt.VIR_DOMAIN_JOB_NONE if self.polls < 0 else libvirt.VIR_DOMAIN_JOB_BOUNDED]

    def jobStats(self, flags):
        return {"operation": libvirt.VIR_DOMAIN_JOB_OPERATION_BACKUP, "success": True}


def test_a_short_backup_job_is_seen_ending_within_tens_of_ms_not_a_fixed_200(monkeypatch):
    slept = []
    monkeypatch.setattr(backup.time, "sleep", slept.append)
    backup._wait_job(EndingJob(3), timeout=60)
    assert slept == [0.01, 0.02, 0.04]  # the old loop: 0.2 each time
    slept.clear()
    backup._wait_job(EndingJob(9), timeout=60)
    assert slept == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2, 0.2, 0.2]  # a long job: 5 looks a second


def test_describing_backup_files_runs_no_qemu_img_info_and_hashes_each_disk_once(tmp_path, monkeypatch):
    files = {}
    for target, size in (("vda", "5M"), ("vdb", "7M")):
        files[target] = str(tmp_path / f"b.{target}.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", files[target], size], check=True)
        qemu_io(files[target], f"write -P 0x{len(files)}1 0 1M")

    def no_info(*args, **kwargs):
        raise AssertionError("qemu-img info is not needed: the header has the size")

    monkeypatch.setattr(backup.images, "image_info", no_info)
    chosen = [{"target": t, "file": f"/src/{t}", "format": "qcow2"} for t in files]
    out = backup._describe_disks(str(tmp_path), chosen, files, None)
    assert [(d["target"], d["virtual_size"]) for d in out] == [("vda", 5 << 20), ("vdb", 7 << 20)]
    assert [d["sha256"] for d in out] == [backupstore.file_digest(files[t]) for t in files]
    assert all(d["backing"] is None and d["size"] == os.stat(files[d["target"]]).st_size for d in out)
