"""Paths inside a mounted guest root, given as a directory fd: resolve, test, write (layer 7).

Every path resolves inside the guest: a guest symlink (absolute or relative, ``..`` included) never leads
to the host, and a file is written through a temp file + rename in its guest-resolved directory, owned by
root with its mode. ``seed`` uses it for the loop, qsd-fuse and qemu-nbd backends (libguestfs resolves in
its appliance). May import: ``base``.
"""

import contextlib
import os
import stat
from collections.abc import Mapping

from salt.exceptions import CommandExecutionError

from saltvirt.base import fsutil


class GuestError(Exception):
    """The image's content is the problem: every other backend would fail the same way."""


class Link(str):
    """A symlink to write into the guest (its target), instead of a file's content."""

    __slots__ = ()


def exists(root: int, path: str, depth: int = 0) -> bool:
    """Whether ``path`` exists in the guest whose root is the fd ``root`` (symlinks resolved inside it)."""
    parts = path.strip("/").split("/")
    try:
        dfd = open_dir(root, parts[:-1], create=False)
    except (OSError, GuestError):
        return False
    try:
        st = os.lstat(parts[-1], dir_fd=dfd)
        if not stat.S_ISLNK(st.st_mode):
            return True
        target = os.readlink(parts[-1], dir_fd=dfd)
        if depth >= 40:
            return False
        if not target.startswith("/"):
            target = os.path.normpath("/" + "/".join(parts[:-1] + [target]))
        return exists(root, target, depth + 1)
    except OSError:
        return False
    finally:
        os.close(dfd)


# writing -----------------------------------------------------------------------------------------
def open_dir(root: int, parts: list[str], create: bool) -> int:
    """Open directory ``/parts...`` of the guest whose root is the fd ``root``; symlinks resolve inside
    the guest, missing directories are created (0755) when ``create``. Returns a new fd."""
    stack, todo, links = [os.dup(root)], list(parts), 0
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        while todo:
            comp = todo.pop(0)
            if comp in ("", ".") or (comp == ".." and len(stack) == 1):
                continue
            if comp == "..":
                os.close(stack.pop())
                continue
            try:
                st = os.lstat(comp, dir_fd=stack[-1])
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(comp, 0o755, dir_fd=stack[-1])
                stack.append(os.open(comp, flags, dir_fd=stack[-1]))
                os.fchmod(stack[-1], 0o755)
                continue
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > 40:
                    raise GuestError(f"too many symlinks resolving /{'/'.join(parts)} in the guest")
                target = os.readlink(comp, dir_fd=stack[-1])
                while target.startswith("/") and len(stack) > 1:
                    os.close(stack.pop())
                todo[:0] = target.split("/")
            elif stat.S_ISDIR(st.st_mode):
                stack.append(os.open(comp, flags, dir_fd=stack[-1]))
            else:
                raise GuestError(f"/{'/'.join(parts)}: {comp} is not a directory in the guest")
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


def has_etc(root: int) -> bool:
    try:
        os.close(open_dir(root, ["etc"], create=False))
        return True
    except (FileNotFoundError, GuestError):
        return False


def written_back(root: int, label: str) -> None:
    """Write the guest's filesystem back to its device now, and fail if that failed: the unmount that
    follows succeeds even when the device (a loop device on a full host filesystem) refused the blocks,
    and the guest's files would be lost silently (its journal aborted)."""
    try:
        fsutil.syncfs(root)
    except OSError as exc:
        raise CommandExecutionError(
            f"writing the guest's files back to {label} failed: {exc.strerror} (the guest filesystem in the image "
            "may be damaged now)"
        ) from None


def write_files(root: int, files: Mapping[str, tuple[bytes | Link, int]]) -> None:
    """Each file via a temp file + rename in its (guest-resolved) directory. No fsync per file: the
    caller writes the whole filesystem back once (:func:`written_back`, which fails on a write error),
    and the image is then flushed (qemu-storage-daemon) or fsynced (loop) before the VM is defined."""
    for path, (content, mode) in files.items():
        parts = path.strip("/").split("/")
        dfd = open_dir(root, parts[:-1], create=True)
        name, tmp = parts[-1], f".{parts[-1]}.salt-virt-tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(content, Link):
                write_link(dfd, tmp, name, content, path)
                continue
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            try:
                view = memoryview(content)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchown(fd, 0, 0)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            try:
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except IsADirectoryError:
                os.unlink(tmp, dir_fd=dfd)
                raise GuestError(f"{path} is a directory in the guest") from None
        finally:
            os.close(dfd)


def write_link(dfd: int, tmp: str, name: str, target: str, path: str) -> None:
    """A symlink ``name`` -> ``target`` in the directory fd ``dfd``; replaces only a symlink."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISLNK(os.lstat(name, dir_fd=dfd).st_mode):
            raise GuestError(f"{path} exists in the guest and is not a symlink: not replacing it")
    os.symlink(target, tmp, dir_fd=dfd)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    os.fsync(dfd)
