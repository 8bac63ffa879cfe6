"""saltvirt.guest.seed on real images with the real tools (losetup, qemu-storage-daemon + FUSE, mount), read
back with debugfs (no shared code with the backends), and a TCG boot that prints what was seeded.

qemu-nbd (no nbd kernel module here) and libguestfs (not installed) are exercised only through what
``auto`` reports about them; every backend that can run here is used for real.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.guest import seed
from saltvirt.storage import images
from tests.support import lab
from tests.support.seed_helpers import build_disk, fill, fsck_clean, leftovers, read_guest, sha256

MASTER = "salt-master.example"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A private TMPDIR for seed's own scratch directories, checked to be empty (and nothing mounted,
    attached or running from it) after the test."""
    tmp = tmp_path / "seedtmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp
    assert leftovers(str(tmp_path)) == []
    assert os.listdir(tmp) == []


@pytest.fixture
def disks(tmp_path, guest):
    """Private copies of the test guest disks and a qcow2 overlay on a qcow2 base."""
    out = {
        "raw": str(tmp_path / "guest.raw"),
        "qcow2": str(tmp_path / "guest.qcow2"),
        "base": str(tmp_path / "base.qcow2"),
    }
    shutil.copyfile(guest["raw"], out["raw"])
    shutil.copyfile(guest["qcow2"], out["qcow2"])
    shutil.copyfile(guest["qcow2"], out["base"])
    out["overlay"] = images.clone(out["base"], str(tmp_path / "overlay.qcow2"), overlay=True)["path"]
    return out


@pytest.fixture(scope="module")
def keypair():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return pub, priv


def minion_files(minion_id, keypair=None):
    pub, priv = keypair or (None, None)
    return seed.salt_minion_files(minion_id, master=MASTER, pub=pub, priv=priv, config={"log_level": "info"})


def assert_seeded(image, files, tmp_path):
    """Every file is in the image with its content, mode and root ownership; the filesystem is clean."""
    found = read_guest(image, list(files), str(tmp_path))
    for path, spec in files.items():
        assert found[path] == (spec["content"], spec["mode"], 0), path
    assert fsck_clean(image, str(tmp_path))


# salt_minion_files -------------------------------------------------------------------------------
def test_salt_minion_files(keypair):
    pub, priv = keypair
    files = seed.salt_minion_files(
        "web1", master=["m1", "m2"], pub=pub, priv=priv, config={"startup_states": "highstate"}
    )
    assert files["/etc/salt/minion_id"] == {"content": b"web1", "mode": 0o644}
    conf = files["/etc/salt/minion.d/99-salt-virt.conf"]
    assert conf["mode"] == 0o644
    assert conf["content"].decode() == "id: web1\nmaster:\n- m1\n- m2\nstartup_states: highstate\n"
    assert files["/etc/salt/pki/minion/minion.pem"] == {"content": priv.encode(), "mode": 0o400}
    assert files["/etc/salt/pki/minion/minion.pub"] == {"content": pub.encode(), "mode": 0o644}
    assert set(seed.salt_minion_files("web1")) == {"/etc/salt/minion_id", "/etc/salt/minion.d/99-salt-virt.conf"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"minion_id": ""}, "non-empty"),
        ({"minion_id": "a/b"}, "must not contain"),
        ({"minion_id": "a b"}, "must not contain"),
        ({"minion_id": "ok", "config": {"master": "other"}, "master": "m"}, "pick|was passed"),
        ({"minion_id": "ok", "config": "log_level: info"}, "must be a dict"),
        ({"minion_id": "ok", "pub": "x"}, "both"),
        ({"minion_id": "ok", "pub": "PRIV", "priv": "PUB"}, "swapped"),
    ],
)
def test_salt_minion_files_bad_input(kwargs, match, keypair):
    pub, priv = keypair
    kwargs = {k: {"PRIV": priv, "PUB": pub}.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(SaltInvocationError, match=match):
        seed.salt_minion_files(**kwargs)


@pytest.mark.parametrize(
    "files, match",
    [
        ({}, "non-empty dict"),
        ({"etc/x": b"1"}, "absolute"),
        ({"/etc/../x": b"1"}, "normalized"),
        ({"/etc//x": b"1"}, "normalized"),
        ({"/etc/x/": b"1"}, "normalized"),
        ({"/etc/x\0y": b"1"}, "NUL"),
        ({"/": b"1"}, "absolute file path"),
        ({"/etc/x": {"content": 5}}, "bytes or str"),
        ({"/etc/x": {"content": b"", "mode": "rw"}}, "mode"),
        ({"/etc/x": b"1", "/etc/x/y": b"2"}, "parent directory"),
    ],
)
def test_seed_rejects_bad_files_before_touching_the_image(disks, files, match, scratch):
    before = sha256(disks["raw"])
    with pytest.raises(SaltInvocationError, match=match):
        seed.seed(disks["raw"], files)
    assert sha256(disks["raw"]) == before


def test_seed_rejects_bad_arguments(disks, tmp_path, scratch):
    files = minion_files("x")
    with pytest.raises(SaltInvocationError, match="backend must be"):
        seed.seed(disks["raw"], files, backend="magic")
    with pytest.raises(SaltInvocationError, match="does not exist"):
        seed.seed(str(tmp_path / "missing.raw"), files)
    with pytest.raises(SaltInvocationError, match="absolute"):
        seed.seed("guest.raw", files)


# backends ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, disk", [("loop", "raw"), ("qsd-fuse", "raw"), ("qsd-fuse", "qcow2")])
def test_backend_writes_files_with_modes(backend, disk, disks, tmp_path, keypair, scratch):
    files = minion_files(f"{backend}-{disk}", keypair)
    ret = seed.seed(disks[disk], files, backend=backend)
    assert ret["backend"] == backend and ret["root"] == "partition 1" and ret["fstype"] == "ext4"
    assert ret["files"] == sorted(files)
    assert ret["attempts"] == [dict(ret["attempts"][0], backend=backend, ok=True, reason="ok")]
    assert_seeded(disks[disk], files, tmp_path)
    assert read_guest(disks[disk], ["/seed.txt"], str(tmp_path))["/seed.txt"][0].startswith(b"base-image built")


def test_qsd_fuse_on_overlay_leaves_the_base_alone(disks, tmp_path, scratch):
    before = sha256(disks["base"])
    files = minion_files("over1")
    ret = seed.seed(disks["overlay"], files, backend="qsd-fuse")
    assert ret["backend"] == "qsd-fuse"
    assert sha256(disks["base"]) == before
    assert_seeded(disks["overlay"], files, tmp_path)
    assert read_guest(disks["base"], ["/etc/salt/minion_id"], str(tmp_path))["/etc/salt/minion_id"] is None
    assert images.image_info(disks["overlay"])["chain"] == [disks["overlay"], disks["base"]]


def test_a_daemon_that_will_not_stop_after_the_flush_is_killed_and_the_seeding_stands(
    disks, tmp_path, scratch, monkeypatch, caplog
):
    """Run K (2026-11-29): a qemu-storage-daemon stayed 60 s after SIGTERM and virt.init failed with
    "exited with -9" although the export had been flushed. Here the daemon is stopped (SIGSTOP) as it is
    sent SIGTERM, after the flush: it is killed, the seeding succeeds, the files are in the image, the log
    says why."""
    real_terminate, stopped = subprocess.Popen.terminate, []

    def freeze_then_terminate(proc):  # SIGTERM stays pending while the daemon is stopped: it never exits
        if "qemu-storage-daemon" in proc.args:
            os.kill(proc.pid, signal.SIGSTOP)
            stopped.append(proc.pid)
        real_terminate(proc)

    monkeypatch.setattr(subprocess.Popen, "terminate", freeze_then_terminate)
    monkeypatch.setattr(seed, "QSD_STOP_SECONDS", 2.0, raising=False)
    files = minion_files("frozen")
    ret = seed.seed(disks["qcow2"], files, backend="qsd-fuse")
    monkeypatch.undo()
    assert stopped and ret["backend"] == "qsd-fuse", (stopped, ret)
    assert_seeded(disks["qcow2"], files, tmp_path)
    assert fsck_clean(disks["qcow2"], str(tmp_path))
    assert "did not exit within 2 s of SIGTERM (state T" in caplog.text and "flushed before" in caplog.text


@pytest.mark.parametrize("disk, fmt", [("qcow2", "qcow2"), ("raw", "raw")])
def test_auto_records_every_backend_it_tried(disk, fmt, disks, tmp_path, scratch):
    files = minion_files(f"auto-{disk}")
    ret = seed.seed(disks[disk], files)
    names = [a["backend"] for a in ret["attempts"]]
    assert names == list(seed.auto_order(fmt)[: len(names)]) and names[-1] == ret["backend"]
    # a raw image: a loop device of its own before a qemu-storage-daemon export (issue #40)
    assert ret["backend"] in ("libguestfs", "qemu-nbd", "loop" if fmt == "raw" else "qsd-fuse"), names
    assert ret["attempts"][-1]["ok"] is True
    for attempt in ret["attempts"][:-1]:
        assert attempt["ok"] is False and attempt["reason"].startswith(("skipped: ", "failed: ")), attempt
    if not os.path.exists("/sys/block/nbd0"):
        nbd = next(a for a in ret["attempts"] if a["backend"] == "qemu-nbd")
        assert "nbd" in nbd["reason"]
    assert_seeded(disks[disk], files, tmp_path)


def test_seeding_twice_replaces_the_files(disks, tmp_path, scratch):
    seed.seed(disks["raw"], minion_files("first"), backend="loop")
    files = minion_files("second")
    seed.seed(disks["raw"], files, backend="qsd-fuse")
    assert_seeded(disks["raw"], files, tmp_path)


def test_whole_disk_filesystem_and_parent_dirs(tmp_path, scratch):
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    disk = build_disk(str(tmp_path / "whole.qcow2"), tree, partitioned=False, fmt="qcow2")
    files = {"/etc/salt/pki/minion/minion.pub": {"content": b"k", "mode": 0o600}, "/opt/deep/a/b/c": b"x"}
    ret = seed.seed(disk, files, backend="qsd-fuse")
    assert ret["root"] == "whole disk"
    found = read_guest(disk, list(files) + ["/etc/salt/pki", "/opt/deep/a"], str(tmp_path))
    assert found["/etc/salt/pki/minion/minion.pub"] == (b"k", 0o600, 0)
    assert found["/opt/deep/a/b/c"] == (b"x", 0o644, 0)
    assert found["/etc/salt/pki"][1] == 0o755 and found["/opt/deep/a"][1] == 0o755


def test_guest_symlinks_never_lead_to_the_host(tmp_path, scratch):
    """/etc/salt in the guest is an absolute symlink to a path that also exists on the host: the
    files must land in the guest's target, and the host's directory must stay untouched."""
    host_dir = tmp_path / "host-salt"  # exists on the host ...
    host_dir.mkdir()
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / str(host_dir).lstrip("/")).mkdir(parents=True)  # ... and, under the same name, in the guest
    (tree / "etc" / "salt").symlink_to(host_dir)
    (tree / "etc" / "hop").symlink_to("../etc/../../../../etc")  # '..' above the guest root stays at /
    disk = build_disk(str(tmp_path / "links.raw"), tree)
    files = {"/etc/salt/minion_id": b"linked", "/etc/hop/salt/x": b"y"}
    seed.seed(disk, files, backend="loop")
    assert os.listdir(host_dir) == []
    found = read_guest(disk, [f"{host_dir}/minion_id", f"{host_dir}/x"], str(tmp_path))
    assert found[f"{host_dir}/minion_id"][0] == b"linked" and found[f"{host_dir}/x"][0] == b"y"


class _FakeGuestFS:
    """Stands in for the python ``guestfs`` module, which is not installed here (installing libguestfs
    would make ``auto`` pick it for everyone's tests, with a TCG appliance boot each time). It keeps a
    tiny in-memory guest so the backend's control flow is exercised; the real tool is not."""

    calls = []
    filesystems = {"/dev/sda1": "swap", "/dev/sda2": "ext4", "/dev/sda3": "ext4"}
    dirs = {"/dev/sda2": {"/", "/data"}, "/dev/sda3": {"/", "/etc"}}

    def GuestFS(self, **kw):
        self.calls.append(("GuestFS", kw))
        self.mounted, self.files = None, {}
        return self

    def __getattr__(self, name):
        def call(*args, **kw):
            self.calls.append((name, args, kw))
            if name == "list_filesystems":
                return dict(self.filesystems)
            if name == "mount":
                self.mounted = args[0]
            if name == "is_dir":
                return args[0] in self.dirs[self.mounted]
            if name == "write":
                self.files[args[0]] = args[1]

        return call


def test_libguestfs_backend_flow_with_the_python_module(disks, monkeypatch, scratch):
    fake = _FakeGuestFS()
    fake.calls = []
    monkeypatch.setitem(sys.modules, "guestfs", fake)
    files = minion_files("g1")
    ret = seed.seed(disks["qcow2"], files, backend="libguestfs")
    assert ret["backend"] == "libguestfs" and ret["root"] == "/dev/sda3" and ret["fstype"] == "ext4"
    names = [c[0] for c in fake.calls]
    assert fake.calls[0] == ("GuestFS", {"python_return_dict": True})
    assert fake.calls[1] == ("add_drive_opts", (disks["qcow2"],), {"format": "qcow2", "readonly": False})
    assert names[2:4] == ["launch", "list_filesystems"]
    assert ("mount", ("/dev/sda1", "/"), {}) not in fake.calls  # swap is never mounted
    assert ("is_dir", ("/etc",), {"followsymlinks": True}) in fake.calls
    assert names[-3:] == ["umount_all", "shutdown", "close"]
    for path, spec in files.items():
        assert fake.files[path] == spec["content"]
        assert ("chmod", (spec["mode"], path), {}) in fake.calls and ("chown", (0, 0, path), {}) in fake.calls
    fake.calls = []
    fake.dirs = {"/dev/sda2": {"/"}, "/dev/sda3": {"/"}}
    with pytest.raises(CommandExecutionError, match="libguestfs: failed: no filesystem with an /etc directory"):
        seed.seed(disks["qcow2"], files, backend="libguestfs")
    assert [c[0] for c in fake.calls][-1] == "close"


# failures ----------------------------------------------------------------------------------------
def test_loop_on_qcow2_is_a_clear_error(disks, scratch):
    before = sha256(disks["qcow2"])
    with pytest.raises(CommandExecutionError, match="loop: skipped: loop works on raw images only .* is qcow2"):
        seed.seed(disks["qcow2"], minion_files("x"), backend="loop")
    assert sha256(disks["qcow2"]) == before


def test_no_root_filesystem_stops_the_chain(tmp_path, scratch):
    tree = tmp_path / "tree"
    (tree / "data").mkdir(parents=True)
    disk = build_disk(str(tmp_path / "noetc.raw"), tree)
    with pytest.raises(CommandExecutionError) as exc:
        seed.seed(disk, minion_files("x"))
    msg = str(exc.value)
    assert "loop: failed: no filesystem with an /etc directory found (partition 1 (ext4): no /etc)" in msg
    assert "qsd-fuse:" not in msg  # the same disk content: no point trying the next backend
    for backend in seed.BACKENDS[:2]:
        assert f"{backend}: skipped" in msg or f"{backend}: failed" in msg
    blank = str(tmp_path / "blank.raw")
    images.create_disk(blank, 8, fmt="raw")
    with pytest.raises(CommandExecutionError, match=r"loop: failed: .*whole disk: no filesystem"):
        seed.seed(blank, minion_files("x"), backend="loop")


@pytest.mark.parametrize("backend, fmt", [("loop", "raw"), ("qsd-fuse", "qcow2")])
def test_failure_after_mounting_cleans_up_everything(backend, fmt, tmp_path, scratch):
    """/etc/salt is a file in this guest: writing fails with the guest mounted and the image attached;
    the ``scratch`` fixture then checks that nothing is left mounted, attached, running or on disk."""
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "salt").write_text("not a directory")
    disk = build_disk(str(tmp_path / f"etcfile.{fmt}"), tree, fmt=fmt)
    with pytest.raises(CommandExecutionError, match=f"{backend}: failed: .*salt is not a directory in the guest"):
        seed.seed(disk, minion_files("x"), backend=backend)
    assert read_guest(disk, ["/etc/salt"], str(tmp_path))["/etc/salt"][0] == b"not a directory"
    assert fsck_clean(disk, str(tmp_path))


@pytest.mark.parametrize("backend, disk", [("loop", "raw"), ("qsd-fuse", "qcow2")])
def test_a_mount_namespace_made_while_seeding_keeps_nothing(backend, disk, disks, tmp_path, scratch):
    """Issue 33 (CI): a qemu started elsewhere while a guest was mounted for seeding (libvirt gives each
    qemu a mount namespace, a copy of the host's) kept that mount: with ``/`` not shared (no systemd, a
    container) the unmount never reached the copy, the loop device stayed busy and the seeding failed
    after 30 s ("still attached after 'losetup -d'"). The guest is now mounted where nobody copies it."""
    others = []

    def inspect(exists):  # called with the guest mounted: a namespace is made now, as qemu makes one
        others.append(subprocess.Popen(["unshare", "--mount", "sleep", "300"]))
        time.sleep(0.2)
        return {}

    files = minion_files(f"ns-{backend}")
    try:
        ret = seed.seed(disks[disk], files, backend=backend, inspect=inspect)
        assert ret["backend"] == backend and len(others) == 1
        assert leftovers(str(tmp_path)) == []  # the namespace still alive holds no copy
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    assert_seeded(disks[disk], files, tmp_path)


@pytest.mark.parametrize("backend, fmt", [("loop", "raw"), ("qsd-fuse", "raw"), ("qsd-fuse", "qcow2")])
def test_a_full_host_filesystem_fails_the_seeding(backend, fmt, tmp_path, scratch, keypair):
    """The image's own filesystem full (a sparse copy: the guest's new blocks need room there): the device
    under the guest filesystem fails the write-back, which the unmount would hide (it succeeds, the files
    are lost, the guest's journal aborted). Seeding fails with ENOSPC named, nothing is left attached."""
    small = tmp_path / "small"
    small.mkdir()
    lab.run(["mount", "-t", "tmpfs", "-o", "size=8m", "svseedfull", str(small)])
    try:
        disk = images.clone(disks_src(fmt), str(small / f"guest.{fmt}"), fmt=fmt, src_fmt=fmt)["path"]
        fill(str(small))
        with pytest.raises(CommandExecutionError, match=f"{backend}: failed: .*No space left on device") as err:
            seed.seed(disk, minion_files("x", keypair), backend=backend, fmt=fmt)
        print(err.value)
        assert leftovers(disk) == []
    finally:
        lab.run(["umount", str(small)])


def disks_src(fmt):
    from tests.support.paths import GUEST_DIR

    return str(GUEST_DIR / f"disk.{fmt}")


def _hold(image, fmt, tmp_path):
    """A stand-in for a running VM: qemu-storage-daemon with ``image`` open and exported writable
    (the export plays the VM's disk device: same permissions, same locks). --daemonize returns once
    the image is open. The export lives outside ``scratch`` (which must be empty afterwards), mounted in a
    mount namespace of its own: no namespace another test makes meanwhile keeps a copy of it."""
    node = {"driver": fmt, "node-name": "d", "file": {"driver": "file", "filename": image}}
    export = tmp_path / f"holder-{os.path.basename(image)}"
    export.touch()
    fuse = {"type": "fuse", "id": "e", "node-name": "d", "mountpoint": str(export), "writable": True}
    pidfile = str(tmp_path / "holder.pid")
    cmd = ["unshare", "--mount", "--propagation", "private", "qemu-storage-daemon", "--daemonize", "--pidfile", pidfile]
    cmd += ["--blockdev", json.dumps(node)]
    subprocess.run(cmd + ["--export", json.dumps(fuse)], check=True)
    return int(open(pidfile).read())


@pytest.mark.parametrize("fmt", ["qcow2", "raw"])
def test_image_in_use_by_qemu_is_refused(disks, tmp_path, scratch, fmt):
    holder = _hold(disks[fmt], fmt, tmp_path)
    try:
        before = sha256(disks[fmt])
        for backend in ("auto", "qsd-fuse") + (("loop",) if fmt == "raw" else ()):
            with pytest.raises(CommandExecutionError, match="in use by a running VM.*shut the VM down"):
                seed.seed(disks[fmt], minion_files("x"), backend=backend)
        with pytest.raises(CommandExecutionError, match="in use by a running VM"):
            images.clone(disks[fmt], str(tmp_path / "copy.img"))
        assert sha256(disks[fmt]) == before and not os.path.exists(tmp_path / "copy.img")
    finally:
        os.kill(holder, signal.SIGTERM)
        assert _wait_gone(holder)
    seed.seed(disks[fmt], minion_files("x"), backend="qsd-fuse")  # free again


def test_a_fresh_disk_skips_the_in_use_check(disks, scratch):
    """virt.init seeds the disk it has just created (fresh=True): the in-use check (qemu-img info and a
    scan of every process's open files) is skipped. Shown with an image another process holds open
    (no qemu lock): refused without fresh, seeded with it."""
    with open(disks["raw"], "rb") as fh:
        holder = subprocess.Popen(["sleep", "60"], stdin=fh)
    try:
        with pytest.raises(CommandExecutionError, match=r"in use .*open in sleep"):
            seed.seed(disks["raw"], minion_files("x"), backend="qsd-fuse", fmt="raw")
        done = seed.seed(disks["raw"], minion_files("x"), backend="qsd-fuse", fmt="raw", fresh=True)
        assert done["backend"] == "qsd-fuse" and done["attempts"][-1]["ok"]
    finally:
        holder.kill()
        holder.wait()


def test_image_attached_to_a_loop_device_is_refused(disks, scratch):
    dev = subprocess.run(["losetup", "-f", "--show", disks["raw"]], check=True, capture_output=True, text=True)
    dev = dev.stdout.strip()
    try:
        with pytest.raises(CommandExecutionError, match=f"in use .*attached to {dev}"):
            seed.seed(disks["raw"], minion_files("x"))
    finally:
        subprocess.run(["losetup", "-d", dev], check=True)


def test_backing_file_of_a_running_vm_is_refused_but_its_siblings_are_not(disks, tmp_path, scratch):
    """A raw base under a running VM's overlay: the loop backend would write it behind qemu's back."""
    running = images.clone(disks["raw"], str(tmp_path / "running.qcow2"), overlay=True)["path"]
    sibling = images.clone(disks["raw"], str(tmp_path / "sibling.qcow2"), overlay=True)["path"]
    holder = _hold(running, "qcow2", tmp_path)
    try:
        before = sha256(disks["raw"])
        for backend in ("loop", "qsd-fuse", "auto"):
            with pytest.raises(CommandExecutionError, match="in use by a running VM.*backing file"):
                seed.seed(disks["raw"], minion_files("x"), backend=backend)
        assert sha256(disks["raw"]) == before
        files = minion_files("sibling")
        assert seed.seed(sibling, files, backend="qsd-fuse")["backend"] == "qsd-fuse"
        assert sha256(disks["raw"]) == before
    finally:
        os.kill(holder, signal.SIGTERM)
        assert _wait_gone(holder)
    assert_seeded(sibling, files, tmp_path)


def _wait_gone(pid, timeout=30):
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# boot --------------------------------------------------------------------------------------------
DOMAIN = """<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>160</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type><kernel>{kernel}</kernel><initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 quiet</cmdline></os>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk}'/>
      <target dev='vda' bus='virtio'/></disk>
    <serial type='pty'><log file='{log}' append='on'/><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
  </devices>
</domain>"""


def test_seeded_overlay_boots_and_the_guest_sees_the_minion_config(hv1, lab_dir, guest, keypair, tmp_path, scratch):
    import libvirt

    work = tempfile.mkdtemp(prefix="seedboot-", dir=lab_dir)  # readable by qemu (lab_dir is 0755)
    os.chmod(work, 0o755)
    base = os.path.join(work, "base.qcow2")
    shutil.copyfile(guest["qcow2"], base)
    before = sha256(base)
    overlay = images.clone(base, os.path.join(work, "vm.qcow2"), overlay=True)["path"]
    minion_id = f"seeded-{os.path.basename(work)[-6:]}"
    files = minion_files(minion_id, keypair)
    assert seed.seed(overlay, files)["backend"] in seed.BACKENDS
    log = os.path.join(work, "serial.log")
    name = minion_id
    conn = libvirt.open(hv1.uri)
    dom = conn.createXML(
        DOMAIN.format(name=name, kernel=guest["kernel"], initrd=guest["initrd"], disk=overlay, log=log)
    )
    try:
        out = lab.wait_for_text(log, "SALT-MINION-KEY:", timeout=300)  # TCG on a busy host
        assert f"SALT-MINION-ID: {minion_id}" in out
        conf = (
            f"SALT-MINION-CONF: /etc/salt/minion.d/99-salt-virt.conf id: {minion_id}"
            f" | master: {MASTER} | log_level: info"
        )
        assert conf in out
        fingerprint = hashlib.sha256(keypair[0].encode()).hexdigest()
        assert f"SALT-MINION-KEY: {fingerprint}" in out
        with pytest.raises(CommandExecutionError, match="in use by a running VM"):
            seed.seed(overlay, minion_files("while-running"))
    finally:
        dom.destroy()
        conn.close()
    assert sha256(base) == before
    shutil.rmtree(work)


@pytest.mark.parametrize("backend", ["loop", "qsd-fuse"])
def test_kernel_mount_refuses_other_filesystems(backend, tmp_path, scratch):
    """A hostile image with a filesystem outside KERNEL_MOUNT_FS (minix here) is never handed to the
    host kernel: refused with the reason, nothing mounted or attached afterwards (scratch checks)."""
    disk = str(tmp_path / "minix.raw")
    subprocess.run(["truncate", "-s", "8M", disk], check=True)
    subprocess.run(["mkfs.minix", disk], check=True, capture_output=True)
    before = sha256(disk)
    with pytest.raises(CommandExecutionError) as exc:
        seed.seed(disk, minion_files("x"), backend=backend)
    assert "whole disk (minix): refused: the host kernel mounts only ext2, ext3, ext4, xfs, btrfs, vfat" in str(
        exc.value
    )
    assert sha256(disk) == before
