"""saltvirt.vm.cleanup / virt.cleanup: what an interrupted virt.init left (test driver)."""


def _interrupted(images_dir, name):
    """What a virt.init killed before it finished leaves: its init lock file, no longer held."""
    from saltvirt.vm import cleanup

    path = cleanup._lock_path(str(images_dir), name)
    with open(path, "w") as fh:
        fh.write("virt.init pid 0\n")


def test_cleanup_removes_an_interrupted_init_and_keeps_foreign_files(virt_test, tmp_path):
    images_dir = tmp_path / "images"
    ret = virt_test["virt.init"]("half1", 1, 64, nic=None, start=False)
    disk = ret["disks"][0]["path"]
    foreign = images_dir / "half1" / "notes.txt"
    foreign.write_text("not salt-virt's")
    assert virt_test["virt.cleanup"]("half1")["domain"].startswith("kept: a complete VM")  # finished init
    _interrupted(images_dir, "half1")
    out = virt_test["virt.cleanup"]("half1")
    assert out["interrupted"] is True and out["domain"].startswith("undefined")
    assert out["removed"] == [disk] and out["errors"] == []
    assert "half1" not in virt_test["virt.list_domains"]() and foreign.read_text() == "not salt-virt's"
    assert not (images_dir / ".locks" / "init-half1").exists()
    assert virt_test["virt.cleanup"]("half1")["interrupted"] is False  # idempotent


def test_cleanup_removes_disks_with_a_manifest_but_no_domain(virt_test, tmp_path):
    ret = virt_test["virt.init"]("half2", 1, 64, nic=None, start=False)
    disk = ret["disks"][0]["path"]
    virt_test["virt.undefine"]("half2")
    assert virt_test["virt.cleanup"]("half2")["removed"] == [disk]
    assert not (tmp_path / "images" / "half2").exists()


def test_init_after_an_interrupted_init_cleans_up_first(virt_test, tmp_path):
    virt_test["virt.init"]("half3", 1, 64, nic=None, start=False)
    _interrupted(tmp_path / "images", "half3")
    ret = virt_test["virt.init"]("half3", 1, 64, nic=None, start=False)
    assert ret["cleaned_up"]["domain"].startswith("undefined") and ret["state"] == "shutoff"
    assert not (tmp_path / "images" / ".locks" / "init-half3").exists()


# the reaper: seeding whose job is gone ---------------------------------------------------------------
SEEDER = """
import sys, time
sys.path.insert(0, {utils!r})
from saltvirt.guest import seed
def hold(exists):
    print("mounted", flush=True)
    time.sleep(600)
seed.seed({image!r}, {{"/etc/reaped": "x"}}, backend="qsd-fuse", fmt="raw", inspect=hold)
"""


def test_reap_releases_seeding_whose_job_is_gone_and_nothing_else(tmp_path):
    """A real seeding job (qemu-storage-daemon FUSE export, loop device, mount) SIGKILLed mid-way: the
    reaper stops, detaches, unmounts and removes all of it; a live job's scratch directory, a symlink
    and a directory salt-virt did not make (other mode) are left alone."""
    import os
    import subprocess
    import sys

    from saltvirt.base import procs
    from saltvirt.vm import cleanup
    from tests.support.paths import ROOT
    from tests.support.seed_helpers import build_disk, leftovers

    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    image = build_disk(tmp_path / "disk.raw", tree)
    code = SEEDER.format(utils=str(ROOT / "_utils"), image=image)
    env = dict(os.environ, TMPDIR=str(scratch_root))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        line = child.stdout.readline().decode()
        assert line.strip() == "mounted", line + child.stdout.read().decode()
        (scratch,) = [p for p in scratch_root.iterdir() if p.name.startswith(cleanup.SEED_PREFIX)]
        assert cleanup.reap_seeding(str(scratch_root))["removed"] == []  # its job runs: untouched
        assert leftovers(str(scratch))
    finally:
        child.kill()
        child.wait()
    held = leftovers(str(scratch))
    assert any(x.startswith("process") for x in held) and any(x.startswith("loop") for x in held), held
    # not salt-virt's: a symlink with the prefix, a directory of another mode, a live process's directory
    other = tmp_path / "other"
    other.mkdir()
    (scratch_root / f"{cleanup.SEED_PREFIX}link").symlink_to(other)
    (scratch_root / f"{cleanup.SEED_PREFIX}open").mkdir(mode=0o755)
    (scratch_root / f"{cleanup.SEED_PREFIX}open").chmod(0o755)
    live = scratch_root / f"{cleanup.SEED_PREFIX}live"
    live.mkdir(mode=0o700)
    (live / "owner").write_text(procs.mark())
    out = cleanup.reap_seeding(str(scratch_root))
    assert out["errors"] == [], out
    assert out["removed"][0] == f"{scratch}: its seeding process ({child.pid}) is gone", out
    assert any(r.startswith("detached /dev/loop") for r in out["removed"]), out
    assert any(r.startswith("stopped qemu-storage-daemon") for r in out["removed"]), out
    assert out["removed"][-1] == f"removed {scratch}" and not scratch.exists()
    assert leftovers(str(scratch)) == []
    assert sorted(out["left"]) == sorted(str(scratch_root / f"{cleanup.SEED_PREFIX}{n}") for n in ("link", "open"))
    assert live.exists() and other.exists() and (scratch_root / f"{cleanup.SEED_PREFIX}link").is_symlink()
    assert cleanup.reap_seeding(str(scratch_root))["removed"] == []  # nothing left to do


def test_a_process_calling_itself_qemu_storage_daemon_is_not_one(tmp_path):
    """Issue 23 #8: cleanup stops only real qemu-storage-daemons (its binary, this user), not any process
    whose argv[0] says so (a signal to whatever a local user runs)."""
    import json
    import subprocess
    import time

    from saltvirt.vm import cleanup

    export = str(tmp_path / "salt-virt-seed-x" / "export")
    fake = json.dumps({"type": "fuse", "mountpoint": export})
    # argv[0] "qemu-storage-daemon", the export's JSON in its command line: /bin/sh running "sleep"
    proc = subprocess.Popen(["qemu-storage-daemon", "-c", "sleep 30; true", fake], executable="/bin/sh")
    try:
        # the command line is empty until the child has exec'd (a while on a loaded machine): wait for it
        deadline, cmdline = time.monotonic() + 30, b""
        while not cmdline and time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            time.sleep(0.05)
        assert cmdline.startswith(b"qemu-storage-daemon\0") and proc.poll() is None
        assert cleanup._qsd_serving(export) == []
    finally:
        proc.kill()
        proc.wait()
