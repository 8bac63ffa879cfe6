"""Write files (a Salt minion's id, config and keys) into a VM's root filesystem before its first boot.

Backends, in the order ``backend='auto'`` tries them (a named backend tries only that one):
``libguestfs`` (python ``guestfs`` or ``guestfish``), ``qemu-nbd`` (needs the nbd kernel module),
``qsd-fuse`` (qemu-storage-daemon exports the image - qcow2, raw, overlays - as a file over FUSE, which
is loop-mounted) and ``loop`` (raw images only); a raw image tries ``loop`` before ``qsd-fuse``
(:func:`auto_order`). The root filesystem is the first partition (or the
whole disk) with an ``/etc``. Paths resolve inside the guest (a guest symlink never leads to the host);
files are written atomically, owned by root, with their modes. Before :func:`seed` returns everything
is unmounted and detached and qemu-storage-daemon/qemu-nbd have exited: every write is in the image.
An image in use by a running qemu (its write lock is held) is refused.
"""

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, procs, tools
from saltvirt.base.mountns import PrivateMounts
from saltvirt.base.salttypes import Data
from saltvirt.base.tools import QEMU_IMG_INFO_LIMITS
from saltvirt.base.undo import Undo
from saltvirt.guest import disklabel, guestroot
from saltvirt.model import vmargs
from saltvirt.storage import images

log = logging.getLogger(__name__)

BACKENDS = ("libguestfs", "qemu-nbd", "qsd-fuse", "loop")


def auto_order(fmt: str) -> tuple[str, ...]:
    """The backends ``auto`` tries for an image of format ``fmt``. A raw image goes to a loop device itself
    before qemu-storage-daemon's FUSE export of it: the same kernel mount in the same private namespace,
    without a daemon and FUSE in between (~20 ms less a seeding: issue #40)."""
    if fmt != "raw":
        return BACKENDS
    return ("libguestfs", "qemu-nbd", "loop", "qsd-fuse")


NOT_ROOT_FS = ("swap", "LVM2_member", "crypto_LUKS", "linux_raid_member", "zfs_member", "iso9660", "vfat", "unknown")
# What the host kernel may mount from an untrusted image (loop, qsd-fuse, qemu-nbd backends): the
# common root filesystems whose drivers are fuzzed and maintained. Anything else (minix, cramfs, hfs,
# udf, ...) is refused: a hostile image aimed at a weak filesystem driver attacks the hypervisor's
# kernel. libguestfs mounts inside its own appliance and is not limited by this list.
KERNEL_MOUNT_FS = ("ext2", "ext3", "ext4", "xfs", "btrfs", "vfat")


class _Skip(Exception):  # noqa: N818 - a signal to try the next backend, not an error
    """This backend cannot be used here (not installed, not applicable to this image)."""


class SeedError(CommandExecutionError):
    """No backend could seed the image. ``attempts`` as :func:`seed` reports them; ``clean``: every
    backend cleaned up after itself (nothing is left attached or mounted)."""

    def __init__(self, message, attempts, clean):
        super().__init__(message)
        self.attempts, self.clean = attempts, clean


# files ---------------------------------------------------------------------------------------------
def salt_minion_files(
    minion_id: str, master: Any = None, pub: str | None = None, priv: str | None = None, config: Data | None = None
) -> dict[str, Data]:
    """The files a Salt minion needs on first boot: ``{guest path: {'content': bytes, 'mode': int}}``."""
    if not isinstance(minion_id, str) or not minion_id or len(minion_id) > 255:
        raise SaltInvocationError(f"minion id must be a non-empty string, got {minion_id!r}")
    if any(c.isspace() or ord(c) < 32 for c in minion_id) or "/" in minion_id:
        raise SaltInvocationError(f"minion id {minion_id!r} must not contain '/', spaces or control characters")
    conf: Data = {"id": minion_id}
    if master:
        masters = [master] if isinstance(master, str) else master
        if not isinstance(masters, (list, tuple)) or not all(isinstance(m, str) and m.strip() for m in masters):
            raise SaltInvocationError(f"master must be a host name or a list of them, got {master!r}")
        conf["master"] = master if isinstance(master, str) else list(masters)
    if config:
        if not isinstance(config, dict):
            raise SaltInvocationError(f"minion config must be a dict, got {type(config).__name__}")
        for key in ("id", "master"):
            if key in config and key in conf and config[key] != conf[key]:
                raise SaltInvocationError(f"minion config sets {key}={config[key]!r}, {key}={conf[key]!r} was passed")
        conf.update(config)
    try:
        text = yaml.safe_dump(conf, default_flow_style=False, sort_keys=False)
    except yaml.YAMLError as exc:
        raise SaltInvocationError(f"minion config cannot be written as YAML: {exc}") from None
    files = {
        "/etc/salt/minion_id": {"content": minion_id.encode(), "mode": 0o644},
        "/etc/salt/minion.d/99-salt-virt.conf": {"content": text.encode(), "mode": 0o644},
    }
    if bool(pub) != bool(priv):
        raise SaltInvocationError("pass both the minion's public and private key, or neither")
    if pub:
        files["/etc/salt/pki/minion/minion.pem"] = {"content": _pem(priv, "PRIVATE KEY", "private"), "mode": 0o400}
        files["/etc/salt/pki/minion/minion.pub"] = {"content": _pem(pub, "PUBLIC KEY", "public"), "mode": 0o644}
    return files


def _pem(key, marker, what):
    data = key.encode() if isinstance(key, str) else key
    if not isinstance(data, bytes) or b"-----BEGIN" not in data or marker.encode() not in data:
        raise SaltInvocationError(f"the minion's {what} key must be a PEM '{marker}' (were pub and priv swapped?)")
    return data if data.endswith(b"\n") else data + b"\n"


def _normalize_files(files):
    """``{path: (bytes, mode)}`` after checking every guest path and mode."""
    if not isinstance(files, dict) or not files:
        raise SaltInvocationError("files must be a non-empty dict {guest path: {'content': bytes, 'mode': int}}")
    out: dict[str, tuple[bytes | guestroot.Link, int]] = {}
    for path, spec in files.items():
        if not isinstance(path, str) or not path.startswith("/") or path == "/":
            raise SaltInvocationError(f"guest path must be an absolute file path, got {path!r}")
        if any(ord(c) < 32 for c in path) or os.path.normpath(path) != path or ".." in path.split("/"):
            raise SaltInvocationError(f"guest path {path!r} must be normalized, without '..', NUL or control chars")
        if isinstance(spec, dict) and "symlink" in spec:
            target = spec["symlink"]
            if not isinstance(target, str) or not target or any(ord(c) < 32 for c in target):
                raise SaltInvocationError(f"{path}: symlink target must be a path, got {target!r}")
            out[path] = (guestroot.Link(target), 0o777)
            continue
        content, mode = (spec.get("content"), spec.get("mode", 0o644)) if isinstance(spec, dict) else (spec, 0o644)
        content = content.encode() if isinstance(content, str) else content
        if not isinstance(content, bytes):
            raise SaltInvocationError(f"{path}: content must be bytes or str")
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise SaltInvocationError(f"{path}: mode must be an integer like 0o644, got {mode!r}")
        out[path] = (content, mode)
    for path in out:
        if any(other.startswith(path + "/") for other in out):
            raise SaltInvocationError(f"{path} is both a file and a parent directory of other files")
    return out


class _Files(dict):
    """Normalized files plus the caller's ``inspect`` hook (see :func:`seed`)."""

    inspect = None
    added = ()  # the paths inspect added
    fresh = False  # the image is the caller's own, made just now (see seed()): nothing else has used it


def _complete(files, exists):
    """``files`` plus what the caller's ``inspect`` hook adds once it has looked into the mounted guest."""
    if getattr(files, "inspect", None) is None:
        return files
    extra = files.inspect(exists) or {}
    files.added = tuple(sorted(extra))
    return {**files, **(_normalize_files(extra) if extra else {})}


# the request --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Request:
    """What ``virt.init`` seeds into a new VM's image: the minion's id, its master, its key pair (a
    ``priv_key`` dict is sealed for this hypervisor, see :mod:`saltvirt.pki.envelope`, and opened with the
    key in ``pki_dir``; no pair: a new one is generated) and extra minion config; ``backend`` as
    :func:`seed` takes it."""

    minion_id: str
    backend: str = "auto"
    master: str | list | None = None  # a list: Salt's multi-master
    pub_key: str | None = None
    priv_key: str | dict | None = None
    minion_config: dict | None = None
    pki_dir: str | None = None
    job: str | None = None  # the Salt job this virt.init runs in: a sealed secret opens only in its own job
    replay_cache: str | None = None  # the file remembering envelopes opened (saltvirt.pki.envelope)

    @classmethod
    def of(
        cls,
        req: vmargs.InitRequest,
        pki_dir: str | None = None,
        job: str | None = None,
        replay_cache: str | None = None,
    ) -> "Request":
        """What ``virt.init``'s request ``req`` seeds (the minion id defaults to the VM's name); ``pki_dir``,
        ``job`` and ``replay_cache``: where and in which job a sealed key opens (the hypervisor's)."""
        return cls(
            minion_id=req.minion_id or req.name,
            backend=req.seed_backend or "auto",
            master=req.master,
            pub_key=req.pub_key,
            priv_key=req.priv_key,
            minion_config=req.minion_config,
            pki_dir=pki_dir,
            job=job,
            replay_cache=replay_cache,
        )


# helpers -------------------------------------------------------------------------------------------
def _wait(cond, timeout, step=0.01):
    """Poll ``cond`` until true (True) or ``timeout`` seconds (False): after 1 ms first, doubling up to
    ``step``, so that what is ready within a few ms (a FUSE export, a partition node) is not kept 10 ms."""
    deadline, delay = time.monotonic() + timeout, 0.001
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, step)
    return True


SCRATCH_PREFIX = "salt-virt-seed-"  # <tmp>/salt-virt-seed-*: a seeding's scratch directory (mode 0700)
OWNER_FILE = "owner"  # in it: "<pid> <start time>" of the process seeding (saltvirt.base.procs.mark)
# in it: "<device>\t<backing file>\t<offset>" of each loop device seeding attached: what the reaper detaches
# when seeding died (its mounts went with its mount namespace; nothing else names the loop device)
LOOPS_FILE = "loops"


def _mark_owner(tmp):
    """Name the process that seeds in its scratch directory: the reaper (saltvirt.vm.cleanup.reap_seeding)
    leaves a scratch directory alone while that process runs."""
    fd = os.open(os.path.join(tmp, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(procs.mark() + "\n")


def remove_scratch(tmp: str) -> None:
    """Remove a seeding's scratch directory without ever descending into something still mounted (the
    reaper, :mod:`saltvirt.vm.cleanup`, removes an interrupted one with it)."""
    points = fsutil.mount_points()  # read once: it lists every mount of the host
    for entry in os.scandir(tmp):
        if os.path.realpath(entry.path) in points:
            raise CommandExecutionError(f"{entry.path} is still mounted: unmount it by hand, then remove {tmp}")
        if entry.is_dir(follow_symlinks=False):
            os.rmdir(entry.path)  # an empty mount point; fails (safely) if not empty
        else:
            os.unlink(entry.path)
    os.rmdir(tmp)


_QEMU_WRITE_BYTES = (101, 201)  # qemu's byte locks: holds perm "write" (101), forbids others to write (201)


def _refuse_if_in_use(image):
    """Refuse an image a running qemu has open: as a VM's disk (``qemu-img info`` without ``-U`` fails on
    its write lock) or as a backing file (qcow2: qemu's 'unshare write' byte lock; raw backing files are
    not locked at all: open file descriptors)."""
    proc = tools.run(
        ["qemu-img", "info", "--output=json", image], f"checking {image}", check=False, limits=QEMU_IMG_INFO_LIMITS
    )
    if proc.returncode != 0 and "lock" not in proc.stderr:
        raise CommandExecutionError(f"cannot read {image}: {proc.stderr.strip()}")
    why = ["qemu holds its write lock"] if proc.returncode != 0 else []
    why += [f"qemu lock byte {offset} is held" for offset in images.held_qemu_locks(image, _QEMU_WRITE_BYTES)]
    why += [f"open in {user}" for user in _openers(image)]
    loops = [
        n
        for n in os.listdir("/sys/block")
        if fsutil.read_text(f"/sys/block/{n}/loop/backing_file") == os.path.realpath(image)
    ]
    why += [f"attached to /dev/{n}" for n in loops]
    if why:
        raise CommandExecutionError(
            f"{image} is in use by a running VM, as its disk or as a backing file, or otherwise ({', '.join(why)}): "
            "shut the VM down (or detach it) before seeding"
        )


def _openers(path):
    """Other processes with ``path`` open (readlink of /proc/*/fd: never blocks on a FUSE file)."""
    real, me, found = os.path.realpath(path), str(os.getpid()), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == real:
                        found.append(f"{fsutil.read_text(f'/proc/{pid}/comm')} (pid {pid})")
                        break
    return found


def _qemu_lock(image, undo):
    """Hold the byte locks a qemu writer holds while we write behind qemu's back (loop backend): no
    VM can open the image for writing meanwhile."""
    fd = os.open(image, os.O_RDWR)

    def flush_and_unlock():
        os.fsync(fd)
        os.close(fd)

    undo.add(f"flush and unlock {image}", flush_and_unlock)
    for offset in _QEMU_WRITE_BYTES:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(images.FLOCK, fcntl.F_RDLCK, os.SEEK_SET, offset, 1, 0))
        except OSError as exc:
            raise CommandExecutionError(f"{image} is locked by another process: {exc.strerror}") from None


# block devices -------------------------------------------------------------------------------------
def _losetup(path, tmp, undo, ns, offset=0, size=None):
    """A loop device of ``path``: the whole file (its partitions scanned), or ``size`` bytes from ``offset``.
    Attached from inside ``ns``, where ``path`` may be a FUSE export (losetup resolves the path it is given);
    recorded in ``tmp``'s LOOPS_FILE."""
    cmd = ["losetup", "-f", "--show"] + (["-o", str(offset), "--sizelimit", str(size)] if size else ["-P"])
    dev = ns.run([*cmd, path], f"attaching {path} to a loop device").stdout.strip()
    ours = loop_binding(dev)
    undo.add(f"detach {dev}", lambda: detach(dev, ours))
    if ours:
        with open(os.path.join(tmp, LOOPS_FILE), "a", encoding="utf-8") as fh:
            fh.write("\t".join((dev, *ours)) + "\n")
    return dev


def loop_binding(dev: str) -> tuple[str, str] | None:
    """What ``dev`` is attached to (backing file, offset), or None when it is free."""
    sysfs = f"/sys/block/{os.path.basename(dev)}/loop"
    backing = fsutil.read_text(f"{sysfs}/backing_file")
    return (backing, fsutil.read_text(f"{sysfs}/offset")) if backing else None


LOOP_CLR_FD = 0x4C01  # <linux/loop.h>: what `losetup -d` asks the kernel


def clear_loop(dev: str) -> None:
    """``losetup -d dev`` without starting losetup (~1 ms a seeding): its one ioctl. A device someone else
    still has open is detached when it is let go (the kernel sets autoclear), as with losetup."""
    try:
        fd = os.open(dev, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, LOOP_CLR_FD, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise CommandExecutionError(f"detaching {dev} failed: {exc.strerror}") from None


def detach(dev: str, ours: tuple[str, str] | None) -> None:
    """Detach ``dev`` (:func:`clear_loop`), then wait until it is no longer bound as ``ours``
    (:func:`loop_binding`): a busy device (still writing back, or mounted in a mount namespace that is just
    ending) detaches only when it is let go. Raises CommandExecutionError when it is not within 30 s."""
    clear_loop(dev)
    # a loop device still writing back detaches when it is done: seconds on a busy host, so wait up to 30 s.
    # Another process's `losetup -f` may take the freed device at once: only our binding must be gone.
    if not _wait(lambda: loop_binding(dev) != ours, 30):
        raise CommandExecutionError(f"{dev} is still attached after 'losetup -d' (busy?): check 'losetup -a'")


def _sys_parts(dev):
    name, found = os.path.basename(dev), []
    with contextlib.suppress(OSError):
        for entry in os.scandir(f"/sys/block/{name}"):
            if entry.name.startswith(name) and os.path.exists(os.path.join(entry.path, "partition")):
                found.append((int(fsutil.read_text(os.path.join(entry.path, "partition"))), entry.name, entry.path))
    return sorted(found)


def _partitions(dev, tmp, undo):
    """[(label, device node)] for every partition of ``dev``, or the whole device if it has none.
    Kernels built without partition-table support get them from ``partx -a`` (userspace parsing)."""
    found = _sys_parts(dev)
    if not found:
        tools.run(["partx", "-a", dev], f"reading the partition table of {dev}", check=False)
        found = _sys_parts(dev)
        if found:
            undo.add(f"partx -d {dev}", lambda: tools.run(["partx", "-d", dev], f"partx -d {dev}", check=False))
    if not found:
        return [("whole disk", dev)]
    out = []
    for num, name, sys_path in found:
        node = f"/dev/{name}"
        if not _wait(lambda n=node: os.path.exists(n) and stat.S_ISBLK(os.stat(n).st_mode), 2):
            major, minor = (int(x) for x in fsutil.read_text(os.path.join(sys_path, "dev")).split(":"))
            node = os.path.join(tmp, name)  # no devtmpfs/udev node: make our own
            os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(major, minor))
        out.append((f"partition {num}", node))
    return out


def _umount(mnt, ns):
    for _ in range(10):
        try:
            ns.umount(mnt)
            return
        except CommandExecutionError:
            if not ns.mounted(mnt):
                return
        time.sleep(0.3)
    with contextlib.suppress(CommandExecutionError):
        ns.umount(mnt, lazy=True)
    raise CommandExecutionError(f"could not unmount {mnt} (busy): detached it lazily; check with 'findmnt'")


def _seed_device(dev, files, tmp, undo, ns):
    """Find the root filesystem on the block device ``dev`` (its partitions as the kernel or ``partx``
    reads them, each probed by ``blkid``), write ``files`` into it, sync and unmount it."""
    parts = _partitions(dev, tmp, undo)
    return _first_root(((label, _blkid(node, ns), node) for label, node in parts), files, tmp, ns)


def _seed_file(path, files, tmp, undo, ns):
    """:func:`_seed_device` for an image file (raw, or qemu-storage-daemon's export of any format): the
    partition table and each partition's filesystem type read from the file (saltvirt.guest.disklabel),
    and only a root candidate attached, as a loop device of its own byte range. A layout disklabel does
    not answer for certain goes the device's way (the whole file attached, the kernel/partx, blkid)."""
    with open(ns.path(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        parts = disklabel.partitions(fh.fileno(), size)
        if parts is None:
            return _seed_device(_losetup(path, tmp, undo, ns), files, tmp, undo, ns)
        regions = [(f"partition {p.number}", p.offset, p.size) for p in parts] or [("whole disk", 0, size)]
        found = [(label, off, length, disklabel.fstype(fh.fileno(), off, length)) for label, off, length in regions]

    def candidates():  # a loop device only for a filesystem that may be mounted, once its turn comes
        for label, off, length, known in found:
            fstype = known or _blkid(path, ns, off, length)  # what disklabel does not know for certain, blkid names
            mountable = fstype in KERNEL_MOUNT_FS and fstype not in NOT_ROOT_FS
            yield label, fstype, _losetup(path, tmp, undo, ns, off, length) if mountable else None

    return _first_root(candidates(), files, tmp, ns)


def _first_root(candidates, files, tmp, ns):
    """Write ``files`` into the first of ``candidates`` ((label, fstype, device node)) that is a root filesystem."""
    mnt = os.path.join(tmp, "root")
    tried: list[str] = []
    os.makedirs(mnt, mode=0o700, exist_ok=True)
    for label, fstype, node in candidates:
        done = _try_root(label, node, fstype, mnt, files, tried, ns)
        if done:
            return done
    raise guestroot.GuestError(
        f"no filesystem with an /etc directory found ({'; '.join(tried)}); LVM roots need libguestfs"
    )


def _blkid(node, ns, offset=0, size=None):
    cmd = ["blkid", "-p", "-o", "value", "-s", "TYPE"]
    cmd += ["-O", str(offset), "-S", str(size)] if size is not None else []
    return ns.run([*cmd, node], f"probing {node}", check=False).stdout.strip()


def mount_options(fstype: str, fresh: bool) -> list[str]:
    """How a guest filesystem is mounted for seeding: its files neither devices, nor setuid, nor run here, and
    no access time written back (``noatime``: fewer dirty inodes to write through the device). An image made
    just now (``fresh``) mounts ext4 without cache flushes (``barrier=0``): each journal commit (the syncfs, the
    unmount) would otherwise flush through the loop device (FUSE and qemu-storage-daemon: an fdatasync of the
    image each, ~5 ms a seeding). The image is flushed once after the unmount (the export's fsync, the loop
    backend's fsync) before its VM is defined; a crash before that leaves no VM, and the init's cleanup removes
    the disk. Any other image keeps the flushes that keep its journal consistent through a crash."""
    options = ["nodev", "nosuid", "noexec", "noatime"]
    if fstype == "xfs":
        options.append("nouuid")
    if fstype == "ext4" and fresh:
        options.append("barrier=0")
    return options


def _try_root(label, node, fstype, mnt, files, tried, ns):
    """Mount ``node`` (``label``: what it is, ``fstype`` as probed) when it may hold the root filesystem,
    write ``files`` into it, sync and unmount it: ``{root, fstype}``; or None with the reason in ``tried``."""
    if not fstype or fstype in NOT_ROOT_FS:
        tried.append(f"{label}: {fstype or 'no filesystem'}")
        return None
    if fstype not in KERNEL_MOUNT_FS:
        tried.append(
            f"{label} ({fstype}): refused: the host kernel mounts only {', '.join(KERNEL_MOUNT_FS)} from "
            "an untrusted image (use libguestfs for other filesystems)"
        )
        return None
    try:  # the guest's files are neither devices, nor setuid, nor run here; seen by no other process
        ns.mount(node, mnt, fstype, mount_options(fstype, files.fresh))
    except CommandExecutionError as exc:
        tried.append(f"{label} ({fstype}): {exc}")  # mount's words: the kernel's log (dmesg) says more
        return None
    done = False
    try:
        root = os.open(ns.path(mnt), os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not guestroot.has_etc(root):
                tried.append(f"{label} ({fstype}): no /etc")
                return None
            guestroot.write_files(root, _complete(files, lambda p, r=root: guestroot.exists(r, p)))
            guestroot.written_back(root, label)
        finally:
            os.close(root)
        done = True  # written; the unmount below writes it back (and must succeed)
    finally:
        try:
            _umount(mnt, ns)
        except CommandExecutionError:
            if done:
                raise
    return {"root": label, "fstype": fstype}


def _no_room(image):
    """Why a write into ``image`` failed when its filesystem is full (a loop or FUSE device reports EIO or
    ENOSPC to the guest filesystem, whichever it met first): said with ENOSPC's own (C locale) words, which
    ``virt.init`` recognises (:func:`saltvirt.base.fsutil.out_of_space`)."""
    if fsutil.almost_full(os.path.dirname(image)):
        return f" ({os.path.dirname(image)}: {fsutil.NO_SPACE_TEXTS[0]})"
    return ""


# backends ------------------------------------------------------------------------------------------
def _need_root(tool):
    if os.geteuid() != 0:
        raise _Skip("needs root (loop devices and mounts)")
    if not shutil.which(tool):
        raise _Skip(f"{tool} is not installed")


def _private_mounts(undo):
    """The private mount namespace where a backend mounts the guest (saltvirt.base.mountns): only one that
    mounts makes it, once it knows it can run; left when its undo runs (after what was attached in it)."""
    ns = PrivateMounts()
    undo.add("leave the private mount namespace", ns.close)
    return ns


def _loop(image, fmt, files, tmp, undo):
    if fmt != "raw":
        raise _Skip(f"loop works on raw images only and {image} is {fmt}: use backend qsd-fuse (or auto)")
    _need_root("losetup")
    ns = _private_mounts(undo)
    _qemu_lock(image, undo)
    return _seed_file(image, files, tmp, undo, ns)


def _qsd_fuse(image, fmt, files, tmp, undo):
    _need_root("qemu-storage-daemon")
    if not os.path.exists("/dev/fuse"):
        raise _Skip("/dev/fuse is missing (modprobe fuse)")
    export, logfile = os.path.join(tmp, "export"), os.path.join(tmp, "qsd.log")
    open(export, "w").close()
    fuse = {"type": "fuse", "id": "exp0", "node-name": "disk0", "mountpoint": export, "writable": True}
    cmd = ["qemu-storage-daemon", "--blockdev", json.dumps({"driver": "file", "node-name": "file0", "filename": image})]
    cmd += ["--blockdev", json.dumps({"driver": fmt, "node-name": "disk0", "file": "file0"})]
    cmd += ["--export", json.dumps(fuse)]
    # the daemon holds the private mount namespace its export is mounted in (no helper to start and stop);
    # in a session of its own: a Ctrl-C must reach us (who flush and stop it), not it
    with open(logfile, "wb") as out:
        ns = PrivateMounts(holder=cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    undo.add("leave the private mount namespace", ns.close)
    proc = ns.proc
    undo.add("stop qemu-storage-daemon", lambda: _stop_qsd(proc, export, logfile, ns))
    # polled every 1 ms at most: the export is up within ~5-10 ms, and each poll is one mountinfo read (~0.1 ms)
    if not _wait(lambda: proc.poll() is not None or ns.mounted(export), 30, step=0.001):
        raise CommandExecutionError("qemu-storage-daemon did not export the image within 30s")
    if proc.poll() is not None:
        hint = ": the image or its backing file is in use (by a VM?)" if "lock" in fsutil.read_text(logfile) else ""
        raise CommandExecutionError(f"qemu-storage-daemon failed{hint}: {fsutil.read_text(logfile)}")
    return _seed_file(export, files, tmp, undo, ns)


# How long a qemu-storage-daemon has to exit after SIGTERM. Once the export was flushed, one that does not
# is killed and the seeding stands: run K (2026-11-29, load ~10) saw one stay 60 s, data already on disk.
QSD_STOP_SECONDS = 20.0


def _stop_qsd(proc, export, logfile, ns):
    """fsync the export (qemu flushes the image: every write is in the image file), stop the daemon and wait
    until it has exited. A daemon that does not exit after the flush is killed (a power cut after a flush
    loses nothing), with its kernel state logged; without a flush, that is an error."""
    if proc.poll() is not None and not ns.mounted(export):
        return  # it never came up: that failure is reported already
    flushed = killed = False
    try:
        if proc.poll() is None:
            fd = os.open(ns.path(export), os.O_RDWR)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            flushed = True
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=QSD_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            stuck = procs.kernel_state(proc.pid)
            proc.kill()
            proc.wait()
            killed = True
            log.warning(
                "qemu-storage-daemon (pid %s) did not exit within %.0f s of SIGTERM (%s): killed it; %s",
                proc.pid,
                QSD_STOP_SECONDS,
                stuck,
                "the image was flushed before" if flushed else "the image was not flushed",
            )
        if ns.mounted(export):  # killed (or crashed): do not leave a dead FUSE mount behind
            with contextlib.suppress(CommandExecutionError):
                ns.umount(export, lazy=True)
    if proc.returncode in (0, -15) or (killed and flushed):
        return
    raise CommandExecutionError(f"qemu-storage-daemon exited with {proc.returncode}: {fsutil.read_text(logfile)}")


def _qemu_nbd(image, fmt, files, tmp, undo):
    _need_root("qemu-nbd")
    if not os.path.exists("/sys/block/nbd0"):
        if not shutil.which("modprobe"):
            raise _Skip("the nbd kernel module is not loaded and modprobe is not installed")
        proc = tools.run(["modprobe", "nbd", "max_part=16"], "loading nbd", check=False)
        if proc.returncode != 0 or not _wait(lambda: os.path.exists("/sys/block/nbd0"), 2):
            raise _Skip(f"the nbd kernel module is not available ({proc.stderr.strip() or 'modprobe nbd failed'})")
    free = [
        n
        for n in sorted(os.listdir("/sys/block"))
        if n.startswith("nbd") and fsutil.read_text(f"/sys/block/{n}/size") == "0"
    ]
    free = [f"/dev/{n}" for n in free if not os.path.exists(f"/sys/block/{n}/pid")]
    if not free:
        raise CommandExecutionError("no free /dev/nbd* device (all connected)")
    dev, pidfile = free[0], os.path.join(tmp, "qemu-nbd.pid")
    ns = _private_mounts(undo)
    tools.run(["qemu-nbd", f"--connect={dev}", f"--format={fmt}", f"--pid-file={pidfile}", image], f"qemu-nbd -c {dev}")
    undo.add(f"disconnect {dev}", lambda: _nbd_disconnect(dev, pidfile))
    if not _wait(lambda: fsutil.read_text(f"/sys/block/{os.path.basename(dev)}/size") not in ("0", ""), 10):
        raise CommandExecutionError(f"{dev} did not come up after qemu-nbd --connect")
    return _seed_device(dev, files, tmp, undo, ns)


def _nbd_disconnect(dev, pidfile):
    pid = fsutil.read_text(pidfile)
    tools.run(["qemu-nbd", "--disconnect", dev], f"disconnecting {dev}")
    if pid.isdigit() and not _wait(lambda: not os.path.exists(f"/proc/{pid}"), 60):
        raise CommandExecutionError(f"qemu-nbd (pid {pid}) did not exit within 60s after disconnecting {dev}")


class _Guestfish:
    """libguestfs driven either in-process (python ``guestfs``) or through ``guestfish --listen``."""

    def __init__(self, image, fmt, tmp):
        try:
            import guestfs  # noqa: PLC0415 - optional
        except ImportError:
            guestfs = None
        self.g, self.pid, self.tmp = None, None, tmp
        if guestfs is not None:
            self.g = guestfs.GuestFS(python_return_dict=True)
            self.g.add_drive_opts(image, format=fmt, readonly=False)
        elif shutil.which("guestfish"):
            cmd = ["guestfish", "--listen", "--rw", f"--format={fmt}", "-a", image]
            out = tools.run(cmd, "starting guestfish").stdout
            self.pid = out.split("GUESTFISH_PID=", 1)[-1].split(";", 1)[0].strip()
            if not self.pid.isdigit():
                raise CommandExecutionError(f"guestfish --listen printed no pid: {out.strip()!r}")
        else:
            raise _Skip("libguestfs is not installed (no python guestfs module, no guestfish)")

    def __call__(self, name, *args, **opts):
        if self.g is not None:
            try:
                return getattr(self.g, name.replace("-", "_"))(*args, **opts)
            except RuntimeError as exc:
                raise CommandExecutionError(f"libguestfs {name}: {exc}") from None
        words = [str(a) for a in args] + [f"{k}:{str(v).lower()}" for k, v in opts.items()]
        cmd = ["guestfish", f"--remote={self.pid}", "--", name, *words]
        out = tools.run(cmd, f"guestfish {name}", timeout=900).stdout
        if name == "list-filesystems":
            return dict(line.rsplit(": ", 1) for line in out.splitlines() if ": " in line)
        return {"true": True, "false": False}.get(out.strip(), out)

    def write(self, path, content, mode):
        if self.g is not None:
            self("write", path, content)
        else:
            local = os.path.join(self.tmp, "upload")
            with open(os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
                fh.write(content)
            self("upload", local, path)
            os.unlink(local)
        self("chown", 0, 0, path)
        self("chmod", mode if self.g is not None else f"0{mode:o}", path)

    def close(self):
        if self.g is not None:
            self.g.close()
            return
        tools.run(["guestfish", f"--remote={self.pid}", "--", "exit"], "stopping guestfish", check=False)
        if not _wait(lambda: not os.path.exists(f"/proc/{self.pid}"), 60):
            raise CommandExecutionError(f"guestfish (pid {self.pid}) did not exit within 60s")


def _libguestfs(image, fmt, files, tmp, undo):
    g = _Guestfish(image, fmt, tmp)
    undo.add("shut down the libguestfs appliance", g.close)
    g("launch")
    tried = []
    for dev, fstype in g("list-filesystems").items():
        if fstype in NOT_ROOT_FS:
            tried.append(f"{dev}: {fstype}")
            continue
        try:
            g("mount", dev, "/")
        except CommandExecutionError as exc:
            tried.append(f"{dev} ({fstype}): {exc}")
            continue
        if not g("is-dir", "/etc", followsymlinks=True):
            g("umount-all")
            tried.append(f"{dev} ({fstype}): no /etc")
            continue
        for path, (content, mode) in _complete(files, lambda p: bool(g("exists", p))).items():
            g("mkdir-p", os.path.dirname(path))
            if isinstance(content, guestroot.Link):
                g("ln-sf", str(content), path)
            else:
                g.write(path, content, mode)
        g("umount-all")
        g("shutdown")  # syncs the disks and waits for the appliance to exit
        return {"root": dev, "fstype": fstype}
    raise guestroot.GuestError(f"no filesystem with an /etc directory found ({'; '.join(tried) or 'no filesystems'})")


_BACKENDS = {"libguestfs": _libguestfs, "qemu-nbd": _qemu_nbd, "qsd-fuse": _qsd_fuse, "loop": _loop}


# entry point ---------------------------------------------------------------------------------------
def seed(
    image_path: str,
    files: Mapping[str, Data],
    backend: str = "auto",
    fmt: str | None = None,
    inspect: Callable[..., Any] | None = None,
    fresh: bool = False,
) -> Data:
    """Write ``files`` into the root filesystem of the stopped image ``image_path``.

    ``backend``: 'auto' (each of BACKENDS in turn) or one of them. ``fmt``: the image's format, trusted
    over probing (None: detect). Returns ``{backend, attempts: [{backend, ok, reason, seconds}], root,
    fstype, files, seconds}``; raises :class:`SeedError` naming every backend tried and why it failed.

    ``inspect``: called as ``inspect(exists)`` while the guest's root filesystem is mounted, before the
    files are written; ``exists(path)`` tells whether a path exists in the guest (nothing is executed);
    it returns more files to write (same form as ``files``, ``{path: {'symlink': target}}`` for a link).

    ``fresh``: the caller created ``image_path`` itself just now (exclusively, as virt.init's clone
    does), so no VM or other process can have it open: the in-use check (a ``qemu-img info`` and a scan
    of every process's open files, ~0.1-0.25 s) is skipped.
    """
    started = time.monotonic()
    image = os.path.abspath(images.existing_image(image_path))
    files = _Files(_normalize_files(files))
    files.inspect = inspect  # type: ignore[assignment]
    files.fresh = fresh
    if backend not in BACKENDS + ("auto",):
        raise SaltInvocationError(f"seed backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    if fmt is None:  # callers with an untrusted image pass the format saltvirt.storage.intake decided
        fmt = images.image_info(image)["format"]
    if fmt not in images.DISK_FORMATS:
        raise SaltInvocationError(f"cannot seed a {fmt} image: only {images.DISK_FORMATS} are supported")
    if not fresh:
        _refuse_if_in_use(image)
    attempts, clean = [], True
    for name in auto_order(fmt) if backend == "auto" else (backend,):
        t0, undo = time.monotonic(), Undo(what="seed cleanup")
        tmp = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
        undo.add(f"remove {tmp}", lambda t=tmp: remove_scratch(t))  # type: ignore[misc]
        _mark_owner(tmp)
        outcome = error = None
        stop = False
        try:
            outcome = _BACKENDS[name](image, fmt, files, tmp, undo)
        except _Skip as exc:
            error = f"skipped: {exc}"
        except guestroot.GuestError as exc:
            error, stop = f"failed: {exc}", True  # every other backend would see the same content
        except (CommandExecutionError, OSError) as exc:
            error = f"failed: {exc}{_no_room(image)}"
        finally:
            cleanup = undo.run()
        if cleanup:  # something may still be attached: do not go on
            error = f"{error or 'wrote the files'}, then cleanup failed: {'; '.join(cleanup)}"
            outcome, stop, clean = None, True, False
        seconds = round(time.monotonic() - t0, 3)
        attempts.append({"backend": name, "ok": outcome is not None, "reason": error or "ok", "seconds": seconds})
        if outcome is not None:
            total = round(time.monotonic() - started, 3)
            return dict(outcome, backend=name, attempts=attempts, files=sorted([*files, *files.added]), seconds=total)
        if stop:
            break
    summary = "; ".join(f"{a['backend']}: {a['reason']}" for a in attempts)
    raise SeedError(f"could not seed {image}: {summary}", attempts, clean)
