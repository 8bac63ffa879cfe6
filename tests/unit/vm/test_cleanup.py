"""saltvirt.vm.cleanup / virt.cleanup: what an interrupted virt.init left (test driver)."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError


def _interrupted(images_dir, name, unfinished=True):
    """What a virt.init killed before it finished leaves: its init lock file, no longer held, and (unless
    ``unfinished=False``: a lock left by another init, of another host sharing ``images_dir``) the VM's
    manifest saying that its init never finished (here: the manifest of a VM made complete, rewound)."""
    import json
    import os

    from saltvirt.storage import images
    from saltvirt.vm import cleanup

    path = cleanup._lock_path(str(images_dir), name)
    with open(path, "w") as fh:
        fh.write("virt.init pid 0\n")
    manifest = os.path.join(images_dir, name, images.MANIFEST)
    if unfinished and os.path.exists(manifest):
        with open(manifest) as fh:
            data = json.load(fh)
        with open(manifest, "w") as fh:
            json.dump(dict(data, complete=False), fh)


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


def test_a_stale_lock_of_another_init_never_takes_a_complete_vm(virt_test, tmp_path):
    """In a shared virt:images the init locks are shared too: another host's init of 'web1', killed before
    it got far (while fetching its image), leaves its lock. The complete 'web1' here is not the half-made VM
    of that init: its manifest says its own init finished. A cleanup (with the master's proof, as
    salt-run virt.cleanup passes it) and a virt.init of that name keep it running with its disks."""
    import os

    ret = virt_test["virt.init"]("web1", 1, 64, nic=None)
    disk, uuid = ret["disks"][0]["path"], ret["uuid"]
    _interrupted(tmp_path / "images", "web1", unfinished=False)
    out = virt_test["virt.cleanup"]("web1", fleet_uuids={uuid: ["hyper-test"]})
    assert out["domain"].startswith("kept: a complete VM: its manifest records no unfinished init"), out
    assert out["removed"] == [] and os.path.exists(disk)
    _interrupted(tmp_path / "images", "web1", unfinished=False)
    with pytest.raises(SaltInvocationError, match="a VM named 'web1' is already defined"):
        virt_test["virt.init"]("web1", 1, 64, nic=None)
    assert virt_test["virt.vm_state"]("web1") == {"web1": "running"} and os.path.exists(disk)


# files judged by UUID, across hosts sharing virt:images (issue 34 #3) --------------------------------
def _shared_lab(tmp_path, test_conn):
    """Two hypervisors sharing one virt:images: on hv-b (``test_conn``, a private test:/// driver) 'web1'
    runs with its disk in ``shared/web1``, made by a real virt.init; hv-a is a minion loader whose own
    test:/// driver defines nothing, with the stale init lock of a virt.init of 'web1' that failed there.
    Returns (hv-a's ``__salt__``, web1's disk, web1's uuid)."""
    from saltvirt.model import vmargs
    from saltvirt.vm import provision
    from tests.support.paths import TEST_NODE_XML
    from tests.support.saltloader import make_minion_mods

    shared = tmp_path / "shared"
    req = vmargs.InitRequest("web1", 1, 64, nic=None)
    ret = provision.init(test_conn, req, provision.Host(images_dir=str(shared), host_id="hv-b"))
    assert ret["state"] == "running"
    _interrupted(shared, "web1", unfinished=False)  # hv-a's init never got as far as web1's files
    mods_a = make_minion_mods(
        tmp_path / "hv-a", f"test://{TEST_NODE_XML}", images_dir=shared, opts_extra={"id": "hv-a"}
    )
    return mods_a, ret["disks"][0]["path"], ret["uuid"]


def test_cleanup_on_another_host_keeps_the_disks_of_a_vm_running_from_shared_images(tmp_path, test_conn):
    """The attack: 'web1' is not defined on hv-a, so today's cleanup there deleted the disks 'web1' runs
    from on hv-b. Without the master's proof hv-a cannot know: it refuses and says what to run."""
    import os

    mods_a, disk, uuid = _shared_lab(tmp_path, test_conn)
    out = mods_a["virt.cleanup"]("web1")
    assert os.path.exists(disk) and out["removed"] == [], out
    assert out["interrupted"] is True and out["domain"] is None and out["errors"] == [], out
    assert "its manifest says hv-b created it, not this host (hv-a)" in out["refused"], out
    assert f"may run VM uuid {uuid} from it. Run salt-run virt.cleanup web1 on the master" in out["refused"], out
    assert out["kept"] == {disk: out["refused"]}
    # the master's proof: every hypervisor's defined uuids, hv-b's 'web1' among them
    out = mods_a["virt.cleanup"]("web1", fleet_uuids={uuid: ["hv-b"]})
    assert os.path.exists(disk) and out["refused"] == f"VM uuid {uuid} is defined on hv-b: these are its disks, in use"
    # a virt.init of web1 on hv-a that finds the stale lock: refused the same way, nothing touched
    with pytest.raises(CommandExecutionError, match="the files in its directory were kept: .* may be shared"):
        _interrupted(tmp_path / "shared", "web1", unfinished=False)
        mods_a["virt.init"]("web1", 1, 64, nic=None, start=False)
    assert os.path.exists(disk) and test_conn.lookupByName("web1").isActive()


def test_cleanup_deletes_by_uuid_once_proven_unused(tmp_path, test_conn):
    """Once no hypervisor defines the uuid (the master's proof), or the operator checked (force), the
    files go; a domain on this host with that uuid keeps them whatever is passed."""
    import os

    from saltvirt.vm import cleanup

    mods_a, disk, uuid = _shared_lab(tmp_path, test_conn)
    with pytest.raises(SaltInvocationError, match="fleet_uuids must map VM uuids to the hypervisors"):
        mods_a["virt.cleanup"]("web1", fleet_uuids=[uuid])
    # on hv-b itself: its own VM by uuid, even under another name, even forced
    dom = test_conn.lookupByName("web1")
    dom.destroy()
    dom.rename("web1-renamed")
    out = cleanup.cleanup(test_conn, "web1", str(tmp_path / "shared"), host_id="hv-b", fleet_uuids={}, force=True)
    assert out["refused"] == f"VM 'web1-renamed' on this host has uuid {uuid}, the one the manifest records: " + (
        "these are its disks"
    )
    assert os.path.exists(disk)
    test_conn.lookupByName("web1-renamed").undefine()  # its disks stay: now leftovers
    out = mods_a["virt.cleanup"]("web1", fleet_uuids={})  # every hypervisor answered, none defines it
    assert out["removed"] == [disk] and "refused" not in out and not os.path.exists(os.path.dirname(disk)), out


def test_cleanup_forced_by_the_operator_and_old_manifests_without_a_uuid(tmp_path, test_conn):
    import os

    from saltvirt.storage import images

    mods_a, disk, uuid = _shared_lab(tmp_path, test_conn)
    test_conn.lookupByName("web1").destroy()
    test_conn.lookupByName("web1").undefine()
    manifest = images.load_manifest(os.path.dirname(disk))
    del manifest["uuid"]  # as an older salt-virt wrote it: nothing proves anything by uuid
    images.write_json(os.path.join(os.path.dirname(disk), images.MANIFEST), manifest)
    for proof in (None, {}):
        out = mods_a["virt.cleanup"]("web1", fleet_uuids=proof)
        assert "records no VM uuid (an older salt-virt wrote it)" in out["refused"] and os.path.exists(disk), out
        assert "run virt.cleanup web1 force=True or delete them by hand" in out["refused"]
    out = mods_a["virt.cleanup"]("web1", force=True)
    assert out["removed"] == [disk] and not os.path.exists(disk), out


def test_what_counts_as_shared(tmp_path, monkeypatch):
    from saltvirt.vm import cleanup

    vm_dir = tmp_path / "images" / "web1"
    vm_dir.mkdir(parents=True)
    assert cleanup.shared(str(vm_dir), {"vm": "web1", "host": "hv-a"}, "hv-a") is None  # ext4 here, made here
    assert cleanup.shared(str(vm_dir), {"vm": "web1"}, "hv-a") is None  # no host recorded: the filesystem decides
    on_proc = cleanup.shared("/proc/self", {"vm": "x"}, "hv-a")  # not a local disk filesystem: may be shared
    assert on_proc == "it is on a proc filesystem (/proc), which other hosts can mount"
    # no NFS server runs here: its export table is a file this test writes
    etab = tmp_path / "etab"
    etab.write_text(f"{tmp_path / 'images'}\t*(rw,sync,wdelay,hide,no_subtree_check)\n")
    monkeypatch.setattr(cleanup, "NFS_EXPORTS", str(etab))
    exported = cleanup.shared(str(vm_dir), {"vm": "web1", "host": "hv-a"}, "hv-a")
    assert exported == f"this host exports {tmp_path / 'images'} over NFS"


# the reaper: seeding whose job is gone ---------------------------------------------------------------
SEEDER = """
import sys, time
sys.path.insert(0, {utils!r})
from saltvirt.guest import seed
def hold(exists):
    print("mounted", flush=True)
    time.sleep(600)
seed.seed({image!r}, {{"/etc/reaped": "x"}}, backend={backend!r}, fmt="raw", inspect=hold)
"""


@pytest.mark.parametrize("backend", ["qsd-fuse", "loop"])
def test_reap_releases_seeding_whose_job_is_gone_and_nothing_else(tmp_path, backend):
    """A real seeding job (qemu-storage-daemon FUSE export or the image itself, loop device, mount in its
    own namespace) SIGKILLed mid-way: the reaper stops, detaches and removes all of it; a live job's scratch
    directory, a symlink and a directory salt-virt did not make (other mode) are left alone. The loop
    backend's device names only the image (its mount went with the namespace): its record finds it."""
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
    code = SEEDER.format(utils=str(ROOT / "_utils"), image=image, backend=backend)
    env = dict(os.environ, TMPDIR=str(scratch_root))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        line = child.stdout.readline().decode()
        assert line.strip() == "mounted", line + child.stdout.read().decode()
        (scratch,) = [p for p in scratch_root.iterdir() if p.name.startswith(cleanup.SEED_PREFIX)]
        assert cleanup.reap_seeding(str(scratch_root))["removed"] == []  # its job runs: untouched
        assert leftovers(str(scratch), image)
    finally:
        child.kill()
        child.wait()
    held = leftovers(str(scratch), image)
    assert any(x.startswith("loop") for x in held), held
    assert any(x.startswith("process") for x in held) == (backend == "qsd-fuse"), held
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
    assert any(r.startswith("stopped qemu-storage-daemon") for r in out["removed"]) == (backend == "qsd-fuse"), out
    assert out["removed"][-1] == f"removed {scratch}" and not scratch.exists()
    assert leftovers(str(scratch), image) == []
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
