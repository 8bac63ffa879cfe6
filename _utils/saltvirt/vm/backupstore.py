"""Where backups live and what counts as one: the backup directory, per-VM subdirectories, backup
manifests, listing, deletion that never breaks a chain, retention plans.

Layout (``virt:backup:dir`` in the minion config, decided by the operator only)::

    <virt:backup:dir>/[<target>/]<vm name>/       the name index: one directory per VM of that name
      <vm uuid>/                                  one VM's backups (a later VM of the name gets its own)
        .salt-virt.json              ownership manifest (saltvirt.storage.images): every file below is listed
        .lock                        held while a backup, restore or delete of this VM runs
        <id>.<disk target>.qcow2     one file per disk; an incremental one backs onto its parent's file
        <id>.json                    the backup manifest, written last and atomically

A backup is valid only when its manifest exists, parses, carries the MAC of the hypervisor's backup key
and names files that exist: files without a manifest are an interrupted backup, never listed as valid and
removed by the next backup. Backing files are named relative (basename only), so another host mounting the
directory elsewhere can restore.

Whoever may write to a shared backup directory is not the operator: an unauthenticated manifest would
let them make a restore define any domain XML, or restore any file of the host into a guest. Each
manifest therefore carries an HMAC-SHA256 (:mod:`saltvirt.pki.signedrecords`) under the hypervisor's backup
key (``virt:backup:key_file``, default ``<pki_dir>/salt-virt-backups.key``, made on first use), bound to
its VM's name, uuid and id (its place in the directory); the files' checksums are in it. Hypervisors that
share a backup directory share that key, as masters share ``master.pem``.
"""

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.fsutil import atomic_write, file_digest
from saltvirt.base.salttypes import Data
from saltvirt.pki import signedrecords
from saltvirt.storage import images
from saltvirt.xml.domain import definition

CONFIG_KEY = "virt:backup:dir"
KEY_CONFIG = "virt:backup:key_file"
KEY_FILE = "salt-virt-backups.key"  # in the minion's pki_dir unless virt:backup:key_file names another
MAC_KIND = "backup-manifest"
UNSIGNED = (
    "its manifest does not carry the MAC of this hypervisor's backup key: it was changed after the backup, or "
    f"made with another key (hypervisors that share a backup directory need the same {KEY_CONFIG})"
)
LOCK = ".lock"
ID_RE = re.compile(r"\d{8}T\d{6}Z(-\d{1,3})?")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
UUID_EXAMPLE = "0f3c2a44-1b5e-4e0c-9a8f-1234567890ab"
MANIFEST_FORMAT = 1
CHECKPOINT_PREFIX = "salt-backup-"


# the directory --------------------------------------------------------------------------------------
def root_dir(configured: str | None) -> str:
    """The operator's backup directory (``virt:backup:dir``): it must be set and exist."""
    if not configured:
        raise CommandExecutionError(
            f"no backup directory configured: set {CONFIG_KEY} in the minion config (an absolute directory the "
            "operator created; callers never choose it)"
        )
    path = validate.absolute_path(configured, CONFIG_KEY)
    if not os.path.isdir(path):
        raise CommandExecutionError(f"{CONFIG_KEY} {path} does not exist: the operator creates it (mkdir -p {path})")
    return path


def name_dir(root: str, vm: str, target: str | None = None) -> str:
    """``<root>/[<target>/]<vm>``, the directory of every VM named ``vm``: every part a safe name, the result
    inside ``root`` (no symlink escape)."""
    validate.vm_name(vm)
    parts = [validate.vm_name(target, "backup target")] if target else []
    return validate.inside(root, *parts, vm)


def manifest_key(configured: str | None, pki_dir: str) -> bytes:
    """The key backup manifests are signed with: the file ``virt:backup:key_file`` names (the operator puts it
    there, the same on every hypervisor sharing a backup directory), else ``<pki_dir>/salt-virt-backups.key``,
    made on first use."""
    if configured:
        return signedrecords.load_key(validate.absolute_path(configured, KEY_CONFIG), create=False)
    return signedrecords.load_key(signedrecords.key_path(pki_dir, KEY_FILE))


def vm_uuid(uuid: Any) -> str:
    if not isinstance(uuid, str) or not UUID_RE.fullmatch(uuid):
        raise SaltInvocationError(f"invalid VM uuid {uuid!r}: a libvirt uuid looks like {UUID_EXAMPLE}")
    return uuid


def vm_dir(root: str, vm: str, uuid: str, target: str | None = None, create: bool = False) -> str:
    """``<root>/[<target>/]<vm>/<uuid>``: the backups of one VM, keyed by its uuid, so that a later VM of the
    same name (purged and made again, restored elsewhere) has its own and never meets the other's files."""
    named = name_dir(root, vm, target)
    path = validate.inside(named, vm_uuid(uuid))
    if create:
        parts = [*os.path.relpath(path, root).split(os.sep)]
        for depth in range(1, len(parts) + 1):
            with contextlib.suppress(FileExistsError):
                # traverse-only for others: QEMU (its own user) opens the files it writes by name
                os.mkdir(validate.inside(root, *parts[:depth]), 0o711)
    return path


def vm_dirs(root: str, vm: str, target: str | None = None) -> list[str]:
    """The directories of every VM named ``vm`` that has backups (by uuid), sorted."""
    named = name_dir(root, vm, target)
    if not os.path.isdir(named):
        return []
    return sorted(e.path for e in os.scandir(named) if UUID_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False))


def every_vm_dir(root: str) -> list[str]:
    """The directory of every VM with backups below ``root``: ``<root>/<vm>/<uuid>`` and
    ``<root>/<target>/<vm>/<uuid>`` (a name that is no VM name or target, written by hand, is passed over)."""

    def subdirs(path):
        return sorted(
            e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
        )

    out = []
    for top in subdirs(root):
        for vm, target in [(top, None)] + [(sub, top) for sub in subdirs(os.path.join(root, top))]:
            if not UUID_RE.fullmatch(vm):
                with contextlib.suppress(SaltInvocationError):
                    out += vm_dirs(root, vm, target)
    return out


def find(root: str, vm: str, bid: str, target: str | None = None) -> str:
    """The directory of backup ``bid`` among those of the VMs named ``vm`` (ids never repeat within a name)."""
    backup_id(bid)
    found = [d for d in vm_dirs(root, vm, target) if any(n.partition(".")[0] == bid for n in os.listdir(d))]
    where = name_dir(root, vm, target)
    if not found:
        raise SaltInvocationError(f"VM {vm} has no backup {bid} in {where} (see virt.backup_list {vm})")
    if len(found) > 1:
        uuids = ", ".join(os.path.basename(d) for d in found)
        raise CommandExecutionError(
            f"backup {bid} is in several VM directories of {where} ({uuids}): remove one by hand"
        )
    return found[0]


def taken_ids(root: str, vm: str, target: str | None = None) -> set[str]:
    """The backup ids used by any VM named ``vm``: a new id is new for the name (:func:`find`)."""
    return {n.partition(".")[0] for d in vm_dirs(root, vm, target) for n in os.listdir(d)}


def backup_id(bid: Any) -> str:
    if not isinstance(bid, str) or not ID_RE.fullmatch(bid):
        raise SaltInvocationError(f"invalid backup id {bid!r}: ids look like 20260101T120000Z (see virt.backup_list)")
    return bid


def id_order(bid: str) -> tuple[str, int]:
    """A sort key of backup ids in the order they were made: ``-10`` after ``-9`` within a second."""
    stamp, _, n = bid.partition("-")
    return stamp, int(n) if n.isdigit() else 1


def new_id(directory: str, now: datetime.datetime | None = None, taken: Iterable[str] = ()) -> str:
    """A fresh id (UTC time; ``-2``, ``-3``... within the same second) no file in ``directory`` uses and
    that is not in ``taken`` (the ids of the VM's checkpoints: an interrupted backup removes its files,
    but its checkpoint may outlive it in libvirt). Within a second it comes after every id taken, never
    in a gap a removed one left: backups made within one second are ordered by their ids (``finished``
    has whole seconds), and an incremental builds on the newest."""
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    taken = set(taken) | ({n.split(".", 1)[0] for n in os.listdir(directory)} if os.path.isdir(directory) else set())
    same = [id_order(t)[1] for t in taken if ID_RE.fullmatch(t) and id_order(t)[0] == stamp]
    return f"{stamp}-{max(same) + 1}" if same else stamp


def disk_file(directory: str, bid: str, target: str) -> str:
    return os.path.join(directory, f"{bid}.{target}.qcow2")


def manifest_file(directory: str, bid: str) -> str:
    return os.path.join(directory, f"{bid}.json")


@contextlib.contextmanager
def locked(directory: str, vm: str) -> Iterator[None]:
    """One backup/restore/delete per VM directory at a time; a second one is refused, not queued."""
    fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise CommandExecutionError(
                f"a backup, restore or delete of VM {vm} is running ({directory}): try again when it has finished"
            ) from None
        yield
    finally:
        os.close(fd)


# manifests ------------------------------------------------------------------------------------------
def _bound_to(directory, bid):
    """What a manifest's MAC binds it to: ``<vm>/<uuid>/<id>``, its place (a manifest moved is refused)."""
    return f"{os.path.basename(os.path.dirname(directory))}/{os.path.basename(directory)}/{bid}"


def write_manifest(directory: str, manifest: Data, key: bytes) -> str:
    """Write a backup's manifest, signed with ``key``, atomically (fsynced temp file + rename): the step that
    makes it valid."""
    manifest = signedrecords.sign_with(key, MAC_KIND, _bound_to(directory, manifest["id"]), manifest)
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    path = manifest_file(directory, manifest["id"])
    atomic_write(path, text.encode(), 0o640, fsync=True, prefix=f".{manifest['id']}.", suffix=".tmp")
    return path


def _problem(directory, m):
    """Why the manifest ``m`` does not describe a usable backup, or None."""
    if m.get("format") != MANIFEST_FORMAT or not isinstance(m.get("disks"), list) or not m["disks"]:
        return "not a salt-virt backup manifest"
    for d in m["disks"]:
        name = d.get("file") if isinstance(d, dict) else None
        if not isinstance(name, str) or os.path.basename(name) != name or not name.startswith(m["id"] + "."):
            return f"names a file outside its backup: {name!r}"
        if not os.path.isfile(os.path.join(directory, name)):
            return f"file {name} is missing"
    chain = m.get("chain")
    if not isinstance(chain, list) or not chain or chain[-1] != m["id"]:
        return "has no chain"
    return None


def read_manifest(directory: str, bid: str, key: bytes) -> tuple[Data | None, str | None]:
    """``(manifest, problem)``: the parsed manifest of backup ``bid`` (None if absent or unreadable); a
    manifest without the MAC ``key`` makes has a problem, always."""
    try:
        fd = os.open(manifest_file(directory, bid), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            m = json.load(fh)
    except FileNotFoundError:
        return None, "no such backup"
    except (OSError, ValueError) as exc:
        return None, f"unreadable manifest: {exc}"
    if not isinstance(m, dict) or m.get("id") != bid:
        return None, "manifest of another backup"
    if not signedrecords.verified_with(key, MAC_KIND, _bound_to(directory, bid), m):
        return m, UNSIGNED
    return m, _problem(directory, m)


def scan(directory: str, key: bytes) -> tuple[list[Data], dict[str, str], list[str]]:
    """``(valid, broken, incomplete)``: valid backups oldest first (manifests signed with ``key``); broken
    ones ``{id: reason}``; incomplete: ids with files but no manifest (interrupted backups)."""
    if not os.path.isdir(directory):
        return [], {}, []
    ids, with_manifest = set(), set()
    for name in os.listdir(directory):
        bid, _, rest = name.partition(".")
        if ID_RE.fullmatch(bid):
            ids.add(bid)
            if rest == "json":
                with_manifest.add(bid)
    valid: list[Data] = []
    broken: dict[str, str] = {}
    for bid in sorted(with_manifest):
        m, problem = read_manifest(directory, bid, key)
        if problem:
            broken[bid] = problem
        elif m is not None:
            valid.append(m)
    by_id = {m["id"]: m for m in valid}
    for m in list(valid):  # a chain is only as good as every backup it builds on
        missing = [p for p in m["chain"] if p not in by_id]
        if missing:
            broken[m["id"]] = f"builds on backup {missing[0]}, which is gone or broken"
            valid.remove(m)
    valid.sort(key=lambda m: (m.get("finished") or "", id_order(m["id"])))
    return valid, broken, sorted(ids - with_manifest)


def scan_all(root: str, vm: str, key: bytes, target: str | None = None) -> tuple[list[Data], dict[str, str], list[str]]:
    """:func:`scan` over the directories of every VM named ``vm``: valid backups oldest first (each names its
    VM's ``uuid``), broken ones and incomplete ids."""
    valid: list[Data] = []
    broken: dict[str, str] = {}
    incomplete: list[str] = []
    for directory in vm_dirs(root, vm, target):
        v, b, i = scan(directory, key)
        valid += v
        broken.update(b)
        incomplete += i
    valid.sort(key=lambda m: (m.get("finished") or "", id_order(m["id"])))
    return valid, broken, sorted(incomplete)


def summary(m: Data) -> Data:
    """What ``virt.backup_list`` shows of a manifest (no domain XML)."""
    keys: tuple[str, ...] = (
        "id",
        "uuid",
        "type",
        "parent",
        "chain",
        "checkpoint",
        "started",
        "finished",
        "duration",
        "copy_seconds",
    )
    keys += ("size", "live")
    out = {k: m.get(k) for k in keys}
    out["consistency"] = m.get("consistency")
    out["fs_freeze"] = m.get("fs_freeze")  # {frozen, thawed}: the guest agent's counts (None: no freeze)
    out["skipped"] = m.get("skipped") or {}  # {target: why} of the disks the backup does not hold
    out["disks"] = [{k: d.get(k) for k in ("target", "file", "size", "virtual_size", "sha256")} for d in m["disks"]]
    out.update(recorded(m.get("domain_xml")))
    return out


def recorded(domain_xml: Any) -> Data:
    """``{owner, cpu, mem}`` of the domain XML a backup recorded (its tenant and creator from <metadata>, its
    vCPUs and MiB): what the master needs to restore it for a tenant (``{}`` parts when it cannot be read)."""
    try:
        facts = definition.parse(domain_xml) if isinstance(domain_xml, str) else {}
    except Exception:  # noqa: BLE001 - a manifest's XML that does not parse: no owner, no sizes
        facts = {}
    return {"owner": facts.get("owner"), "cpu": facts.get("cpu"), "mem": facts.get("mem")}


def verify(directory: str, chain: list[Data], digests: dict[str, str] | None = None) -> bool:
    """Check every file of ``chain`` (manifests, oldest first) against its checksum and its backing
    file against the chain; raise CommandExecutionError naming the first mismatch. ``digests``:
    ``{file name: sha256}`` already taken of the files' bytes as they were written (:func:`stage`), so
    they are not read a second time."""
    digests = digests or {}
    previous: dict[str, str] = {}
    for m in chain:
        for d in m["disks"]:
            path = os.path.join(directory, d["file"])
            if not validate.is_inside(path, directory) or os.path.islink(path):
                raise CommandExecutionError(f"backup {m['id']}: {d['file']} is not a file inside {directory}")
            want = os.path.join(directory, previous[d["target"]]) if d.get("backing") else None
            if d.get("backing") and d["backing"] != previous.get(d["target"]):
                raise CommandExecutionError(f"backup {m['id']}: disk {d['target']} does not build on its parent")
            if images.qcow2_backing(path) != want:
                raise CommandExecutionError(
                    f"backup {m['id']}: {d['file']} backs onto {images.qcow2_backing(path)}, expected {want}: "
                    "the file was changed after the backup; it cannot be restored"
                )
            if (digests.get(d["file"]) or file_digest(path)) != d["sha256"]:
                raise CommandExecutionError(
                    f"backup {m['id']}: checksum mismatch on {d['file']} (damaged or changed after the backup): "
                    "it cannot be restored; restore an older full backup"
                )
            previous[d["target"]] = d["file"]
    return True


def stage(directory: str, chain: list[Data], staging: str) -> dict[str, str]:
    """Copy every file of ``chain`` from ``directory`` into ``staging`` (a private directory of this host), then
    :func:`verify` the copies: what a restore reads is what was checked, whatever is written to a shared
    backup directory meanwhile (a file swapped after its check could name a host file as its backing file).
    Each file is hashed as it is copied (one pass over the data, not a second read of the copy).
    Returns ``{target: the staged file of the chain's top}``."""
    top: dict[str, str] = {}
    digests: dict[str, str] = {}
    for m in chain:
        for d in m["disks"]:
            name = d["file"]
            if not isinstance(name, str) or os.path.basename(name) != name:
                raise CommandExecutionError(f"backup {m['id']}: {name!r} is not a file of its backup")
            try:
                src = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as exc:
                raise CommandExecutionError(f"backup {m['id']}: cannot read {name}: {exc.strerror}") from None
            with os.fdopen(src, "rb") as fin:
                if not stat.S_ISREG(os.fstat(fin.fileno()).st_mode):
                    raise CommandExecutionError(f"backup {m['id']}: {name} is not a file inside {directory}")
                dst = os.open(os.path.join(staging, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(dst, "wb") as fout:
                    digests[name] = _copy_hashing(fin, fout)
            top[d["target"]] = os.path.join(staging, name)
    verify(staging, chain, digests)
    return top


def _copy_hashing(fin: Any, fout: Any, block: int = 1 << 22) -> str:
    """Copy ``fin`` to ``fout``; the sha256 of the bytes written."""
    h = hashlib.sha256()
    buf = memoryview(bytearray(block))
    while n := fin.readinto(buf):
        h.update(buf[:n])
        fout.write(buf[:n])
    return h.hexdigest()


# chains and deletion --------------------------------------------------------------------------------
def chain_of(valid: list[Data], bid: str) -> list[Data]:
    """The manifests of backup ``bid``'s chain (its full backup first), from ``valid``."""
    by_id = {m["id"]: m for m in valid}
    if bid not in by_id:
        raise SaltInvocationError(f"no valid backup {bid} (valid: {', '.join(by_id) or 'none'})")
    return [by_id[p] for p in by_id[bid]["chain"]]


def needed_by(valid: list[Data], bid: str) -> list[str]:
    """Ids of the backups whose chain includes ``bid`` (other than itself)."""
    return [m["id"] for m in valid if bid in m["chain"] and m["id"] != bid]


def remove(directory: str, vm: str, uuid: str | None, bid: str, files: list[str]) -> Data:
    """Remove backup ``bid``: its manifest first (it is invalid from then on), then its files (owned
    ones only, nothing another image backs onto). ``{removed, kept}``."""
    doomed = [manifest_file(directory, bid)] + [os.path.join(directory, f) for f in files]
    out = images.remove_owned(directory, vm, uuid, doomed)
    return {"removed": [os.path.basename(p) for p in out["removed"]], "kept": out["kept"]}


def leftovers(directory: str, incomplete: Iterable[str]) -> list[str]:
    """Every file of the interrupted backups ``incomplete`` (ids) in ``directory``."""
    ids = set(incomplete)
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.partition(".")[0] in ids)


# retention ------------------------------------------------------------------------------------------
def _day(m):
    return (m.get("finished") or m["id"])[:10].replace("-", "")


def _week(m):
    d = datetime.datetime.strptime(_day(m)[:8], "%Y%m%d").date()
    return tuple(d.isocalendar()[:2])


def retention(
    valid: list[Data], keep: Any = None, keep_daily: Any = None, keep_weekly: Any = None
) -> tuple[list[str], list[str]]:
    """``(kept, pruned)`` ids under a retention policy: the ``keep`` newest backups, the newest backup of
    each of the last ``keep_daily`` days and of the last ``keep_weekly`` ISO weeks that have backups;
    then every backup a kept one builds on (a chain is never broken). ``pruned`` is newest first, so
    an incremental goes before the backup it builds on. No rule given: keeps everything."""
    rules = {"keep": keep, "keep_daily": keep_daily, "keep_weekly": keep_weekly}
    rules = {k: validate.positive_int(v, k) for k, v in rules.items() if v not in (None, "", 0, "0")}
    newest_first = sorted(valid, key=lambda m: (m.get("finished") or "", m["id"]), reverse=True)
    if not rules:
        return [m["id"] for m in reversed(newest_first)], []
    keep_ids = {m["id"] for m in newest_first[: rules.get("keep", 0)]}
    for key, period in (("keep_daily", _day), ("keep_weekly", _week)):
        seen: list[str] = []
        for m in newest_first:
            p = period(m)
            if p not in seen:
                if len(seen) == rules.get(key, 0):
                    break
                seen.append(p)
                keep_ids.add(m["id"])
    by_id = {m["id"]: m for m in valid}
    for bid in list(keep_ids):
        keep_ids.update(p for p in by_id[bid]["chain"] if p in by_id)
    kept = [m["id"] for m in reversed(newest_first) if m["id"] in keep_ids]
    pruned = [m["id"] for m in newest_first if m["id"] not in keep_ids]
    return kept, pruned
