"""saltvirt.vm.backuppull and saltvirt.storage.nbdread against a real QEMU NBD server: qemu-storage-daemon
exporting a qcow2 disk over a unix socket, as a libvirt pull-mode job has QEMU do (the job itself, with
libvirt and a running guest: tests/integration/test_backup_real.py)."""

import errno
import hashlib
import os
import resource
import signal
import subprocess
import time

import pytest

from saltvirt.storage import nbdread
from saltvirt.vm import backup, backuppull
from tests.support import nbdserve

MIB = 1 << 20


def compare(url, path):
    """qemu-img compare of the export (raw) with a backup file: 0 when identical."""
    cmd = ["qemu-img", "compare", "-U", "-f", "raw", "-F", "qcow2", url, path]
    return subprocess.run(cmd, capture_output=True, check=False)


def qemu_io(target, command, fmt="qcow2"):
    out = subprocess.run(["qemu-io", "-f", fmt, "-c", command, target], capture_output=True, text=True, check=True)
    return out.stdout


@pytest.fixture
def served(tmp_path):
    """A 40 MiB qcow2 disk with data at 0 and 9 MiB, zeros written at 20 MiB, and a persistent dirty bitmap
    'bm0' added after that data; served read-write (so writes mark the bitmap) as export 'disk'."""
    disk, sock = str(tmp_path / "d.qcow2"), str(tmp_path / "s.sock")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "40M"], check=True)
    qemu_io(disk, "write -P 0x11 0 1M")
    qemu_io(disk, "write -P 0x22 9M 200k")
    qemu_io(disk, "write -z 20M 1M")
    subprocess.run(["qemu-img", "bitmap", "--add", disk, "bm0"], check=True)
    with nbdserve.serve(disk, sock, ("bm0",)) as url:
        yield disk, sock, url


def test_a_full_copy_is_the_disk_and_its_digest_is_taken_as_it_is_written(served, tmp_path):
    disk, sock, url = served
    out = str(tmp_path / "1.vda.qcow2")
    digest = backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, out, None, time.monotonic() + 60)
    assert digest == hashlib.sha256(open(out, "rb").read()).hexdigest()  # noqa: SIM115 - a test's one read
    assert compare(url, out).returncode == 0
    assert subprocess.run(["qemu-img", "check", out], capture_output=True, check=False).returncode == 0
    assert os.path.getsize(out) < 3 * MIB  # the zeros and holes are not copied
    assert os.stat(out).st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):  # never over an existing file
        backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, out, None, time.monotonic() + 60)


def test_an_incremental_copy_holds_the_dirty_clusters_over_its_parent(served, tmp_path):
    disk, sock, url = served
    full = str(tmp_path / "1.vda.qcow2")
    backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, full, None, time.monotonic() + 60)
    qemu_io(url, "write -P 0x33 30M 100k", fmt="raw")  # the guest's write after the checkpoint
    inc = str(tmp_path / "2.vda.qcow2")
    digest = backuppull.copy_export(sock, "disk", "qemu:dirty-bitmap:bm0", inc, "1.vda.qcow2", time.monotonic() + 60)
    assert digest == hashlib.sha256(open(inc, "rb").read()).hexdigest()  # noqa: SIM115
    assert backup.images.qcow2_backing(inc) == full
    assert compare(url, inc).returncode == 0
    assert os.path.getsize(inc) < 8 * 65536  # two clusters of data and the metadata


def test_a_copy_past_its_deadline_stops(served, tmp_path):
    _disk, sock, _url = served
    with pytest.raises(Exception, match="ran past its time"):
        backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, str(tmp_path / "x.qcow2"), None, time.monotonic())


def test_what_a_backup_copies_and_where_its_scratch_goes():
    allocation = [(0, 10, 0), (10, 5, nbdread.STATE_HOLE | nbdread.STATE_ZERO), (15, 5, nbdread.STATE_HOLE)]
    assert backuppull.wanted(allocation, incremental=False) == [(0, 10), (15, 5)]  # a hole not known as zeros
    dirty = [(0, 10, 0), (10, 5, nbdread.STATE_DIRTY), (15, 5, 0)]
    assert backuppull.wanted(dirty, incremental=True) == [(10, 5)]
    assert backuppull.scratch_file("/b/vm/u/20260101T000000Z.vda.qcow2") == "/b/vm/u/20260101T000000Z.vda.scratch.qcow2"


def test_the_depth_setting_reaches_the_nbd_reads(served, tmp_path, monkeypatch):
    assert backup.configured_depth({"virt": {}}) == backuppull.DEPTH == 1
    assert backup.configured_depth({"virt": {"backup": {"pull_depth": 8}}}) == 8
    for bad in (17, -1, "many"):
        with pytest.raises(Exception, match="pull_depth"):
            backup.configured_depth({"virt": {"backup": {"pull_depth": bad}}})
    _disk, sock, url = served
    depths, real = [], nbdread.Client.reads

    def spy(self, ranges, buffer, depth=4):
        depths.append(depth)
        return real(self, ranges, buffer, depth)

    monkeypatch.setattr(nbdread.Client, "reads", spy)
    monkeypatch.setattr(backuppull, "CHUNK", 65536)  # many reads of one cluster: several in flight at once
    out = str(tmp_path / "b.qcow2")
    digest = backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, out, None, time.monotonic() + 60, depth=5)
    assert depths == [5]
    assert digest == hashlib.sha256(open(out, "rb").read()).hexdigest()  # noqa: SIM115
    assert compare(url, out).returncode == 0


def test_the_mode_setting():
    assert backup.configured_mode({"virt": {}}) == "pull"
    assert backup.configured_mode({"virt": {"backup": {"mode": "push"}}}) == "push"
    with pytest.raises(Exception, match="must be 'pull' or 'push'"):
        backup.configured_mode({"virt": {"backup": {"mode": "fast"}}})


def test_a_failing_write_stops_the_copy_with_its_error(served, tmp_path):
    """The writing thread's error reaches the caller (no hang, no half file counted): a real EFBIG from
    the kernel, a file size limit of 1 MiB for this process while the copy runs."""
    _disk, sock, _url = served
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (MIB, old_limit[1]))
    try:
        with pytest.raises(OSError) as err:
            out = str(tmp_path / "y.qcow2")
            backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, out, None, time.monotonic() + 60)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert err.value.errno == errno.EFBIG


def test_the_copy_starts_the_write_back_of_what_it_wrote_as_it_goes(served, tmp_path, monkeypatch):
    """Write-back is started stretch by stretch while the copy runs (the fsync at its end then waits for
    the last stretch only): a spy that passes each call on to the real sync_file_range."""
    _disk, sock, _url = served
    started = []

    def spy(fd, offset, length):
        started.append((offset, length))
        return real(fd, offset, length)

    real = backuppull.fsutil.start_writeback
    monkeypatch.setattr(backuppull.fsutil, "start_writeback", spy)
    monkeypatch.setattr(backuppull, "WRITEBACK", 256 * 1024)
    out = str(tmp_path / "w.qcow2")
    backuppull.copy_export(sock, "disk", nbdread.ALLOCATION, out, None, time.monotonic() + 60)
    size = os.path.getsize(out)
    assert len(started) >= 3 and started[0][0] == 0
    assert all(a + n == b for (a, n), (b, _m) in zip(started, started[1:], strict=False))  # one stretch after another
    assert size - 256 * 1024 < started[-1][0] + started[-1][1] <= size
