"""Small file-system helpers shared by the library."""

import contextlib
import os
import tempfile


def atomic_write(path, data, mode, gid=None, fsync=False, prefix=".tmp-", suffix=""):
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
