"""``virt.backup``, ``virt.backup_list``, ``virt.backup_delete``, ``virt.backup_prune``: backups of one
VM on its hypervisor into the operator's backup directory (layout: :mod:`saltvirt.vm.backupstore`).

A running VM is backed up live with libvirt's backup API (push mode into qcow2 files): QEMU copies
the disks as they were when the job began while the guest runs on. Each live backup also creates a
checkpoint (a dirty bitmap per qcow2 disk), so the next backup with ``incremental=True`` copies only
the blocks written since. A stopped VM is copied with ``qemu-img convert`` (libvirt makes no
checkpoint of an inactive VM, so the next backup is full). With the QEMU guest agent connected the
guest's filesystems are frozen for the instant the job starts and thawed at once (``fs_freeze`` in the
result: how many the agent froze and thawed); without it the backup is crash-consistent, and the
result says which.

Checkpoints and the other operations: a snapshot revert discards the VM's checkpoints
(:func:`saltvirt.host.snapshot.revert`); a restored VM has none on its new definition (nor bitmaps in
its new disks). A live-migrated VM has no checkpoint metadata on the target (libvirt does not carry
it), but its qcow2 disks still hold the bitmaps: the next incremental backup redefines the parent's
checkpoint from them when libvirt validates them (:func:`redefine`; ``checkpoint_redefined`` in the
result). Without a usable parent checkpoint an incremental backup cannot be made: a full one is made
and the result says why (``note``).
"""

import concurrent.futures
import datetime
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import metrics, tools, validate
from saltvirt.base.config import virt_conf
from saltvirt.base.fsutil import file_digest, remove_paths
from saltvirt.base.salttypes import Conn, Data, Domain
from saltvirt.host.conn import get_domain, libvirt, lv_errors
from saltvirt.storage import images
from saltvirt.vm import backuppull, backupstore
from saltvirt.xml import backupxml
from saltvirt.xml.domain import definition

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 6 * 3600  # seconds a backup job may run (virt:backup:timeout)
PULL, PUSH = "pull", "push"  # virt:backup:mode
POLL_FIRST, POLL_MAX = 0.01, 0.2  # seconds between looks at the running job: short first, then backing off
CONSISTENT = "filesystems frozen by the guest agent at the start"
CRASH = "crash-consistent (no guest agent answered: like pulling the power cord at the start)"
NONE_FROZEN = "crash-consistent (the guest agent froze no filesystem: it found none it can freeze)"
OFFLINE = "consistent (VM stopped: copied offline)"


def _utc():
    return datetime.datetime.now(datetime.timezone.utc)


def _iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# what to copy ---------------------------------------------------------------------------------------
def choose_disks(facts: Data, disks: str | list[str] | None = None) -> list[Data]:
    """The VM's disks to back up: ``[{target, file, format}]`` (default: every writable file disk).
    ``disks``: target devs (``vda,vdb`` or a list). Raises for an unknown or unsupported disk."""
    usable = {
        d["target"]: d
        for d in facts["disks"]
        if d["device"] == "disk" and d["type"] == "file" and not d["readonly"] and not d["shareable"]
    }
    if disks in (None, "", []):
        if not usable:
            raise CommandExecutionError(f"VM {facts['name']} has no file-backed writable disk to back up")
        return list(usable.values())
    wanted = [w.strip() for w in disks.split(",")] if isinstance(disks, str) else list(disks)
    every = {d["target"]: d for d in facts["disks"]}
    for w in wanted:
        if w not in every:
            raise SaltInvocationError(f"VM {facts['name']} has no disk {w!r} (its disks: {', '.join(every)})")
        if w not in usable:
            raise SaltInvocationError(
                f"disk {w} of VM {facts['name']} cannot be backed up: only writable, unshared file disks can "
                "(pool volumes, CD-ROMs and shared disks are not supported)"
            )
    return [usable[w] for w in dict.fromkeys(wanted)]


def skipped(facts: Data, chosen: list[Data]) -> dict[str, str]:
    """``{target: why}`` of the VM's disks a backup of ``chosen`` leaves out: said in the result and the
    manifest, so that nobody takes a backup for a copy of a disk it does not hold."""
    taken = {d["target"] for d in chosen}
    out = {}
    for d in facts["disks"]:
        if d["target"] in taken:
            continue
        if d["pool"]:
            why = f"a volume of pool {d['pool']} ({d['volume']}): not backed up (file disks only; back the pool up)"
        elif d["device"] != "disk":
            why = f"a {d['device']}: not backed up"
        elif d["type"] != "file":
            why = f"a {d['type']} disk ({d['file']}): not backed up (file disks only)"
        elif d["readonly"] or d["shareable"]:
            why = f"{'read-only' if d['readonly'] else 'shared with other VMs'}: not backed up"
        else:
            why = "not in disks="
        out[d["target"]] = why
    return out


def _checkpoints(dom):
    """Names of the VM's salt-virt backup checkpoints."""
    with lv_errors(f"list the checkpoints of VM {dom.name()!r}"):
        return [c.getName() for c in dom.listAllCheckpoints(0) if c.getName().startswith(backupstore.CHECKPOINT_PREFIX)]


def plan(
    dom: Domain, chosen: list[Data], valid: list[Data], incremental: bool, every: list[str] | None = None
) -> tuple[Data | None, str | None]:
    """``(parent manifest or None, note)``: what an incremental backup builds on, or why it cannot.
    A parent checkpoint whose metadata is gone is redefined from the disks' bitmaps when libvirt finds
    them valid (:func:`redefine`). ``every``: the target devs of all the VM's disks."""
    if not incremental:
        return None, None
    if not valid:
        return None, "no earlier backup of this VM: made a full one"
    parent = valid[-1]
    if not dom.isActive():
        return None, "the VM is stopped (libvirt checkpoints need a running VM): made a full offline copy"
    targets = [d["target"] for d in chosen]
    if [d["target"] for d in parent["disks"]] != targets:
        return None, f"the disks differ from those of backup {parent['id']}: made a full one"
    not_qcow2 = [d["target"] for d in chosen if d["format"] != "qcow2"]
    if not_qcow2:
        return None, f"disk(s) {', '.join(not_qcow2)} are not qcow2 (no dirty bitmaps): made a full one"
    if parent.get("uuid") != dom.UUIDString():
        return None, f"backup {parent['id']} is of an earlier VM of this name: made a full one"
    if not parent.get("checkpoint") or parent["checkpoint"] not in _checkpoints(dom):
        why = redefine(dom, parent, every or targets) if parent.get("checkpoint") else "it made none to redefine"
        if why:
            return None, (
                f"the checkpoint of backup {parent['id']} is gone from the VM and {why} (offline copy, snapshot "
                "revert, restore, or a migration that did not carry the disks' bitmaps): made a full one"
            )
    return parent, None


def redefine(dom: Domain, parent: Data, every: list[str]) -> str | None:
    """Give libvirt back the metadata of ``parent``'s checkpoint when the bitmaps it names are in the
    running VM's disks: libvirt does not carry checkpoint metadata across a migration, while QEMU
    carries the persistent bitmaps in the qcow2 files (shared storage) or in the migration stream.
    ``VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE_VALIDATE`` makes libvirt check that each bitmap is in the
    disk's active layer, recording and consistent, so a bitmap that missed writes is never used.
    Returns None when redefined, else why not (for the backup's note)."""
    validate_flag = getattr(libvirt, "VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE_VALIDATE", None)
    if validate_flag is None:
        return "this libvirt cannot check the disks' bitmaps (no REDEFINE_VALIDATE): it is not redefined"
    bitmaps = [d["target"] for d in parent["disks"]]
    created = datetime.datetime.strptime(parent["started"], "%Y-%m-%dT%H:%M:%SZ")
    xml = backupxml.checkpoint_xml(
        parent["checkpoint"],
        bitmaps,
        skip=[t for t in every if t not in bitmaps],
        created=int(created.replace(tzinfo=datetime.timezone.utc).timestamp()),
    )
    try:
        dom.checkpointCreateXML(xml, libvirt.VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE | validate_flag)
    except libvirt.libvirtError as exc:
        return f"its bitmaps are not usable in the disks (libvirt: {exc.get_error_message() or exc})"
    log.info("VM %s: redefined checkpoint %s from the bitmaps in its disks", dom.name(), parent["checkpoint"])
    return None


# copying --------------------------------------------------------------------------------------------
def _freeze(dom, facts):
    """Freeze the guest's filesystems if its agent answers: ``(how many it froze or None, consistency)``
    (None: no agent asked or it failed; then nothing is to be thawed)."""
    if facts.get("guest_agent") != "connected":
        return None, CRASH
    try:
        frozen = dom.fsFreeze()
    except libvirt.libvirtError as exc:
        log.info("VM %s: guest agent did not freeze (%s): crash-consistent backup", dom.name(), exc)
        return None, CRASH
    return frozen, CONSISTENT if frozen else NONE_FROZEN


def _wait_job(dom, timeout):
    """Wait for the backup job to end; raise if it failed or ran past ``timeout`` (then aborted). Polled
    at 10 ms, doubling up to 200 ms: an incremental job often ends within tens of ms, and a fixed 200 ms
    poll was most of its wall time (libvirt's job events would need an event loop on the caller's
    connection)."""
    deadline, pause = time.monotonic() + timeout, POLL_FIRST
    while True:
        with lv_errors(f"follow the backup job of VM {dom.name()!r}"):
            active = dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE
        if not active:
            break
        if time.monotonic() > deadline:
            with lv_errors(f"abort the backup job of VM {dom.name()!r}"):
                dom.abortJob()
            raise CommandExecutionError(f"backup of VM {dom.name()} ran past {timeout} s (virt:backup:timeout)")
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX)
    with lv_errors(f"read the backup job's result of VM {dom.name()!r}"):
        stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
    if stats.get("operation") != libvirt.VIR_DOMAIN_JOB_OPERATION_BACKUP or not stats.get("success"):
        raise CommandExecutionError(
            f"the backup job of VM {dom.name()} failed: {stats.get('errmsg') or 'libvirt gave no reason'}"
        )
    return stats


def _begin(dom, bxml, cxml, every):
    try:
        dom.backupBegin(bxml, cxml, 0)
    except libvirt.libvirtError as exc:
        if "Bitmap already exists: backup-" not in str(exc):
            raise
        _drop_scratch_bitmaps(dom, every)  # what an interrupted backup left in QEMU: once more without it
        dom.backupBegin(bxml, cxml, 0)


def _live(dom, facts, chosen, files, parent, checkpoint, timeout, on_started, mode=PULL, depth=backuppull.DEPTH):
    """Live backup of the running VM into ``files`` (pull mode, :mod:`saltvirt.vm.backuppull`, or push
    mode), with a new checkpoint when ``checkpoint`` is a name; returns ``(consistency, whether the
    checkpoint was made, fs_freeze, digests)``; ``fs_freeze``: ``{frozen, thawed}`` as the guest agent
    counted them, None when no agent froze; ``digests``: ``{file: sha256}`` taken while the files were
    written (pull), or None (push: QEMU wrote them)."""
    every = [d["target"] for d in facts["disks"] if d["device"] == "disk"]
    skip = [t for t in every if t not in files]
    bitmaps = [d["target"] for d in chosen if d["format"] == "qcow2"] if checkpoint else []
    since = parent["checkpoint"] if parent else None
    bxml = backupxml.backup_xml(files, skip=skip, incremental=since)
    cxml = backupxml.checkpoint_xml(checkpoint, bitmaps, skip=[t for t in every if t not in bitmaps])
    pull = backuppull.Pull(dom, files, skip, since, _owner(chosen), depth) if mode == PULL else None
    frozen, consistency = _freeze(dom, facts)
    thawed = None
    try:
        with lv_errors(f"start the backup of VM {dom.name()!r}"):
            if pull:
                try:
                    _begin(dom, pull.xml, cxml if bitmaps else None, every)
                    pull.begun = True
                except libvirt.libvirtError as exc:  # e.g. an NBD server an interrupted job left running
                    log.warning("VM %s: pull-mode backup refused (%s): push mode", dom.name(), exc)
                    pull.end()
                    pull = None
            if not pull:
                _begin(dom, bxml, cxml if bitmaps else None, every)
    except BaseException:
        if pull:
            pull.end()
        raise
    finally:
        if frozen is not None:  # thawed even when it froze none: the agent may still count itself frozen
            try:
                thawed = dom.fsThaw()
            except libvirt.libvirtError as exc:  # the guest stays frozen: say so loudly, in the result too
                log.error("VM %s: thawing its filesystems failed: %s (virsh domfsthaw)", dom.name(), exc)
                consistency = f"{CONSISTENT}; THAWING FAILED, the guest may still be frozen: {exc} (virsh domfsthaw)"
    fs_freeze = {"frozen": frozen, "thawed": thawed} if frozen is not None else None
    if not pull:
        if on_started:
            on_started()  # fault-injection point of the integration tests (kill libvirtd mid-job)
        _wait_job(dom, timeout)
        return consistency, bool(bitmaps), fs_freeze, None
    try:
        if on_started:
            on_started()
        backings = {t: _parent_file(parent, t) for t in files}
        digests = pull.copy(backings, time.monotonic() + timeout)
    finally:
        pull.end()
    return consistency, bool(bitmaps), fs_freeze, digests


def _owner(chosen):
    """The stat of the first disk's file: QEMU runs as its owner (libvirt's dynamic ownership)."""
    try:
        return os.stat(chosen[0].get("file") or "")
    except OSError:
        return None


def _parent_file(parent, target):
    return next(p["file"] for p in parent["disks"] if p["target"] == target) if parent else None


def _offline(chosen, files):
    for d in chosen:
        images.clone(d["file"], files[d["target"]], fmt="qcow2", src_fmt=d["format"])
    return OFFLINE


def _rebase(path, parent_file):
    """Point an incremental file at its parent backup file (relative: the directory may move)."""
    cmd = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", parent_file, path]
    tools.run(cmd, f"linking {path} to {parent_file}", timeout=120, install="qemu-utils")


def _describe_disks(directory, chosen, files, parent, digests=None):
    """The manifest's disks. ``digests``: the sha256 of each file taken as it was written (pull mode:
    those files already name their parent); without them, each file is linked to its parent and read."""
    backings = {d["target"]: _parent_file(parent, d["target"]) for d in chosen}
    if digests is None:
        for d in chosen:
            if parent:
                _rebase(files[d["target"]], backings[d["target"]])
        digests = _digests([files[d["target"]] for d in chosen])
    out = []
    for d in chosen:
        path, backing = files[d["target"]], backings.get(d["target"])
        out.append(
            {
                "target": d["target"],
                "file": os.path.basename(path),
                "source": d["file"],
                "format": "qcow2",
                "backing": backing,
                "virtual_size": images.qcow2_virtual_size(path),
                "size": os.stat(path).st_size,
                "sha256": digests[path],
            }
        )
    return out


def _digests(paths):
    """``{path: sha256}``, the disks' files hashed side by side (hashlib leaves the GIL while it hashes):
    a VM's disks take the time of the largest, not of them all."""
    if len(paths) < 2:
        return {p: file_digest(p) for p in paths}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1)) as pool:
        return dict(zip(paths, pool.map(file_digest, paths), strict=True))


def _drop_old_checkpoints(dom, keep):
    """Only the newest backup checkpoint is needed (the next incremental builds on it): others go."""
    dropped = []
    for name in _checkpoints(dom):
        if name != keep:
            try:
                dom.checkpointLookupByName(name, 0).delete(0)
                dropped.append(name)
            except libvirt.libvirtError as exc:
                log.warning("VM %s: could not delete checkpoint %s: %s", dom.name(), name, exc)
    return dropped


# the face -------------------------------------------------------------------------------------------
def configured_mode(opts: Mapping[str, Any]) -> str:
    """``virt:backup:mode`` of the minion config: ``pull`` (default) or ``push``."""
    conf = virt_conf(opts).get("backup") or {}
    mode = (conf.get("mode") if isinstance(conf, dict) else None) or PULL
    if mode not in (PULL, PUSH):
        raise CommandExecutionError(f"virt:backup:mode must be 'pull' or 'push', not {mode!r}")
    return mode


def configured_depth(opts: Mapping[str, Any]) -> int:
    """``virt:backup:pull_depth`` of the minion config: the NBD reads a pull copy keeps in flight (1 to 16,
    default 1: the guest's own disk writes keep the larger share; more copy faster)."""
    conf = virt_conf(opts).get("backup") or {}
    depth = (conf.get("pull_depth") if isinstance(conf, dict) else None) or backuppull.DEPTH
    return validate.positive_int(depth, "virt:backup:pull_depth", maximum=backuppull.MAX_DEPTH)


def configured(opts: Mapping[str, Any]) -> tuple[str, int, bytes]:
    """``(directory, timeout, manifest key)`` of a backup from the minion config ``opts`` (``virt:backup``: an
    operator setting, never read from pillar or grains, which callers write)."""
    conf = virt_conf(opts).get("backup") or {}
    conf = conf if isinstance(conf, dict) else {}
    timeout = validate.positive_int(conf.get("timeout") or DEFAULT_TIMEOUT, "virt:backup:timeout")
    root = backupstore.root_dir(conf.get("dir"))
    return root, timeout, backupstore.manifest_key(conf.get("key_file"), opts["pki_dir"])


def backup(
    conn: Conn,
    root: str,
    name: str,
    disks: str | list[str] | None = None,
    incremental: bool = False,
    target: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    on_started: Callable[[], Any] | None = None,
    *,
    key: bytes,
    mode: str = "pull",
    depth: int = backuppull.DEPTH,
) -> Data:
    """Back up VM ``name`` into ``<root>/[<target>/]<name>/<uuid>/``. Returns the backup's manifest (without
    the domain XML) plus ``dir``, ``note`` (why a full one was made when an incremental was asked)
    and ``removed_incomplete`` (files of interrupted backups cleaned up first); ``skipped``: ``{target: why}``
    of the disks it does not hold (pool volumes, CD-ROMs, shared, read-only or not asked for). ``key``: the
    manifests' key (:func:`saltvirt.vm.backupstore.manifest_key`); ``mode``: how a running VM is copied,
    ``pull`` (:mod:`saltvirt.vm.backuppull`) or ``push`` (``virt:backup:mode``); ``depth``: a pull copy's NBD
    reads in flight (``virt:backup:pull_depth``). Counted in salt-virt's metrics."""
    clock, kind = time.monotonic(), "incremental" if incremental else "full"  # a failure's type: what was asked
    try:
        out = _backup(conn, root, name, disks, incremental, target, timeout, on_started, key, mode, depth)
    except BaseException:
        metrics.add("saltvirt.vm.backups", result="failed", type=kind)
        metrics.record("saltvirt.vm.backup.duration", time.monotonic() - clock, result="failed", type=kind)
        metrics.flush()
        raise
    metrics.add("saltvirt.vm.backups", result="ok", type=out["type"])
    metrics.record("saltvirt.vm.backup.duration", time.monotonic() - clock, result="ok", type=out["type"])
    metrics.add("saltvirt.vm.backup.bytes", out["size"], type=out["type"])
    metrics.flush()
    return out


def _backup(conn, root, name, disks, incremental, target, timeout, on_started, key, mode, depth):
    dom = get_domain(conn, name)
    xml = dom.XMLDesc(0)
    facts = definition.parse(xml)
    uuid = dom.UUIDString()
    chosen = choose_disks(facts, disks)
    directory = backupstore.vm_dir(root, name, uuid, target, create=True)
    with backupstore.locked(directory, name):
        valid, _broken, incomplete = backupstore.scan(directory, key)
        cleaned = _clean_incomplete(directory, name, uuid, incomplete)
        live = bool(dom.isActive())
        every = [d["target"] for d in facts["disks"] if d["device"] == "disk"]
        stale = _end_stale_job(dom, directory, every) if live else False
        had = set(_checkpoints(dom)) if incremental and live else set()
        parent, note = plan(dom, chosen, valid, incremental, every)
        redefined = parent["checkpoint"] if parent and parent["checkpoint"] not in had else None
        ours = [c.removeprefix(backupstore.CHECKPOINT_PREFIX) for c in _checkpoints(dom)] if live else []
        bid = backupstore.new_id(directory, taken=[*ours, *backupstore.taken_ids(root, name, target)])
        files = {d["target"]: backupstore.disk_file(directory, bid, d["target"]) for d in chosen}
        scratch = [backuppull.scratch_file(p) for p in files.values()] if live and mode == PULL else []
        owned = [*files.values(), *scratch, backupstore.manifest_file(directory, bid)]
        images.record_owned(directory, name, owned, uuid)
        started, clock = _utc(), time.monotonic()
        checkpoint = f"{backupstore.CHECKPOINT_PREFIX}{bid}" if live else None
        if live and dom.snapshotNum(0):
            checkpoint, note = None, _with_snapshots(note, parent)
        try:
            if live:
                consistency, made, fs_freeze, digests = _live(
                    dom, facts, chosen, files, parent, checkpoint, timeout, on_started, mode, depth
                )
                # without a checkpoint of its own, the parent's still covers every change since this backup
                checkpoint = checkpoint if made else (parent or {}).get("checkpoint")
            else:
                consistency, fs_freeze, digests = _offline(chosen, files), None, None
            copied = time.monotonic() - clock
            described = _describe_disks(directory, chosen, files, parent, digests)
        except BaseException:
            remove_paths([p for p in files.values() if os.path.lexists(p)])
            raise
        manifest = {
            "format": backupstore.MANIFEST_FORMAT,
            "id": bid,
            "vm": name,
            "uuid": uuid,
            "host": conn.getHostname(),
            "type": "incremental" if parent else "full",
            "parent": parent["id"] if parent else None,
            "chain": [*(parent["chain"] if parent else []), bid],
            "checkpoint": checkpoint,
            "started": _iso(started),
            "finished": _iso(_utc()),
            "duration": round(time.monotonic() - clock, 3),  # copy + checksums + manifest
            "copy_seconds": round(copied, 3),
            "live": live,
            "mode": (PULL if digests is not None else PUSH) if live else "offline",
            "consistency": consistency,
            "fs_freeze": fs_freeze,
            "disks": described,
            "skipped": skipped(facts, chosen),
            "size": sum(d["size"] for d in described),
            "domain_xml": dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) if dom.isPersistent() else xml,
        }
        backupstore.write_manifest(directory, manifest, key)  # from here on it counts
    dropped = _drop_old_checkpoints(dom, checkpoint) if live and checkpoint else []
    out = backupstore.summary(manifest)
    out.update(dir=directory, note=note, removed_incomplete=cleaned, checkpoints_dropped=dropped)
    out["checkpoint_redefined"] = redefined
    out["stale_job_ended"] = stale
    out["mode"] = manifest["mode"]
    return out


def _end_stale_job(dom: Domain, directory: str, targets: list[str], wait: float = 120.0) -> bool:
    """End what a backup interrupted by a libvirtd restart left running on the VM, before a new one:
    the restarted libvirtd either keeps an empty backup job (libvirt 9: "backup job data missing") or
    follows QEMU's job on to the files the interrupted call already removed; both refuse every new
    backup. A backup job writing outside ``directory`` (this VM's backups, whose lock this call holds)
    was not started here: refused. True when a job was ended (and its scratch bitmaps removed)."""
    try:
        stats = dom.jobStats(0)
    except libvirt.libvirtError:
        return False
    if stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) == libvirt.VIR_DOMAIN_JOB_NONE:
        return False
    if stats.get("operation") != libvirt.VIR_DOMAIN_JOB_OPERATION_BACKUP:
        return False
    try:
        files = backupxml.backup_files(dom.backupGetXMLDesc(0))
    except libvirt.libvirtError:
        files = []  # no backup behind the job: the empty one
    if any(os.path.dirname(f) != directory for f in files):
        raise CommandExecutionError(
            f"VM {dom.name()} has a backup job running that salt-virt did not start (it writes "
            f"{', '.join(files)}): wait for it to end, or end it with 'virsh domjobabort {dom.name()}'"
        )
    with lv_errors(f"end the interrupted backup job of VM {dom.name()!r}"):
        dom.abortJob()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if dom.jobInfo()[0] == libvirt.VIR_DOMAIN_JOB_NONE:
                break
        except libvirt.libvirtError:
            break  # the empty job: nothing left to follow
        time.sleep(0.2)
    log.warning("VM %s: ended the backup job an interrupted backup left (%s)", dom.name(), files or "empty")
    _drop_scratch_bitmaps(dom, targets)
    return True


def _drop_scratch_bitmaps(dom: Domain, targets: list[str]) -> None:
    """Remove the scratch bitmaps (``backup-<disk>``, ``targets``: the VM's disk devs) libvirt made in QEMU
    for the interrupted backup: the stale job's end does not, and the next incremental backup would fail
    on "Bitmap already exists". libvirt has no API for them: QEMU's own commands (QMP)."""
    import libvirt_qemu  # noqa: PLC0415 - only on this repair path

    def qmp(command, **arguments):
        cmd = json.dumps({"execute": command, "arguments": arguments})
        return json.loads(libvirt_qemu.qemuMonitorCommand(dom, cmd, 0)).get("return")

    try:
        for node in qmp("query-named-block-nodes", flat=True) or []:
            for bitmap in node.get("dirty-bitmaps") or []:
                if bitmap.get("name", "").removeprefix("backup-") in targets:
                    qmp("block-dirty-bitmap-remove", node=node["node-name"], name=bitmap["name"])
                    log.warning(
                        "VM %s: removed scratch bitmap %s of the interrupted backup", dom.name(), bitmap["name"]
                    )
    except (libvirt.libvirtError, ValueError) as exc:
        log.warning("VM %s: could not check for scratch bitmaps of the interrupted backup: %s", dom.name(), exc)


def _with_snapshots(note, parent):
    """libvirt makes no checkpoint while the VM has snapshots: say what that means for the next backup."""
    said = (
        "the VM has snapshots and libvirt makes no checkpoint while it has any: "
        + ("the next incremental builds on the parent's checkpoint" if parent else "the next backup is full too")
        + " (delete the snapshots to get checkpoints again)"
    )
    return f"{note}; {said}" if note else said


def _clean_incomplete(directory, name, uuid, incomplete):
    """Remove what interrupted backups left (owned files only); their names."""
    if not incomplete:
        return []
    paths = backupstore.leftovers(directory, incomplete)
    out = images.remove_owned(directory, name, uuid, paths)
    for path, reason in out["kept"].items():
        log.warning("VM %s: left %s of an interrupted backup: %s", name, path, reason)
    return sorted(os.path.basename(p) for p in out["removed"])


def listing(root: str, name: str, target: str | None = None, *, key: bytes) -> Data:
    """``virt.backup_list``: ``{vm, dir, backups: [summaries, oldest first], broken, incomplete}`` of every VM
    named ``name`` (each summary names its VM's ``uuid``)."""
    valid, broken, incomplete = backupstore.scan_all(root, name, key, target)
    return {
        "vm": name,
        "dir": backupstore.name_dir(root, name, target),
        "backups": [backupstore.summary(m) for m in valid],
        "broken": broken,
        "incomplete": incomplete,
    }


def usage(root: str, *, key: bytes) -> Data:
    """``virt.backup_usage``: ``{"<uuid>/<id>": {vm, tenant, size}}`` of every valid backup below ``root`` (the
    tenant the backup recorded in its domain XML, None for none; ``size`` in bytes). Keyed by VM uuid and
    id, so the master counts a directory that several hypervisors share once."""
    out = {}
    for directory in backupstore.every_vm_dir(root):
        for m in backupstore.scan(directory, key)[0]:
            owner = backupstore.recorded(m.get("domain_xml"))["owner"] or {}
            out[f"{os.path.basename(directory)}/{m['id']}"] = {
                "vm": m.get("vm"),
                "tenant": owner.get("tenant"),
                "size": int(m.get("size") or 0),
            }
    return out


def delete(root: str, name: str, bid: str, target: str | None = None, test: bool = False, *, key: bytes) -> Data:
    """``virt.backup_delete``: remove one backup unless a valid backup still builds on it."""
    directory = backupstore.find(root, name, bid, target)
    with backupstore.locked(directory, name):
        valid, broken, _incomplete = backupstore.scan(directory, key)
        by_id = {m["id"]: m for m in valid}
        if bid not in by_id and bid not in broken:
            raise SaltInvocationError(f"VM {name} has no backup {bid} in {directory} (see virt.backup_list {name})")
        needed = backupstore.needed_by(valid, bid)
        if needed:
            raise CommandExecutionError(
                f"backup {bid} of VM {name} is needed by {', '.join(needed)} (they build on it): delete those first"
            )
        m = by_id.get(bid) or backupstore.read_manifest(directory, bid, key)[0] or {"disks": []}
        files = [d["file"] for d in m["disks"] if isinstance(d, dict) and isinstance(d.get("file"), str)]
        files = [f for f in files if os.path.basename(f) == f]
        if test:
            return {"id": bid, "removed": [f"{bid}.json", *files], "kept": {}, "test": True}
        return {"id": bid, **backupstore.remove(directory, name, os.path.basename(directory), bid, files)}


def prune(
    root: str,
    name: str,
    target: str | None = None,
    keep: Any = None,
    keep_daily: Any = None,
    keep_weekly: Any = None,
    test: bool = False,
    *,
    key: bytes,
) -> Data:
    """``virt.backup_prune``: apply a retention policy to the backups of each VM named ``name`` (its own
    chains: a later VM of the name does not push out the backups of an earlier one, nor they its);
    ``{kept, pruned, refused}`` (ids)."""
    kept, doomed = [], []
    for directory in backupstore.vm_dirs(root, name, target):
        valid, _broken, _incomplete = backupstore.scan(directory, key)
        k, d = backupstore.retention(valid, keep, keep_daily, keep_weekly)
        kept += k
        doomed += d
    pruned, refused = [], {}
    for bid in doomed:  # newest first per VM: what builds on a backup goes before it
        if test:
            pruned.append(bid)
            continue
        try:
            delete(root, name, bid, target, key=key)
            pruned.append(bid)
        except (CommandExecutionError, SaltInvocationError) as exc:
            refused[bid] = str(exc)
    return {"vm": name, "kept": kept, "pruned": pruned, "refused": refused, "test": bool(test)}
