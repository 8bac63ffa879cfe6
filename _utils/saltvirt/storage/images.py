"""Disk images: inspect, fetch/cache, clone (full copy or qcow2 overlay), create, grow, and the
ownership manifest that lets ``virt.purge`` prove a file belongs to a VM.

Rules kept here:
* never overwrite: every file this module creates is created exclusively (O_EXCL) first, and on
  failure only that file is removed again;
* never delete a file unless the VM's manifest (``<vm_dir>/.salt-virt.json``) lists it, it lies inside
  the VM's directory (after resolving symlinks) and no other image in the images tree backs onto it;
* a qcow2 overlay always records its backing format (``-F``): qemu must never probe a backing file.
"""

import contextlib
import datetime
import fcntl
import json
import logging
import os
import stat
import struct
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import tools, validate
from saltvirt.base.fsutil import atomic_write
from saltvirt.base.salttypes import Data
from saltvirt.model.vmspec import DISK_FORMATS

log = logging.getLogger(__name__)

MANIFEST = ".salt-virt.json"
MIB = 1048576


# helpers ---------------------------------------------------------------------------------------
def run_tool(
    cmd: Sequence[str], what: str, timeout: float = 3600, limits: tools.Limits | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; raise CommandExecutionError naming ``what`` on failure (qemu-img and friends: the
    install hint names qemu-utils)."""
    return tools.run(cmd, what, timeout=timeout, install="qemu-utils", limits=limits)


def abs_path(path: str, what: str) -> str:
    """An absolute, normalized path without '..' components (SaltInvocationError otherwise)."""
    return os.path.normpath(validate.absolute_path(path, what))


def existing_image(path: str, what: str = "image") -> str:
    """``path`` made absolute (:func:`abs_path`), refused unless it is a regular file."""
    path = abs_path(path, what)
    if not os.path.isfile(path):
        raise SaltInvocationError(f"{what} {path} does not exist or is not a regular file")
    return path


def new_file(path: str, what: str) -> str:
    """Create ``path`` exclusively (the placeholder a tool then writes into). Never overwrites."""
    path = abs_path(path, what)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise SaltInvocationError(f"directory {parent} for {what} {path} does not exist: create it first")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise SaltInvocationError(
            f"{what} {path} already exists: refusing to overwrite it. Remove it yourself if it is not needed"
        ) from None
    os.close(fd)
    return path


@contextlib.contextmanager
def _created(path):
    """Remove ``path`` (which this call created) if the block fails."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _disk_format(fmt, what="disk format"):
    if fmt not in DISK_FORMATS:
        raise SaltInvocationError(f"{what} must be one of {DISK_FORMATS}, got {fmt!r}")
    return fmt


# inspection ------------------------------------------------------------------------------------
def image_info(path: str, fmt: str | None = None) -> Data:
    """Format, sizes and the full backing chain of ``path`` (read with ``-U``: works while in use).
    Pass ``fmt`` whenever it is known (qemu then never guesses; untrusted images go through
    :mod:`saltvirt.storage.intake`, which decides the format itself).

    Returns ``{path, format, virtual_size, actual_size, backing_file, backing_format, chain}`` where
    ``backing_file`` is absolute and ``chain`` lists ``path`` followed by every backing file.
    """
    path = os.path.abspath(existing_image(path))
    fmt_args = ["-f", _disk_format(fmt)] if fmt else []
    proc = run_tool(
        ["qemu-img", "info", "--output=json", "-U", *fmt_args, "--backing-chain", path],
        f"reading image {path}",
        timeout=120,
        limits=tools.QEMU_IMG_INFO_LIMITS,
    )
    try:
        layers = json.loads(proc.stdout)
    except ValueError:
        raise CommandExecutionError(f"qemu-img info {path} returned unreadable output: {proc.stdout[:200]!r}") from None
    if isinstance(layers, dict):
        layers = [layers]
    top = layers[0]
    chain = [path]
    for layer in layers[:-1]:
        chain.append(layer.get("full-backing-filename") or layer.get("backing-filename"))
    backing = top.get("full-backing-filename") or top.get("backing-filename")
    if backing and not os.path.isabs(backing):
        backing = os.path.join(os.path.dirname(path), backing)
    return {
        "path": path,
        "format": top.get("format"),
        "virtual_size": top.get("virtual-size"),
        "actual_size": top.get("actual-size"),
        "backing_file": backing,
        "backing_format": top.get("backing-filename-format"),
        "chain": chain,
    }


def qcow2_backing(path: str) -> str | None:
    """The backing file named in a qcow2 header (absolute), or None. Reads 4 KiB; no qemu, no locks."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(24)
            if len(head) < 24 or head[:4] != b"QFI\xfb":
                return None
            offset, size = struct.unpack(">QI", head[8:20])
            if not offset or not 0 < size < 4096:
                return None
            fh.seek(offset)
            name = fh.read(size).decode("utf-8", "replace")
    except OSError:
        return None
    if "://" in name or name.startswith("json:"):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), name))


def qcow2_virtual_size(path: str) -> int:
    """The virtual size a qcow2 header records (bytes; its bytes 24-31): no qemu-img process, which costs
    more than the read on a loaded host. Raises CommandExecutionError for a file that is not qcow2."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(32)
    except OSError as exc:
        raise CommandExecutionError(f"cannot read {path}: {exc.strerror}") from None
    if len(head) < 32 or head[:4] != b"QFI\xfb":
        raise CommandExecutionError(f"{path} is not a qcow2 image")
    return struct.unpack(">Q", head[24:32])[0]


FLOCK = "hh4xqqi4x"  # struct flock (Linux x86_64/aarch64): type, whence, start, len, pid (fcntl OFD locks)


def held_qemu_locks(path: str, offsets: Iterable[int] = (101, 201)) -> list[int]:
    """Which of qemu's lock bytes other processes hold on ``path``: 101 = someone (a running VM) may
    write it, 201 = someone forbids writers (e.g. a VM reading it as a qcow2 backing file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        held = []
        for offset in offsets:
            probe = struct.pack(FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
            if struct.unpack(FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0] != fcntl.F_UNLCK:
                held.append(offset)
        return held
    finally:
        os.close(fd)


# small file helpers (the images manifest, intake's download metadata) -------------------------
def read_json(path: str) -> Data | None:
    """The JSON object in ``path`` (never through a symlink); None when it is missing, unreadable or no object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "r") as fh:
            data = json.load(fh)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def write_json(path: str, data: Data, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + rename)."""
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    atomic_write(path, text.encode(), mode, fsync=True, prefix=f".{os.path.basename(path)}.", suffix=".tmp")


def timestamp() -> str:
    """Now in UTC as the manifests and download metadata record it (``2026-11-29T10:44:58Z``)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# create ----------------------------------------------------------------------------------------
def clone(src: str, dst: str, overlay: bool = False, fmt: str | None = None, src_fmt: str | None = None) -> Data:
    """Copy ``src`` to the new file ``dst`` (full copy) or create ``dst`` as a qcow2 overlay on it.

    ``src_fmt``: the source's format as :func:`saltvirt.storage.intake.probe` decided it (never guessed then).
    Never overwrites ``dst``. Returns ``{path, format, overlay, backing, seconds}``.
    """
    started = time.monotonic()
    src = os.path.abspath(existing_image(src, "source image"))
    dst = abs_path(dst, "destination disk")
    if os.path.lexists(dst):
        raise SaltInvocationError(f"destination disk {dst} already exists: refusing to overwrite it")
    if src_fmt is None:
        src_fmt = image_info(src)["format"]
    if overlay:
        if fmt not in (None, "qcow2"):
            raise SaltInvocationError(f"an overlay is always qcow2, not {fmt!r}: drop fmt or use a full copy")
        fmt = "qcow2"
    else:
        fmt = _disk_format(fmt or src_fmt, f"target format (the source {src} is {src_fmt}; pass fmt='qcow2' or 'raw')")
    new_file(dst, "destination disk")
    with _created(dst):
        if overlay:
            cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", src_fmt, "-b", src, dst]
            run_tool(cmd, f"creating overlay {dst} on {src}", timeout=300)
        elif src_fmt == "raw" and fmt == "raw":
            if held_qemu_locks(src, (101,)):  # cp takes no locks (qemu-img convert checks this itself)
                raise CommandExecutionError(f"copying {src} failed: it is in use by a running VM: shut it down first")
            run_tool(["cp", "--reflink=auto", "--sparse=always", src, dst], f"copying {src} to {dst}")
        else:
            run_tool(["qemu-img", "convert", "-f", src_fmt, "-O", fmt, src, dst], f"copying {src} to {dst}")
    return {
        "path": dst,
        "format": fmt,
        "overlay": bool(overlay),
        "backing": src if overlay else None,
        "seconds": round(time.monotonic() - started, 3),
    }


def create_disk(path: str, size_mb: Any, fmt: str = "qcow2") -> Data:
    """Create a new blank disk (sparse) of ``size_mb`` MiB. Never overwrites."""
    started = time.monotonic()
    size = validate.positive_int(size_mb, "disk size (MiB)")
    fmt = _disk_format(fmt)
    path = new_file(path, "disk")
    with _created(path):
        run_tool(["qemu-img", "create", "-q", "-f", fmt, path, f"{size}M"], f"creating disk {path}", timeout=300)
    return {
        "path": path,
        "format": fmt,
        "overlay": False,
        "backing": None,
        "size_mb": size,
        "seconds": round(time.monotonic() - started, 3),
    }


def resize(path: str, size_mb: Any, fmt: str | None = None) -> Data:
    """Grow ``path`` to ``size_mb`` MiB (the filesystem inside is not touched). Never shrinks."""
    size = validate.positive_int(size_mb, "disk size (MiB)")
    info = image_info(path, fmt)
    old = info["virtual_size"]
    if size * MIB < old:
        raise SaltInvocationError(
            f"cannot shrink {info['path']} from {old // MIB} MiB to {size} MiB (that would destroy data): only grow"
        )
    if size * MIB == old:
        return {"path": info["path"], "old_size": old, "new_size": old, "changed": False}
    cmd = ["qemu-img", "resize", "-q", "-f", info["format"], info["path"], f"{size}M"]
    run_tool(cmd, f"resizing {info['path']}", timeout=300)
    return {"path": info["path"], "old_size": old, "new_size": size * MIB, "changed": True}


# ownership manifest ----------------------------------------------------------------------------
def _manifest_file(vm_dir):
    return os.path.join(vm_dir, MANIFEST)


@contextlib.contextmanager
def _locked(vm_dir):
    """Serialize manifest updates: flock on the directory itself (no extra lock file left behind)."""
    fd = os.open(vm_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_manifest(vm_dir: str, strict: bool = False) -> Any:
    path = _manifest_file(vm_dir)
    if not os.path.lexists(path):
        return None
    data = read_json(path)
    if data is None or not (isinstance(data.get("vm"), str) and isinstance(data.get("files"), list)):
        if strict:
            raise CommandExecutionError(
                f"ownership manifest {path} is unreadable or not a salt-virt manifest: fix or remove it by hand"
            )
        log.warning("ignoring unreadable ownership manifest %s", path)
        return None
    data["files"] = [f for f in data["files"] if isinstance(f, str) and os.path.isabs(f)]
    return data


def _check_owner(manifest, vm_dir, vm_name, vm_uuid):
    """None if ``manifest`` belongs to this VM, else the reason why not."""
    if manifest is None:
        return f"no ownership manifest {_manifest_file(vm_dir)}: salt-virt did not create these files"
    if manifest["vm"] != vm_name:
        return f"{vm_dir} belongs to VM {manifest['vm']!r} according to its manifest, not to {vm_name!r}"
    if manifest.get("uuid") and vm_uuid and manifest["uuid"] != vm_uuid:
        return (
            f"the manifest in {vm_dir} records VM uuid {manifest['uuid']}, this VM is {vm_uuid}: "
            "the files belong to another VM of that name (an earlier one, or one a hypervisor sharing this "
            "directory runs)"
        )
    return None


def _inside(vm_dir, path):
    """True if ``path`` is inside ``vm_dir`` after resolving every symlink, and is not a symlink itself."""
    return validate.is_inside(path, vm_dir) and not os.path.islink(path)


@contextlib.contextmanager
def _recording(vm_dir, vm_name, vm_uuid, what, host=None):
    """This VM's manifest (a new one if there is none; refused if it names another VM) for the caller to
    add ``what`` to, under the directory's lock; then bound to ``vm_uuid`` and written back (mode 0600).
    ``host``: the minion id of the hypervisor creating the VM, recorded when the manifest has none (a
    cleanup on another host sharing the directory then knows the files are not its own)."""
    if not os.path.isdir(vm_dir):
        raise SaltInvocationError(f"VM directory {vm_dir} does not exist")
    with _locked(vm_dir):
        manifest = load_manifest(vm_dir, strict=True)
        if manifest is not None:
            reason = _check_owner(manifest, vm_dir, vm_name, vm_uuid)
            if reason:
                raise SaltInvocationError(f"cannot record {what} for {vm_name!r}: {reason}")
        else:
            manifest = {"vm": vm_name, "uuid": None, "files": [], "created": timestamp()}
        yield manifest
        if vm_uuid:
            manifest["uuid"] = vm_uuid
        if host and not manifest.get("host"):
            manifest["host"] = host
        write_json(_manifest_file(vm_dir), manifest, mode=0o600)


def record_owned(
    vm_dir: str,
    vm_name: str,
    files: Iterable[str],
    vm_uuid: str | None = None,
    host: str | None = None,
    complete: bool | None = None,
) -> Data:
    """Record that this VM created ``files`` (merged into ``<vm_dir>/.salt-virt.json``, mode 0600); ``host``:
    see :func:`_recording`. ``complete``: False while the VM's ``virt.init`` runs, True once it finished (a
    cleanup undefines a domain only when its init never finished; no key: an older salt-virt's manifest)."""
    if not os.path.isdir(vm_dir):
        raise SaltInvocationError(f"VM directory {vm_dir} does not exist")
    if isinstance(files, str):
        files = [files]
    files = [os.path.abspath(abs_path(f, "owned file")) for f in files]
    with _recording(vm_dir, vm_name, vm_uuid, "files", host) as manifest:
        for f in files:
            if not _inside(vm_dir, f):
                log.warning("%s is outside %s: recorded, but purge will never delete it", f, vm_dir)
            if f not in manifest["files"]:
                manifest["files"].append(f)
        if complete is not None:
            manifest["complete"] = bool(complete)
    return manifest


def set_uuid(vm_dir: str, uuid: str) -> Data:
    """Bind the manifest to the libvirt uuid of the VM once it is defined."""
    with _locked(vm_dir):
        manifest = load_manifest(vm_dir, strict=True)
        if manifest is None:
            raise CommandExecutionError(f"no ownership manifest in {vm_dir}: nothing to bind to uuid {uuid}")
        if manifest.get("uuid") and manifest["uuid"] != uuid:
            raise SaltInvocationError(f"the manifest in {vm_dir} is bound to uuid {manifest['uuid']}, not {uuid}")
        manifest["uuid"] = uuid
        write_json(_manifest_file(vm_dir), manifest, mode=0o600)
    return manifest


def record_owned_extra(vm_dir: str, vm_name: str, key: str, items: Iterable[Data], vm_uuid: str | None = None) -> Data:
    """Record other things this VM created (``key``: e.g. ``volumes``, a list of dicts) in its manifest."""
    with _recording(vm_dir, vm_name, vm_uuid, key) as manifest:
        have = manifest.setdefault(key, [])
        have.extend(i for i in items if i not in have)
    return manifest


def owned_extra(vm_dir: str, vm_name: str, key: str, vm_uuid: str | None = None) -> list[Data]:
    """The ``key`` entries of this VM's manifest ([] when it is not this VM's)."""
    if not os.path.isdir(vm_dir):
        return []
    manifest = load_manifest(vm_dir)
    if _check_owner(manifest, vm_dir, vm_name, vm_uuid):
        return []
    return [i for i in manifest.get(key) or [] if isinstance(i, dict)]


def forget_extra(vm_dir: str, vm_name: str, key: str, items: Iterable[Data], vm_uuid: str | None = None) -> None:
    """Drop ``items`` from the manifest's ``key`` (they are gone); the manifest and the empty directory
    go when nothing is left."""
    with _locked(vm_dir):
        manifest = load_manifest(vm_dir)
        if manifest is None or _check_owner(manifest, vm_dir, vm_name, vm_uuid):
            return
        manifest[key] = [i for i in manifest.get(key) or [] if i not in items]
        if not manifest[key]:
            del manifest[key]
        write_json(_manifest_file(vm_dir), manifest, mode=0o600)


def owned_files(vm_dir: str, vm_name: str, vm_uuid: str | None = None) -> list[str]:
    """Files the manifest lists for this VM that really are inside ``vm_dir`` (no symlink escapes)."""
    if not os.path.isdir(vm_dir):
        return []
    manifest = load_manifest(vm_dir)
    if _check_owner(manifest, vm_dir, vm_name, vm_uuid):
        return []
    return [f for f in manifest["files"] if _inside(vm_dir, f)]


def backing_chain(path: str, limit: int = 64) -> list[str]:
    """Every file below ``path`` in its qcow2 backing chain (realpaths, nearest first), read from the
    headers (no qemu, no locks); stops at a loop or after ``limit`` links."""
    chain, seen = [], {os.path.realpath(path)}  # type: list[str], set[str]
    backing = qcow2_backing(path)
    while backing and len(chain) < limit:
        real = os.path.realpath(backing)
        if real in seen:
            break
        seen.add(real)
        chain.append(real)
        backing = qcow2_backing(real)
    return chain


def image_files(root: str) -> list[str]:
    """Every regular file below ``root`` at any depth (symlinks neither followed nor listed)."""
    out: list[str] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        out.extend(p for p in (os.path.join(folder, f) for f in files) if os.path.isfile(p) and not os.path.islink(p))
    return out


def backing_users(images_root: str) -> dict[str, list[str]]:
    """``{backing file (realpath): [images that back onto it]}`` for every qcow2 file below
    ``images_root``, at any depth, over the whole chain (an overlay of an overlay keeps the base too):
    header reads only."""
    users: dict[str, list[str]] = {}
    for path in image_files(images_root):
        for backing in backing_chain(path):
            users.setdefault(backing, []).append(os.path.realpath(path))
    return users


def unlink_unless_backing(
    doomed: dict[str, str], users: Mapping[str, Iterable[str]], kept: dict[str, str]
) -> list[str]:
    """Delete ``doomed`` ({realpath: path as given}) except a file an image that stays backs onto
    (``users``: :func:`backing_users`); a kept image keeps its backing file, which keeps its own, ...
    The reasons go into ``kept``; returns the paths deleted."""
    doomed = dict(doomed)
    changed = True
    while changed:
        changed = False
        for real, path in list(doomed.items()):
            alive = sorted(u for u in users.get(real, ()) if u not in doomed and os.path.exists(u))
            if alive:
                kept[path] = f"backing file of {alive[0]}: delete that image first"
                del doomed[real]
                changed = True
    removed = []
    for real, path in doomed.items():
        try:
            os.unlink(real)
            removed.append(path)
        except OSError as exc:
            kept[path] = f"could not delete: {exc.strerror}"
    return removed


def remove_owned(vm_dir: str, vm_name: str, vm_uuid: str | None, candidate_paths: Iterable[str]) -> Data:
    """Delete those of ``candidate_paths`` this VM owns and nothing else backs onto.

    Returns ``{'removed': [paths], 'kept': {path: reason}}``. The manifest and ``vm_dir`` go away only
    when nothing is left in the directory.
    """
    removed, kept = [], {}
    if isinstance(candidate_paths, str):
        candidate_paths = [candidate_paths]
    candidates = list(dict.fromkeys(candidate_paths or []))
    if not os.path.isdir(vm_dir):
        return {"removed": [], "kept": {c: f"VM directory {vm_dir} does not exist" for c in candidates}}
    with _locked(vm_dir):
        manifest = load_manifest(vm_dir)
        not_ours = _check_owner(manifest, vm_dir, vm_name, vm_uuid)
        owned = {os.path.realpath(f) for f in manifest["files"] if _inside(vm_dir, f)} if not not_ours else set()
        doomed = {}
        for path in candidates:
            if not isinstance(path, str) or not os.path.isabs(path):
                kept[str(path)] = "not an absolute path"
            elif not_ours:
                kept[path] = not_ours
            elif not _inside(vm_dir, path):
                kept[path] = f"outside {vm_dir}: salt-virt never deletes files outside the VM's directory"
            elif os.path.realpath(path) not in owned:
                kept[path] = f"not listed in {_manifest_file(vm_dir)}: salt-virt did not create it for this VM"
            elif not os.path.lexists(path):
                kept[path] = "already gone"
            elif not stat.S_ISREG(os.lstat(path).st_mode):
                kept[path] = "not a regular file"
            else:
                doomed[os.path.realpath(path)] = path
        users = backing_users(os.path.dirname(os.path.realpath(vm_dir))) if doomed else {}
        removed += unlink_unless_backing(doomed, users, kept)
        if not not_ours:
            left = [f for f in manifest["files"] if os.path.lexists(f) and _inside(vm_dir, f)]
            if left or manifest.get("volumes"):  # volumes it owns keep the manifest (see saltvirt.storage.volumes)
                manifest["files"] = left
                write_json(_manifest_file(vm_dir), manifest, mode=0o600)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_manifest_file(vm_dir))
                with contextlib.suppress(OSError):
                    os.rmdir(vm_dir)  # only succeeds when empty
    return {"removed": removed, "kept": kept}
