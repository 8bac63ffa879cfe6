"""saltvirt.vm.backupstore: the backup directory, manifests, chains, verification and retention."""

import datetime
import os
import shutil
import subprocess

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.vm import backupstore as store

KEY = b"k" * 32  # a hypervisor's backup key (backupstore.manifest_key)


def manifest(bid, parent=None, chain=None, finished=None, target="vda"):
    return {
        "format": store.MANIFEST_FORMAT,
        "id": bid,
        "parent": parent,
        "chain": chain or [bid],
        "finished": finished or f"{bid[:4]}-{bid[4:6]}-{bid[6:8]}T{bid[9:11]}:{bid[11:13]}:{bid[13:15]}Z",
        "disks": [{"target": target, "file": f"{bid}.{target}.qcow2"}],
    }


def chain(*spec):
    """Manifests from ``(id, parent)`` pairs (the chain follows the parents)."""
    out, by_id = [], {}
    for bid, parent in spec:
        m = manifest(bid, parent, (by_id[parent]["chain"] if parent else []) + [bid])
        by_id[bid] = m
        out.append(m)
    return out


U1 = "0f3c2a44-1b5e-4e0c-9a8f-1234567890ab"
U2 = "11111111-2222-4333-8444-555555555555"


def test_vm_dir_stays_inside_the_root(tmp_path):
    assert store.vm_dir(str(tmp_path), "web1", U1, create=True) == str(tmp_path / "web1" / U1)
    assert store.vm_dir(str(tmp_path), "web1", U1, "weekly", create=True) == str(tmp_path / "weekly" / "web1" / U1)
    assert (tmp_path / "weekly" / "web1" / U1).is_dir()
    for vm, uuid, target in (("../x", U1, None), ("web1", U1, ".."), ("web1", U1, "a/b"), ("web1\n", U1, None)):
        with pytest.raises(SaltInvocationError):
            store.vm_dir(str(tmp_path), vm, uuid, target)
    for uuid in ("..", "../web2", U1.upper(), "x", None):
        with pytest.raises(SaltInvocationError, match="invalid VM uuid"):
            store.vm_dir(str(tmp_path), "web1", uuid)
    os.symlink("/etc", tmp_path / "evil")  # a symlink planted in the backup dir leads nowhere
    with pytest.raises(SaltInvocationError, match="escapes"):
        store.vm_dir(str(tmp_path), "evil", U1)


def test_each_vm_of_a_name_has_its_own_directory_and_ids_stay_unique_per_name(tmp_path):
    root = str(tmp_path)
    first, second = (store.vm_dir(root, "web1", u, create=True) for u in (U1, U2))
    os.mkdir(tmp_path / "web1" / "not-a-uuid")
    assert store.vm_dirs(root, "web1") == sorted([first, second]) and store.vm_dirs(root, "web2") == []
    store.write_manifest(first, manifest("20260101T000000Z"), KEY)
    assert store.taken_ids(root, "web1") == {"20260101T000000Z"}
    assert store.find(root, "web1", "20260101T000000Z") == first
    with pytest.raises(SaltInvocationError, match="VM web1 has no backup 20260102T000000Z in "):
        store.find(root, "web1", "20260102T000000Z")
    weekly = store.vm_dir(root, "web2", U2, "weekly", create=True)
    os.makedirs(tmp_path / "junk name" / U1)  # written by hand: passed over, never an error
    assert store.every_vm_dir(root) == [first, second, weekly]
    store.write_manifest(second, manifest("20260101T000000Z"), KEY)  # what only a hand could do
    with pytest.raises(CommandExecutionError, match="is in several VM directories"):
        store.find(root, "web1", "20260101T000000Z")


def test_root_dir_must_be_configured_and_exist(tmp_path):
    with pytest.raises(CommandExecutionError, match="set virt:backup:dir"):
        store.root_dir(None)
    with pytest.raises(CommandExecutionError, match="does not exist"):
        store.root_dir(str(tmp_path / "nope"))
    with pytest.raises(SaltInvocationError, match="absolute"):
        store.root_dir("relative/dir")


def test_new_ids_never_collide(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert store.new_id(str(tmp_path), now) == "20260102T030405Z"
    (tmp_path / "20260102T030405Z.vda.qcow2").write_bytes(b"")
    assert store.new_id(str(tmp_path), now) == "20260102T030405Z-2"
    # an interrupted backup's checkpoint outlives its removed files: its id stays taken
    assert store.new_id(str(tmp_path), now, taken=["20260102T030405Z-2"]) == "20260102T030405Z-3"
    # a removed backup's id is not reused within its second: the new one still sorts after the others
    (tmp_path / "20260102T030405Z.vda.qcow2").unlink()
    assert store.new_id(str(tmp_path), now, taken=["20260102T030405Z-2"]) == "20260102T030405Z-3"
    assert store.new_id(str(tmp_path), now, taken=["20260102T030405Z-9"]) == "20260102T030405Z-10"
    ids = ["20260102T030405Z-10", "20260102T030405Z-9", "20260102T030405Z", "20260102T030404Z-3"]
    assert sorted(ids, key=store.id_order) == [ids[3], ids[2], ids[1], ids[0]]
    assert store.backup_id("20260102T030405Z-2")
    for bad in ("x", "../20260102T030405Z", "20260102T030405Z.json", None):
        with pytest.raises(SaltInvocationError):
            store.backup_id(bad)


def test_scan_orders_the_backups_of_one_second_as_they_were_made(tmp_path):
    """``finished`` has whole seconds: within one, ``-10`` came after ``-9`` (the newest is a chain's parent)."""
    ids = ["20260101T000000Z-10", "20260101T000000Z", "20260101T000000Z-9"]
    for bid in ids:
        store.write_manifest(str(tmp_path), manifest(bid, finished="2026-01-01T00:00:00Z"), KEY)
        (tmp_path / f"{bid}.vda.qcow2").write_bytes(b"x")
    assert [m["id"] for m in store.scan(str(tmp_path), KEY)[0]] == [ids[1], ids[2], ids[0]]


def test_scan_tells_valid_broken_and_incomplete_apart(tmp_path):
    d = str(tmp_path)
    full, inc, orphan = chain(
        ("20260101T000000Z", None), ("20260102T000000Z", "20260101T000000Z"), ("20260103T000000Z", None)
    )
    for m in (full, inc, orphan):
        store.write_manifest(d, m, KEY)
        (tmp_path / m["disks"][0]["file"]).write_bytes(b"x")
    (tmp_path / "20260104T000000Z.vda.qcow2").write_bytes(b"x")  # interrupted: no manifest
    os.unlink(tmp_path / orphan["disks"][0]["file"])  # a valid-looking manifest whose file is gone
    bad = dict(manifest("20260105T000000Z"), disks=[{"target": "vda", "file": "../../etc/passwd"}])
    store.write_manifest(d, bad, KEY)
    valid, broken, incomplete = store.scan(d, KEY)
    assert [m["id"] for m in valid] == ["20260101T000000Z", "20260102T000000Z"]
    assert broken == {
        "20260103T000000Z": "file 20260103T000000Z.vda.qcow2 is missing",
        "20260105T000000Z": "names a file outside its backup: '../../etc/passwd'",
    }
    assert incomplete == ["20260104T000000Z"]
    os.unlink(tmp_path / full["disks"][0]["file"])  # the full one breaks: so does what builds on it
    valid, broken, _ = store.scan(d, KEY)
    assert valid == [] and "gone or broken" in broken["20260102T000000Z"]


def test_retention_keep_n_never_breaks_a_chain():
    ms = chain(
        ("20260101T020000Z", None),
        ("20260102T020000Z", "20260101T020000Z"),
        ("20260103T020000Z", "20260102T020000Z"),
        ("20260104T020000Z", None),
        ("20260105T020000Z", "20260104T020000Z"),
    )
    kept, pruned = store.retention(ms, keep=1)
    assert kept == ["20260104T020000Z", "20260105T020000Z"]  # the newest and the full it builds on
    assert pruned == ["20260103T020000Z", "20260102T020000Z", "20260101T020000Z"]  # newest first
    kept, pruned = store.retention(ms, keep=3)
    assert kept == [m["id"] for m in ms] and pruned == []
    assert store.retention(ms) == ([m["id"] for m in ms], [])  # no rule: nothing goes


def test_retention_daily_and_weekly():
    days = ["20260105", "20260106", "20260106", "20260112", "20260113", "20260120"]  # Mondays: 5, 12, 19
    ms = [manifest(f"{d}T0{i}0000Z") for i, d in enumerate(days)]
    kept, pruned = store.retention(ms, keep_daily=2)
    assert kept == ["20260113T040000Z", "20260120T050000Z"]
    kept, _ = store.retention(ms, keep_weekly=2)
    assert kept == ["20260113T040000Z", "20260120T050000Z"]  # newest of week 3 (12-18) and of week 4
    kept, _ = store.retention(ms, keep_weekly=3, keep_daily=1)
    assert kept == ["20260106T020000Z", "20260113T040000Z", "20260120T050000Z"]
    with pytest.raises(SaltInvocationError):
        store.retention(ms, keep="-1")


def test_verify_catches_a_changed_file_and_a_rewired_backing_file(tmp_path):
    d = str(tmp_path)
    full = tmp_path / "20260101T000000Z.vda.qcow2"
    inc = tmp_path / "20260102T000000Z.vda.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(full), "1M"], check=True)
    cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", full.name, str(inc)]
    subprocess.run(cmd, check=True, cwd=d)
    ms = chain(("20260101T000000Z", None), ("20260102T000000Z", "20260101T000000Z"))
    ms[0]["disks"][0]["sha256"] = store.file_digest(full)
    ms[1]["disks"][0].update(sha256=store.file_digest(inc), backing=full.name)
    assert store.verify(d, ms)
    ms[0]["disks"][0]["sha256"] = "0" * 64
    with pytest.raises(CommandExecutionError, match="checksum mismatch"):
        store.verify(d, ms)
    ms[0]["disks"][0]["sha256"] = store.file_digest(full)
    subprocess.run(["qemu-img", "rebase", "-u", "-F", "qcow2", "-b", "/etc/passwd", str(inc)], check=True)
    with pytest.raises(CommandExecutionError, match="backs onto /etc/passwd"):
        store.verify(d, ms)


def test_stage_hashes_each_file_as_it_copies_it_and_never_reads_it_twice(tmp_path, monkeypatch):
    src, staging = tmp_path / "src", tmp_path / "staging"
    src.mkdir()
    staging.mkdir()
    full = src / "20260101T000000Z.vda.qcow2"
    inc = src / "20260102T000000Z.vda.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(full), "1M"], check=True)
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", str(full)], check=True, capture_output=True)
    cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", full.name, str(inc)]
    subprocess.run(cmd, check=True, cwd=src)
    ms = chain(("20260101T000000Z", None), ("20260102T000000Z", "20260101T000000Z"))
    ms[0]["disks"][0]["sha256"] = store.file_digest(full)
    ms[1]["disks"][0].update(sha256=store.file_digest(inc), backing=full.name)
    reads = []
    monkeypatch.setattr(store, "file_digest", lambda path, *a: reads.append(path))  # a spy: any second pass shows
    top = store.stage(str(src), ms, str(staging))
    assert top == {"vda": str(staging / inc.name)} and not reads
    assert (staging / full.name).read_bytes() == full.read_bytes()
    ms[0]["disks"][0]["sha256"] = "0" * 64  # the one pass still catches a mismatch
    (tmp_path / "again").mkdir()
    with pytest.raises(CommandExecutionError, match="checksum mismatch"):
        store.stage(str(src), ms, str(tmp_path / "again"))
    assert not reads


def test_needed_by_and_chain_of():
    ms = chain(("20260101T000000Z", None), ("20260102T000000Z", "20260101T000000Z"))
    assert store.needed_by(ms, "20260101T000000Z") == ["20260102T000000Z"]
    assert store.needed_by(ms, "20260102T000000Z") == []
    assert [m["id"] for m in store.chain_of(ms, "20260102T000000Z")] == ["20260101T000000Z", "20260102T000000Z"]
    with pytest.raises(SaltInvocationError, match="no valid backup"):
        store.chain_of(ms, "20990101T000000Z")


def test_a_second_backup_of_the_same_vm_is_refused_while_one_runs(tmp_path):
    with store.locked(str(tmp_path), "web1"):
        with pytest.raises(CommandExecutionError, match="is running"):
            with store.locked(str(tmp_path), "web1"):
                pass
    with store.locked(str(tmp_path), "web1"):  # released again
        pass


def test_a_manifest_counts_only_with_the_mac_of_the_key_and_in_its_own_place(tmp_path):
    """The MAC binds a manifest to its VM's name, uuid and id: signed with another key, changed, or copied into
    another VM's directory, it is broken."""
    root, bid = str(tmp_path / "backups"), "20260101T000000Z"
    os.mkdir(root)
    here, there = store.vm_dir(root, "web1", U1, create=True), store.vm_dir(root, "web2", U2, create=True)
    for d in (here, there):
        open(os.path.join(d, f"{bid}.vda.qcow2"), "wb").close()
    store.write_manifest(here, manifest(bid), KEY)
    assert [m["id"] for m in store.scan(here, KEY)[0]] == [bid]
    assert store.scan(here, b"o" * 32)[1] == {bid: store.UNSIGNED}
    shutil.copy(os.path.join(here, f"{bid}.json"), there)
    assert store.scan(there, KEY)[1] == {bid: store.UNSIGNED}
    key = store.manifest_key(None, str(tmp_path / "pki"))  # made on first use, private, then the same
    assert len(key) == 32 and store.manifest_key(None, str(tmp_path / "pki")) == key
    assert os.stat(tmp_path / "pki" / store.KEY_FILE).st_mode & 0o777 == 0o600
    assert store.manifest_key(str(tmp_path / "pki" / store.KEY_FILE), "/nonexistent") == key  # virt:backup:key_file
