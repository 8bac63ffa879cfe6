"""``virt.cleanup NAME``: remove what an interrupted ``virt.init`` left on this hypervisor.

An init that dies (minion job killed, libvirtd killed, host crash) can leave: disks recorded in
``<images>/<name>/.salt-virt.json`` with no domain, a domain defined (maybe running) by an init that
never finished, and seeding state (a loop device, a mount, a qemu-storage-daemon FUSE export and its
scratch directory under ``salt-virt-seed-*``). Every init holds ``<images>/.locks/init-<name>``
(flock) while it runs and removes it when it finishes or has undone everything; a lock file nobody
holds is therefore the mark of an interrupted init.

Only what our init created is touched: files listed in the VM's manifest, seeding state attached to
those files, and a domain only when the stale init lock says an init was interrupted and the manifest
records that domain's UUID and that its init never finished (``complete: false``: a stale lock in a
shared ``virt:images`` may be another host's). A complete VM is left alone (``virt.purge`` removes it).

Files are judged by the VM UUID their manifest records, never by the name: a VM of that name missing
here may run from the same directory on another hypervisor sharing ``virt:images``. They go only when
no domain here has that UUID and either the master proved that no hypervisor defines it (``fleet_uuids``:
every UUID it found defined, gathered from every hypervisor, :mod:`saltvirt.fleet.leftovers`), or the
directory is not shared (:func:`shared`), or the operator checked and passes ``force``. A manifest
without a UUID (an older salt-virt) proves nothing: its files stay unless forced.
"""

import contextlib
import fcntl
import json
import os
import signal
import stat
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, procs, tools, validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.guest import seed
from saltvirt.host.conn import libvirt, lookup_domain
from saltvirt.storage import images

LOCKS_DIR = ".locks"
SEED_PREFIX = seed.SCRATCH_PREFIX
REAP_GRACE = 3600.0  # seconds: a scratch directory without an owner mark is stale only when older
# filesystems only this host writes (unless it exports them itself): any other may be shared with other hosts
LOCAL_FS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "jfs", "reiserfs", "nilfs2", "zfs", "tmpfs"}
    | {"ramfs", "overlay", "vfat", "exfat"}
)
NFS_EXPORTS = "/var/lib/nfs/etab"  # what this host's NFS server exports now: a path first on each line


def _lock_path(images_dir, name):
    return os.path.join(images_dir, LOCKS_DIR, f"init-{name}")


class InitLock:
    """The per-VM init lock on this hypervisor (see the module doc). ``keep_mark()`` leaves the file
    behind on release: the init did not finish cleanly and ``virt.cleanup`` has work to do."""

    def __init__(self, images_dir, name, purpose="virt.init"):
        self.path = _lock_path(images_dir, name)
        self.name, self.purpose = name, purpose
        self.fd, self.existed, self.keep = -1, False, False  # fd: the lock file's, from __enter__ on

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.existed = os.path.exists(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise SaltInvocationError(
                f"a virt.init or virt.cleanup of {self.name!r} is running on this host ({holder or 'unknown pid'}): "
                "wait for it"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{self.purpose} pid {os.getpid()}\n".encode(), 0)
        return self

    def keep_mark(self) -> None:
        self.keep = True

    def __exit__(self, exc_type, *exc):
        if exc_type is not None and self.existed:
            self.keep = True  # cleaning up an interrupted init failed: it stays marked
        if not self.keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self.fd)
        return False


# seeding leftovers ----------------------------------------------------------------------------------
def _mountinfo():
    """[(major:minor, mount point, source)] of this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            sep = parts.index("-")
            point = fsutil.unescape_mount(parts[4])
            out.append((parts[2], point, parts[sep + 2] if len(parts) > sep + 2 else ""))
    return out


def _qsd_processes():
    """``(pid, [json options])`` of the qemu-storage-daemons seeding started: run by this user from a
    binary named qemu-storage-daemon (``/proc/<pid>/exe``), not any process that calls itself so."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
                continue
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "qemu-storage-daemon":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        opts = []
        for arg in args[1:]:
            with contextlib.suppress(ValueError):
                value = json.loads(arg)
                if isinstance(value, dict):
                    opts.append(value)
        yield int(pid), opts


def _qsd_exports(disks):
    """{pid: export path} of qemu-storage-daemon processes serving one of ``disks`` (seeding)."""
    found = {}
    for pid, opts in _qsd_processes():
        if not any(o.get("filename") in disks for o in opts):
            continue
        export = next((o.get("mountpoint") for o in opts if o.get("type") == "fuse"), None)
        if export and os.path.basename(os.path.dirname(export)).startswith(SEED_PREFIX):
            found[pid] = export
    return found


def _loops(backing):
    """Loop devices attached to one of ``backing`` (paths)."""
    out = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/sys/block")):
            if name.startswith("loop") and fsutil.read_text(f"/sys/block/{name}/loop/backing_file") in backing:
                out.append(name)
    return out


def _devnums(loop):
    """major:minor of a loop device and its partitions."""
    nums = [fsutil.read_text(f"/sys/block/{loop}/dev")]
    with contextlib.suppress(OSError):
        for entry in os.scandir(f"/sys/block/{loop}"):
            if entry.name.startswith(loop) and os.path.exists(os.path.join(entry.path, "partition")):
                nums.append(fsutil.read_text(os.path.join(entry.path, "dev")))
    return {n for n in nums if n}


def _run(cmd):
    """A cleanup step's tool: its exit status is the caller's to judge (it reports, never raises for it)."""
    return tools.run(cmd, " ".join(cmd), timeout=60, check=False)


def _umount(point, done, errors):
    if _run(["umount", point]).returncode != 0:
        proc = _run(["umount", "-l", point])
        if proc.returncode != 0:
            errors.append(f"unmount {point}: {proc.stderr.strip()}")
            return
    done.append(f"unmounted {point}")


def _detach(loop, done, errors):
    """Detach ``/dev/<loop>`` and see it go: a dead seeding's mount namespace may take a moment to end."""
    dev = f"/dev/{loop}"
    try:
        seed.detach(dev, seed.loop_binding(dev))
    except CommandExecutionError as exc:
        errors.append(f"detach {dev}: {exc}")
    else:
        done.append(f"detached {dev}")


def _remove_scratch(path, done, errors):
    try:
        seed.remove_scratch(path)
        done.append(f"removed {path}")
    except (OSError, CommandExecutionError) as exc:
        errors.append(f"remove {path}: {exc}")


def _stop(pid, done):
    """SIGTERM, SIGKILL after 5 s; returns once it has exited (its mount namespace with it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        if not procs.wait_exited(pid, 5):
            os.kill(pid, signal.SIGKILL)
            procs.wait_exited(pid, 10)  # SIGKILL cannot be refused; 10 s at most for one stuck in the kernel
    done.append(f"stopped qemu-storage-daemon (pid {pid})")


def release_seeding(disks: Iterable[str]) -> tuple[list[str], list[str]]:
    """Unmount, stop and detach whatever seeding left attached to ``disks``. Returns (done, errors).
    Seeding mounts in a mount namespace of its own (saltvirt.base.mountns), which ends with its last
    process (a qemu-storage-daemon, when one serves the disk): stopped before the loop devices under
    those mounts are detached. Mounts in this namespace are an older salt-virt's."""
    disks = {os.path.realpath(d) for d in disks}
    done: list[str] = []
    errors: list[str] = []
    scratch = set()
    exports = _qsd_exports(disks)
    loops = _loops(disks | set(exports.values()))
    for loop in loops:
        nums = _devnums(loop)
        for num, point, _src in reversed(_mountinfo()):
            if num in nums:
                if os.path.basename(os.path.dirname(point)).startswith(SEED_PREFIX):
                    scratch.add(os.path.dirname(point))
                _umount(point, done, errors)
    for pid, export in exports.items():
        _stop(pid, done)
        scratch.add(os.path.dirname(export))
    for loop in loops:
        _detach(loop, done, errors)
    for export in exports.values():
        if any(point == export for _n, point, _s in _mountinfo()):
            _umount(export, done, errors)
    for tmp in sorted(scratch):
        _remove_scratch(tmp, done, errors)
    return done, errors


# the reaper: seeding whose job is gone, found from the scratch directories ---------------------------
def _loop_of(num):
    """The loop device (``loopN``) behind block device ``major:minor`` (a loop or one of its partitions)."""
    parts = os.path.realpath(f"/sys/dev/block/{num}").split(os.sep)
    return next((p for p in parts if p.startswith("loop") and p[4:].isdigit()), None)


def _recorded_loops(path):
    """The loop devices (``loopN``) seeding recorded in its scratch directory ``path`` that are still
    attached as it attached them (a device since freed and taken by someone else is not ours)."""
    out = []
    for line in (fsutil.read_text(os.path.join(path, seed.LOOPS_FILE), "") or "").splitlines():
        dev, *binding = line.split("\t")
        if dev.startswith("/dev/loop") and len(binding) == 2 and seed.loop_binding(dev) == tuple(binding):
            out.append(os.path.basename(dev))
    return out


def _qsd_serving(export):
    """Pids of qemu-storage-daemons whose FUSE export is ``export``."""
    return [
        pid
        for pid, opts in _qsd_processes()
        if any(o.get("type") == "fuse" and o.get("mountpoint") == export for o in opts)
    ]


def _release_scratch(path):
    """Undo what a dead seeding job attached under its scratch directory ``path``: ``(done, errors)``."""
    done: list[str] = []
    errors: list[str] = []
    loops: list[str] = []
    export = os.path.join(path, "export")
    inside = [(n, p) for n, p, _s in _mountinfo() if p.startswith(path + os.sep) and p != export]
    for num, point in reversed(inside):  # the guest's filesystems (on loop devices), deepest first
        loop = _loop_of(num)
        if loop and loop not in loops:
            loops.append(loop)
        _umount(point, done, errors)
    loops += [lp for lp in _loops({export}) if lp not in loops]  # the FUSE export attached, not mounted
    loops += [lp for lp in _recorded_loops(path) if lp not in loops]  # mounted in seeding's own namespace
    for pid in _qsd_serving(export):  # the last process in seeding's namespace: its mounts go with it
        _stop(pid, done)
    for loop in loops:
        _detach(loop, done, errors)
    if any(point == export for _n, point, _s in _mountinfo()):
        _umount(export, done, errors)
    if not errors:
        _remove_scratch(path, done, errors)
    return done, errors


def _stale(path, st, grace):
    """Why the scratch directory ``path`` (``st``: its lstat) belongs to a seeding whose job is gone,
    or None while that job may still run."""
    try:
        fd = os.open(os.path.join(path, seed.OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="ascii", errors="replace") as fh:
            owner = fh.read(100).strip()
    except OSError:
        owner = None
    if owner is not None and procs.alive(owner) is not None:
        return None if procs.alive(owner) else f"its seeding process ({owner.split()[0]}) is gone"
    age = time.time() - st.st_mtime
    return f"no owner mark, {age:.0f} s old" if age > grace else None


def reap_seeding(tmpdir: str | None = None, grace: float = REAP_GRACE) -> Data:
    """Release seeding whose job is gone (a minion restarted, a job killed): for every scratch directory
    ``<tmpdir>/salt-virt-seed-*`` that salt-virt made (a real directory, not a symlink, owned by this
    user, mode 0700 as ``mkdtemp`` makes it) whose owner process is gone, unmount the guest's
    filesystems mounted inside it, detach their loop devices and the one on its FUSE export, stop the
    qemu-storage-daemon serving that export, and remove the directory. Anything else is left alone.
    Returns ``{removed: [what was done], errors: [...], left: {path: why}}``."""
    import tempfile  # noqa: PLC0415 - the default scratch place, as seeding's mkdtemp uses it

    tmpdir = tmpdir or tempfile.gettempdir()
    out: Data = {"removed": [], "errors": [], "left": {}}
    try:
        entries = sorted(e.path for e in os.scandir(tmpdir) if e.name.startswith(SEED_PREFIX))
    except OSError as exc:
        out["errors"].append(f"cannot list {tmpdir}: {exc.strerror}")
        return out
    for path in entries:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
            out["left"][path] = "not a scratch directory salt-virt made (a symlink, another owner or mode)"
            continue
        why = _stale(path, st, grace)
        if why is None:
            continue  # its seeding runs: not ours to touch
        done, errors = _release_scratch(path)
        out["removed"] += [f"{path}: {why}", *done]
        out["errors"] += errors
    return out


# whose files these are: judged by UUID ----------------------------------------------------------------
def _uuid_of(manifest):
    """The VM UUID ``manifest`` records (lower case), or None (an older salt-virt, or not a UUID)."""
    try:
        return str(uuidlib.UUID(str(manifest.get("uuid"))))
    except ValueError:
        return None


def _defined_here(conn, uuid):
    """The name of the domain with ``uuid`` on this host, or None."""
    try:
        return conn.lookupByUUIDString(uuid).name()
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise CommandExecutionError(f"cannot ask libvirt for VM uuid {uuid}: {exc.get_error_message()}") from None


def _exported(path):
    """The directory this host's NFS server exports that holds ``path``, or None."""
    for line in (fsutil.read_text(NFS_EXPORTS, "") or "").splitlines():
        root = fsutil.unescape_mount(line.split()[0]) if line.strip() else ""
        if root.startswith("/") and validate.is_inside(path, root):
            return root
    return None


def shared(vm_dir: str, manifest: Data, host_id: str | None) -> str | None:
    """Why other hypervisors may use ``vm_dir`` too, or None when only this host can: another host created
    it (the manifest's ``host``), it is on a filesystem other hosts can mount (anything but
    :data:`LOCAL_FS`), or this host exports it over NFS."""
    creator = manifest.get("host")
    if creator and creator != host_id:
        return f"its manifest says {creator} created it" + (f", not this host ({host_id})" if host_id else "")
    point, fstype = fsutil.mount_of(vm_dir)
    if fstype not in LOCAL_FS:
        return f"it is on a {fstype} filesystem ({point}), which other hosts can mount"
    root = _exported(vm_dir)
    return f"this host exports {root} over NFS" if root else None


def fleet_proof(value: Any) -> dict[str, list[str]] | None:
    """``fleet_uuids`` as the master passes it (``{uuid: [hypervisors defining it]}``), checked; None stays None."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(v, list | tuple) for v in value.values()):
        raise SaltInvocationError(
            "fleet_uuids must map VM uuids to the hypervisors defining them, as the master gathers them: "
            "run salt-run virt.cleanup NAME instead of passing it by hand"
        )
    return {str(k).lower(): [str(h) for h in v] for k, v in value.items()}


def why_kept(
    conn: Conn,
    manifest: Data,
    vm_dir: str,
    host_id: str | None = None,
    fleet_uuids: Mapping[str, list[str]] | None = None,
    force: bool = False,
) -> str | None:
    """Why the files ``manifest`` lists must stay, or None when they may go (see the module doc)."""
    name, uuid = manifest["vm"], _uuid_of(manifest)
    here = _defined_here(conn, uuid) if uuid else None
    if here:  # never, forced or not: that VM's disks (virt.purge removes them with it)
        return f"VM {here!r} on this host has uuid {uuid}, the one the manifest records: these are its disks"
    if uuid is None:
        if force:
            return None
        return (
            f"{os.path.join(vm_dir, images.MANIFEST)} records no VM uuid (an older salt-virt wrote it), so "
            f"nothing proves that no hypervisor runs a VM from these files. Check that none does "
            f"(salt-run virt.query), then run virt.cleanup {name} force=True or delete them by hand"
        )
    if fleet_uuids is not None:  # the master's proof: every hypervisor answered with what it defines
        users = sorted(h for h in fleet_uuids.get(uuid, ()) if h != host_id)  # this host: asked just now
        return f"VM uuid {uuid} is defined on {', '.join(users)}: these are its disks, in use" if users else None
    why = None if force else shared(vm_dir, manifest, host_id)
    if why:
        return (
            f"{vm_dir} may be shared with other hypervisors ({why}), and one of them may run VM uuid {uuid} "
            f"from it. Run salt-run virt.cleanup {name} on the master (it first asks every hypervisor which "
            f"uuids they define), or check that no hypervisor defines {uuid} and run virt.cleanup {name} force=True"
        )
    return None


# entry point ----------------------------------------------------------------------------------------
def cleanup(
    conn: Conn,
    name: str,
    images_dir: str,
    *,
    host_id: str | None = None,
    fleet_uuids: Any = None,
    force: bool = False,
) -> Data:
    """Remove what an interrupted init of ``name`` left here; see the module doc. ``host_id``: this
    hypervisor's minion id; ``fleet_uuids``: the master's proof (:func:`fleet_proof`); ``force``: the
    operator checked that no hypervisor uses the files. Returns ``{name, interrupted, domain, removed,
    kept, released, errors}``, and ``refused`` (why the files stay) when they do."""
    validate.vm_name(name)
    validate.absolute_path(images_dir, "virt:images")
    proof = fleet_proof(fleet_uuids)
    with InitLock(images_dir, name, purpose="virt.cleanup") as lock:
        return clean(conn, name, images_dir, lock, host_id=host_id, fleet_uuids=proof, force=force)


def clean(
    conn: Conn,
    name: str,
    images_dir: str,
    lock: InitLock,
    *,
    host_id: str | None = None,
    fleet_uuids: Mapping[str, list[str]] | None = None,
    force: bool = False,
) -> Data:
    """The work of :func:`cleanup`, under ``lock`` (held by the caller: cleanup, or an init that found
    the mark of an interrupted one)."""
    vm_dir = validate.inside(images_dir, name)
    out = {"name": name, "interrupted": lock.existed, "domain": None, "removed": [], "kept": {}}
    out.update(released=[], errors=[])
    manifest = images.load_manifest(vm_dir) if os.path.isdir(vm_dir) else None
    ours = manifest is not None and manifest.get("vm") == name
    files = images.owned_files(vm_dir, name) if ours else []
    dom = lookup_domain(conn, name)
    if dom is not None:
        uuid = dom.UUIDString()
        if not (lock.existed and ours and _uuid_of(manifest) == uuid and (manifest or {}).get("complete") is False):
            out["domain"] = "kept: a complete VM (virt.purge removes it)"
            if lock.existed:
                out["domain"] = (
                    "kept: a complete VM: its manifest records no unfinished init of it (virt.purge removes it)"
                )
            return out
        with contextlib.suppress(libvirt.libvirtError):
            if dom.isActive():
                dom.destroy()
        from saltvirt.host.lifecycle import undefine  # noqa: PLC0415 - lifecycle imports more than we need

        undefine(conn, name)
        out["domain"] = f"undefined (uuid {uuid}): its init never finished"
    out["released"], out["errors"] = release_seeding(files)
    if out["errors"]:
        lock.keep_mark()
        return out
    if ours and manifest is not None:
        refused = why_kept(conn, manifest, vm_dir, host_id, fleet_uuids, force)
        if refused:
            out["refused"], out["kept"] = refused, dict.fromkeys(files, refused)
            return out
        outcome = images.remove_owned(vm_dir, name, manifest.get("uuid"), files)
        out["removed"], out["kept"] = outcome["removed"], outcome["kept"]
    return out
