"""saltvirt.guest.seed, the parts that need no mount: the files it takes, the ``inspect`` hook. A plain
directory (``guest_root``, conftest.py) stands in for a mounted root; the backends themselves (loop,
qsd-fuse, qemu-nbd mounts) are tested in tests/integration/test_seed.py."""

import subprocess

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import tools
from saltvirt.guest import guestroot, seed
from tests.support import toollimits


@pytest.mark.parametrize("target", ["", None, "/a\nb", 5])
def test_bad_symlink_targets_are_refused(target):
    with pytest.raises(SaltInvocationError, match="symlink target must be a path"):
        seed._normalize_files({"/etc/x": {"symlink": target}})


def test_inspect_adds_files_once_it_looked(guest_root):
    fd, _ = guest_root
    files = seed._Files(seed._normalize_files({"/etc/a": "a"}))
    seen = []

    def inspect(exists):
        seen.append(exists("/usr/bin/salt-minion"))
        return {"/etc/b": {"content": "b", "mode": 0o600}}

    files.inspect = inspect
    out = seed._complete(files, lambda p: guestroot.exists(fd, p))
    assert seen == [True] and files.added == ("/etc/b",)
    assert out == {"/etc/a": (b"a", 0o644), "/etc/b": (b"b", 0o600)}


def test_a_loop_device_taken_by_another_attach_at_once_counts_as_detached(tmp_path, monkeypatch):
    """Issue 33 (a full parallel run): another test's ``losetup -f`` took /dev/loop0 the moment seeding freed
    it, and seeding waited 30 s for "its" device to detach, then failed. Real loop devices (root, as the
    suite runs); the other attach is made right after our ``losetup -d``."""
    mine, other = tmp_path / "mine.img", tmp_path / "other.img"
    for path in (mine, other):
        path.write_bytes(b"\0" * 1024 * 1024)
    run, clear, taken = tools.run, seed.clear_loop, []

    def detach_then_taken(dev):
        clear(dev)
        taken.append(run(["losetup", dev, str(other)], "the other attach").returncode)

    dev = run(["losetup", "-f", "--show", str(mine)], "attach").stdout.strip()
    ours = seed.loop_binding(dev)
    monkeypatch.setattr(seed, "clear_loop", detach_then_taken)
    monkeypatch.setattr(seed, "_wait", lambda cond, timeout: cond())  # no 30 s wait: the answer is immediate
    try:
        seed.detach(dev, ours)
        assert taken == [0] and seed.loop_binding(dev)[0] == str(other)
    finally:
        run(["losetup", "-d", dev], "cleanup", check=False)


def test_the_in_use_check_runs_qemu_img_info_capped(tmp_path, monkeypatch):
    """Issue 36 #3: this qemu-img info reads the image without -f (qemu probes it): Nova's caps too."""
    image = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "1M"], check=True)
    runs = toollimits.note_limits(monkeypatch, tmp_path)
    seed._refuse_if_in_use(str(image))
    assert runs() == [{"address space": ("1073741824", "1073741824"), "cpu time": ("30", "31")}]


def test_auto_tries_a_loop_device_before_a_daemon_for_a_raw_image():
    """A raw image needs no qemu-storage-daemon between it and the loop device (issue #40: ~20 ms a
    seeding); every other format keeps the order, and every backend is still tried."""
    assert seed.auto_order("raw") == ("libguestfs", "qemu-nbd", "loop", "qsd-fuse")
    assert seed.auto_order("qcow2") == seed.BACKENDS == ("libguestfs", "qemu-nbd", "qsd-fuse", "loop")
    assert sorted(seed.auto_order("raw")) == sorted(seed.BACKENDS)


@pytest.mark.parametrize(
    "fstype, fresh, extra",
    [("ext4", True, ["barrier=0"]), ("ext4", False, []), ("xfs", True, ["nouuid"]), ("btrfs", True, [])],
)
def test_a_fresh_ext4_image_is_mounted_without_cache_flushes(fstype, fresh, extra):
    """Issue 40: an image virt.init made just now mounts ext4 with ``barrier=0`` (its journal commits flushed
    the image through FUSE and qemu-storage-daemon each time; it is flushed once after the unmount); any other
    image keeps them. Always: no devices, setuid or exec, no access times written."""
    assert seed.mount_options(fstype, fresh) == ["nodev", "nosuid", "noexec", "noatime", *extra]


def test_a_loop_device_is_detached_without_starting_losetup(tmp_path, monkeypatch):
    """Issue 40: seeding detaches its loop devices with losetup's ioctl itself (one process less a seeding);
    a device that is not attached is an error, as with ``losetup -d``. Real loop devices (root)."""
    image = tmp_path / "disk.img"
    image.write_bytes(b"\0" * 1024 * 1024)
    run, started = tools.run, []
    dev = run(["losetup", "-f", "--show", str(image)], "attach").stdout.strip()
    ours = seed.loop_binding(dev)
    monkeypatch.setattr(tools, "run", lambda cmd, *a, **kw: (started.append(cmd[0]), run(cmd, *a, **kw))[1])
    try:
        assert ours and ours[0] == str(image)
        seed.detach(dev, ours)
        assert seed.loop_binding(dev) != ours and started == []
        with pytest.raises(CommandExecutionError, match=f"detaching {dev} failed"):
            seed.clear_loop(dev)
    finally:
        run(["losetup", "-d", dev], "cleanup", check=False)
