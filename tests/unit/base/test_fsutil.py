"""saltvirt.base.fsutil: small file jobs every layer shares."""

import errno
import os
import subprocess

import pytest

from saltvirt.base import fsutil


def test_read_text_is_stripped_or_the_default(tmp_path):
    (tmp_path / "dev").write_text("7:0\n")
    assert fsutil.read_text(str(tmp_path / "dev")) == "7:0"
    assert fsutil.read_text(str(tmp_path / "missing")) == ""
    assert fsutil.read_text(str(tmp_path / "missing"), None) is None
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    assert fsutil.read_text(str(tmp_path / "binary"), None, "ascii") is None  # undecodable: the default


def test_atomic_write_has_its_mode_from_the_start_and_remove_paths_reports(tmp_path):
    path = tmp_path / "key.pem"
    fsutil.atomic_write(str(path), b"secret", 0o600)
    assert path.read_bytes() == b"secret" and os.stat(path).st_mode & 0o777 == 0o600
    removed, kept = fsutil.remove_paths([str(path), str(tmp_path / "gone")])
    assert removed == [str(path)] and not path.exists() and not kept


def test_syncfs_writes_back_and_raises_the_errno_of_a_failure(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fsutil.syncfs(fd) is None
    finally:
        os.close(fd)
    with pytest.raises(OSError) as err:
        fsutil.syncfs(fd)  # closed: the kernel's error comes back as OSError with its errno
    assert err.value.errno == errno.EBADF


@pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) needs root")
def test_start_writeback_is_a_hint_the_kernel_takes_or_refuses(tmp_path):
    with open(tmp_path / "f", "wb") as fh:
        fh.write(b"x" * 65536)
        fh.flush()
        assert fsutil.start_writeback(fh.fileno(), 0, 65536) is True
    r, w = os.pipe()
    try:
        assert fsutil.start_writeback(r, 0, 4096) is False  # ESPIPE: no file to write back, no exception
    finally:
        os.close(r)
        os.close(w)


def test_mount_of_is_the_innermost_mount_holding_a_path(tmp_path):
    """What virt.cleanup reads to tell a local virt:images from one other hosts may mount: the mount
    point (escaped in mountinfo: a space here) and its type, through symlinks."""
    point = tmp_path / "a mount"
    (point).mkdir()
    assert fsutil.mount_of(str(tmp_path))[1] == fsutil.mount_of("/")[1] != "tmpfs"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "svfsutil", str(point)], check=True)
    try:
        (point / "vm").mkdir()
        (tmp_path / "link").symlink_to(point / "vm")
        assert fsutil.mount_of(str(point / "vm")) == (str(point), "tmpfs")
        assert str(point) in fsutil.mount_points() and str(point) in fsutil.mount_points(os.getpid())  # unescaped
        assert fsutil.mount_of(str(tmp_path / "link")) == (str(point), "tmpfs")
        assert fsutil.mount_of(str(tmp_path / "a mount2")) != (str(point), "tmpfs")  # a prefix is not inside
    finally:
        subprocess.run(["umount", str(point)], check=True)


def test_out_of_space_by_errno_in_the_chain_by_the_c_words_or_by_the_filesystem(tmp_path):
    """What virt.init counts as a full filesystem: the errno (ENOSPC, EDQUOT) of an OSError the error was
    raised from or while handling, whatever the message says; a host tool's C words; or the filesystem of a
    path it names having (almost) no room now. Nothing else."""
    from salt.exceptions import CommandExecutionError

    try:
        try:
            with open("/dev/full", "wb") as fh:  # a real ENOSPC
                fh.write(b"x")
        except OSError:
            raise CommandExecutionError("Schreiben fehlgeschlagen: Auf dem Gerät ist kein Speicherplatz") from None
    except CommandExecutionError as exc:
        localized = exc
    assert fsutil.out_of_space(localized)
    assert fsutil.out_of_space(CommandExecutionError("copying a failed: cp: error writing 'b': Disk quota exceeded"))
    assert not fsutil.out_of_space(CommandExecutionError("copying a failed: Permission denied"), str(tmp_path))
    assert not fsutil.almost_full(str(tmp_path)) and not fsutil.almost_full(str(tmp_path / "missing"))


def test_ours_alone_takes_only_a_directory_of_ours_that_others_cannot_write_or_enter(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    assert fsutil.ours_alone(str(d)) and fsutil.ours_alone(str(d), 0o077)
    os.chmod(d, 0o755)
    assert fsutil.ours_alone(str(d)) and not fsutil.ours_alone(str(d), 0o077)  # others may enter: no private keys
    os.chmod(d, 0o775)
    assert not fsutil.ours_alone(str(d))  # the group may write: no answer read from it
    link = tmp_path / "link"
    link.symlink_to(d)
    os.chmod(d, 0o700)
    assert not fsutil.ours_alone(str(link)) and not fsutil.ours_alone(str(tmp_path / "absent"))


def test_a_files_identity_moves_with_a_write_and_a_replacement_not_with_its_mode(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"one")
    first = fsutil.identity(str(path))
    os.chmod(path, 0o444)
    assert fsutil.identity(str(path)) == first  # what libvirt's relabelling does: no change
    os.chmod(path, 0o644)
    path.write_bytes(b"two")
    assert fsutil.identity(str(path)) != first
    other = tmp_path / "g"
    other.write_bytes(b"two")
    os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    before = fsutil.identity(str(path))
    os.replace(other, path)  # same size and mtime, another file
    assert fsutil.identity(str(path)) != before
    assert fsutil.identity(str(tmp_path / "missing")) is None
