"""saltvirt.base.mountns: mounts seen only through their own namespace, gone with it. Real mounts and loop
devices (root, as the suite runs)."""

import os
import subprocess
import time

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.base.mountns import PrivateMounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")


def host_mounts():
    with open("/proc/self/mountinfo") as fh:
        return [line.split()[4] for line in fh]


def test_a_private_mount_is_seen_only_through_its_namespace(tmp_path):
    point = str(tmp_path / "point")
    os.mkdir(point)
    ns = PrivateMounts()
    try:
        ns.mount("svmountns", point, "tmpfs", ["nodev", "nosuid", "noexec", "size=1m"])
        assert ns.mounted(point) and point not in host_mounts()
        with open(f"/proc/{ns.pid}/mountinfo") as fh:
            (line,) = [ln for ln in fh if ln.split()[4] == point]
        assert {"nodev", "nosuid", "noexec"} <= set(line.split()[5].split(","))
        with open(os.path.join(ns.path(point), "f"), "w") as fh:
            fh.write("in the mount")
            with pytest.raises(CommandExecutionError, match=f"unmounting {point} failed: .*busy"):
                ns.umount(point)  # a file open on it
        assert os.listdir(point) == []  # the host sees the empty directory under it
        ns.umount(point)
        assert not ns.mounted(point)
        with pytest.raises(CommandExecutionError, match="mounting svmountns failed: mount: .*svmountns does not exist"):
            ns.mount("svmountns", point, "no-such-fs", [])
    finally:
        ns.close()
    assert not os.path.exists(f"/proc/{ns.pid}")


def test_what_is_left_mounted_goes_with_the_namespace(tmp_path):
    point = str(tmp_path / "point")
    os.mkdir(point)
    ns = PrivateMounts()
    ns.mount("svmountns", point, "tmpfs", ["size=1m"])
    ns.close()
    assert point not in host_mounts() and not os.path.exists(f"/proc/{ns.pid}")


def test_a_namespace_made_meanwhile_keeps_no_copy(tmp_path):
    """Issue 33 (CI): a mount namespace made while a guest's filesystem was mounted on the host (a qemu
    starting, ``ip netns exec``) kept a copy of that mount, so its loop device stayed busy after the host's
    unmount and ``losetup -d`` could not free it. Mounted privately, the copy never exists."""
    image, point = str(tmp_path / "fs.img"), str(tmp_path / "point")
    os.mkdir(point)
    subprocess.run(["truncate", "-s", "8M", image], check=True)
    subprocess.run(["mkfs.ext4", "-q", image], check=True)
    dev = subprocess.run(["losetup", "-f", "--show", image], capture_output=True, text=True, check=True).stdout.strip()
    ns = PrivateMounts()
    other = None
    try:
        ns.mount(dev, point, "ext4", ["nodev"])
        other = subprocess.Popen(["unshare", "--mount", "sleep", "120"])  # made while it is mounted
        time.sleep(0.2)
        ns.umount(point)
        subprocess.run(["losetup", "-d", dev], check=True)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/sys/block/{os.path.basename(dev)}/loop/backing_file"):
            assert time.monotonic() < deadline, f"{dev} is still attached"
            time.sleep(0.05)
    finally:
        if other:
            other.kill()
            other.wait()
        ns.close()
        subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)


def test_a_holder_keeps_the_namespace_itself_and_its_mounts_go_with_it(tmp_path):
    """Issue 40: qemu-storage-daemon holds the namespace its FUSE export is mounted in (no ``cat`` helper to start
    and stop besides it): the holder is the one process in it, and what it mounted goes when it exits. Here a
    shell stands in for the daemon (``unshare`` runs it): it mounts a tmpfs in its namespace, then waits."""
    point = str(tmp_path / "point")
    os.mkdir(point)
    holder = ["sh", "-c", f"mount -t tmpfs -o size=1m svholder {point} && exec sleep 120"]
    ns = PrivateMounts(holder=holder, stdin=subprocess.DEVNULL)
    try:
        assert ns.proc.pid == ns.pid
        deadline = time.monotonic() + 10
        while not ns.mounted(point):  # what the holder mounts shows: it is in its namespace
            assert ns.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert point not in host_mounts()
        assert os.readlink(f"/proc/{ns.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        with open(f"/proc/{ns.pid}/comm") as fh:
            assert fh.read().strip() == "sleep"  # the holder itself (unshare exec'd it), no helper
    finally:
        ns.proc.terminate()
        ns.proc.wait()
        ns.close()
    assert not ns.mounted(point) and point not in host_mounts()
