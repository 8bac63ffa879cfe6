"""Small file-system helpers shared by the library."""

import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Collection
from typing import Any, overload

log = logging.getLogger(__name__)


def atomic_write(
    path: str,
    data: bytes,
    mode: int,
    gid: int | None = None,
    fsync: bool = False,
    prefix: str = ".tmp-",
    suffix: str = "",
) -> None:
    """Write bytes ``data`` to ``path`` via a temp file in the same directory and a rename. The temp
    file has its final ``mode`` (and group ``gid``) before any byte is written, so a key is never
    readable by others, and readers see the old or the new file, never a partial one."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=prefix, suffix=suffix)
    try:
        os.fchmod(fd, mode)
        if gid is not None:
            os.fchown(fd, -1, gid)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def file_digest(path: str, algo: str = "sha256") -> str:
    """Hex digest of a file's content (read in 1 MiB blocks)."""
    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def remove_paths(paths: Collection[str]) -> tuple[list[str], list[dict[str, str | None]]]:
    """Remove files first, then directories (deepest first, only if empty): ``(removed, kept)``, where
    ``kept`` lists ``{path, reason}`` of what could not be removed; a path already gone is skipped."""
    removed, kept = [], []
    dirs = sorted((p for p in paths if os.path.isdir(p) and not os.path.islink(p)), key=len, reverse=True)
    for path in [p for p in paths if p not in dirs] + dirs:
        try:
            (os.rmdir if path in dirs else os.unlink)(path)
            removed.append(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            kept.append({"path": path, "reason": exc.strerror})
    return removed, kept


@overload
def read_text(path: str, default: str = "", encoding: str = "utf-8") -> str: ...
@overload
def read_text(path: str, default: None, encoding: str = "utf-8") -> str | None: ...
def read_text(path: str, default: str | None = "", encoding: str = "utf-8") -> str | None:
    """The text of a small file (a /sys attribute, a marker), stripped; ``default`` when it cannot be read."""
    try:
        with open(path, encoding=encoding) as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return default


def sha256(data: str | bytes) -> str:
    """Hex SHA-256 of ``data`` (str as UTF-8, or bytes): key fingerprints as `sha256sum` shows them,
    content hashes in manifests."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def identity(path: str) -> list[int] | None:
    """What tells that a file changed since it was last looked at: device, inode, size, mtime (a write moves the
    mtime, a replacement the inode; not the ctime, which chown, chmod and xattrs move too). None: no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once, with errno kept for :func:`_checked`."""
    return ctypes.CDLL(None, use_errno=True)


def _checked(ret: int, *filename: str) -> None:
    """Raise OSError with the kernel's errno (and ``filename``) when a libc call returned non-zero."""
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), *filename)


def syncfs(fd: int) -> None:
    """Write back the whole filesystem that ``fd`` (any file or directory on it) lives on, and raise
    OSError with the errno of any write-back that failed since ``fd`` was opened (Linux >= 5.8 reports
    those; ``os.sync()`` reports nothing). A filesystem whose device ran out of room (a loop device on a
    full host filesystem) says ENOSPC here, while its unmount succeeds and loses the data."""
    _checked(_libc().syncfs(fd))


SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writing back, do not wait


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Have the kernel start writing ``length`` bytes of ``fd`` at ``offset`` to disk, without waiting
    (``sync_file_range``): a file written in one stream and fsynced at its end then waits at the fsync
    for the last stretch only. A hint: False where it is refused (the fsync reports real write errors)."""
    call = _libc().sync_file_range
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return call(fd, offset, length, SYNC_FILE_RANGE_WRITE) == 0


# a full filesystem, or a full quota: the errnos, and what host tools say for them (they speak C's English:
# saltvirt.base.tools runs them so, whatever the host's locale)
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_TEXTS = ("No space left on device", "Disk quota exceeded")
ALMOST_FULL = 1048576  # bytes: less than this free counts as full


def out_of_space(exc: BaseException, *paths: str) -> bool:
    """Whether ``exc`` means a filesystem ran out of room: an OSError with ENOSPC/EDQUOT in its chain (its
    cause or the error it was raised while handling), a host tool's message saying so (tools run in the C
    locale), or one of ``paths``' filesystems has (almost) no room left now (a loop or FUSE device reports
    EIO as often as ENOSPC; root may use the blocks reserved for it)."""
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return True
        if any(text in str(err) for text in NO_SPACE_TEXTS):
            return True
        err = err.__cause__ or err.__context__
    return any(almost_full(path) for path in paths)


def almost_full(path: str) -> bool:
    """Whether the filesystem of ``path`` has less than :data:`ALMOST_FULL` bytes free for this process."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return free * st.f_frsize < ALMOST_FULL


def unescape_mount(field: str) -> str:
    """A /proc/self/mountinfo path field: the kernel writes space, tab, newline and backslash as ``\\ooo``."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_points(pid: int | str = "self") -> set[str]:
    """The mount points of process ``pid``'s mount namespace (``/proc/<pid>/mountinfo``, unescaped)."""
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as fh:
        return {unescape_mount(line.split()[4]) for line in fh}


def mount_of(path: str) -> tuple[str, str]:
    """``(mount point, filesystem type)`` of the mount holding ``path`` (symlinks resolved) in this
    mount namespace (the last mount on a point is the one seen)."""
    real = os.path.realpath(path)
    best = ("/", "unknown")
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            point = unescape_mount(parts[4])
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, parts[parts.index("-") + 1])
    return best


def ours_alone(path: str, others: int = 0o022) -> bool:
    """``path`` is a directory (never a link) this user owns and no one else has the ``others`` bits of
    (0o022: may write to: an answer read from it can be trusted; 0o077: may even enter: private keys)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & others


def load_own_json(directory: str, name: str, others: int = 0o022) -> dict[str, Any]:
    """The JSON object kept in ``directory``/``name``, trusted only when the directory (:func:`ours_alone`) and the
    file are this user's and no one else has the ``others`` bits of the file; else, or when it holds no JSON
    object, ``{}``: a cache its writer then rewrites."""
    if not ours_alone(directory):
        return {}
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & others:
            log.warning("ignoring %s: not this user's alone (it is rewritten)", fh.name)
            return {}
        try:
            data = json.loads(fh.read())
        except ValueError:
            return {}
    return data if isinstance(data, dict) else {}
