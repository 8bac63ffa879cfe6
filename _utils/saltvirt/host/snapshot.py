"""VM snapshots (Salt's ``snapshot``, ``list_snapshots``, ``revert_snapshot``, ``delete_snapshots``): internal
qcow2 snapshots through libvirt, the running VM's memory included. The domain-snapshot XML builder and
reader live here (and only here).

Internal snapshots live inside each qcow2 disk; a raw disk cannot hold one, so a VM with a raw (or
volume-in-a-raw-pool) disk is refused with the reason. libvirt keeps the snapshot list as metadata of
the domain: purge drops it together with the disks it deletes; migration refuses VMs that have any
(libvirt cannot migrate internal snapshots), see :func:`refuse_migration`."""

import datetime
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data, Domain
from saltvirt.host.conn import get_domain, libvirt, lv_errors
from saltvirt.xml.domain import definition


def snapshot_xml(name: str, description: str | None = None) -> str:
    """``<domainsnapshot>`` for an internal snapshot (libvirt's default: every qcow2 disk, plus memory
    when the VM runs)."""
    root = ET.Element("domainsnapshot")
    ET.SubElement(root, "name").text = name
    if description:
        ET.SubElement(root, "description").text = description
    return ET.tostring(root, encoding="unicode")


def parse_snapshot(xml: str, current: bool = False, unix_time: bool = False) -> Data:
    """Salt's snapshot description: {name, created, running, current} (+ state, description, parent)."""
    root = ET.fromstring(xml)
    created = float(root.findtext("creationTime") or 0)
    return {
        "name": root.findtext("name"),
        "created": created if unix_time else datetime.datetime.fromtimestamp(created).isoformat(" "),
        "running": root.findtext("state") == "running",
        "current": bool(current),
        "state": root.findtext("state"),
        "description": root.findtext("description"),
        "parent": root.findtext("parent/name"),
    }


def _describe(snap, unix_time=False):
    return parse_snapshot(snap.getXMLDesc(0), current=snap.isCurrent(0) == 1, unix_time=unix_time)


def _snapshots(dom):
    """Oldest first: by creation time, then (same second) by depth in the parent chain."""
    with lv_errors(f"list the snapshots of VM {dom.name()!r}"):
        snaps = dom.listAllSnapshots(0)
    facts = {s.getName(): _describe(s, unix_time=True) for s in snaps}

    def depth(name):
        seen = 0
        while facts.get(name, {}).get("parent") and seen < len(facts):
            name, seen = facts[name]["parent"], seen + 1
        return seen

    return sorted(snaps, key=lambda s: (facts[s.getName()]["created"], depth(s.getName()), s.getName()))


def _unsnapshottable(dom):
    """Disks that cannot hold an internal snapshot: [(target, format, source)]."""
    facts = definition.parse(dom.XMLDesc(0))
    out = []
    for disk in facts["disks"]:
        if disk["device"] != "disk":
            continue
        if disk["format"] != "qcow2":
            source = f"{disk['pool']}/{disk['volume']}" if disk.get("pool") else disk["file"]
            out.append((disk["target"], disk["format"] or "unknown", source))
    return out


def snapshot_name(domain: str, name: str | None = None, suffix: str | None = None, now: Any = None) -> str:
    """Salt's naming: ``name`` or ``<domain>-<YYYYmmdd-HHMMSS>``, then ``-<suffix>``."""
    if not name:
        name = f"{domain}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
    if suffix:
        name = f"{name}-{suffix}"
    if name.lower() == domain.lower():
        raise SaltInvocationError(f"a snapshot cannot be named like its VM ({domain}): choose another name")
    return validate.vm_name(name, "snapshot name")


def create(conn: Conn, domain: str, name: str | None = None, suffix: str | None = None, test: bool = False) -> Data:
    """Take an internal snapshot. Returns Salt's {name} plus {memory: VM was running}."""
    dom = get_domain(conn, domain)
    name = snapshot_name(domain, name, suffix)
    bad = _unsnapshottable(dom)
    if bad:
        listed = ", ".join(f"{t} ({fmt}: {src})" for t, fmt, src in bad)
        raise CommandExecutionError(
            f"VM {domain} cannot take an internal snapshot: {listed} is not qcow2 and cannot hold one. Convert "
            "the disk to qcow2 (qemu-img convert while the VM is off) or create the VM with format qcow2"
        )
    if name in {s.getName() for s in _snapshots(dom)}:
        raise SaltInvocationError(f"VM {domain} already has a snapshot named {name!r}: choose another name")
    running = bool(dom.isActive())
    if not test:
        with lv_errors(f"snapshot VM {domain!r}"):
            dom.snapshotCreateXML(snapshot_xml(name), 0)
    return {"name": name, "memory": running}


def list_all(conn: Conn, domain: str | None = None) -> dict[str, Any]:
    """Salt's ``list_snapshots``: {vm: [{name, created, running, current, ...}] or 'N/A'} (oldest first)."""
    doms = [get_domain(conn, domain)] if domain else conn.listAllDomains(0)
    return {d.name(): [_describe(s) for s in _snapshots(d)] or "N/A" for d in doms}


def names(conn: Conn, domain: str) -> list[str]:
    return [s.getName() for s in _snapshots(get_domain(conn, domain))]


def revert_plan(
    conn: Conn, domain: str, vm_snapshot: str | None = None, cleanup: bool = False
) -> tuple[Domain, Any, list[Any]]:
    """Which snapshot a revert goes to and what ``cleanup`` deletes (the snapshots taken after it).
    Without ``vm_snapshot``: the one before the current snapshot (Salt's "previous")."""
    dom = get_domain(conn, domain)
    snaps = _snapshots(dom)  # oldest first
    if not snaps:
        raise CommandExecutionError(f"VM {domain} has no snapshots: nothing to revert to")
    if vm_snapshot:
        index = next((i for i, s in enumerate(snaps) if s.getName() == vm_snapshot), None)
        if index is None:
            raise CommandExecutionError(
                f'Snapshot "{vm_snapshot}" not found for VM {domain} (it has: {", ".join(s.getName() for s in snaps)})'
            )
    else:
        current = next((i for i, s in enumerate(snaps) if s.isCurrent(0) == 1), len(snaps))
        if current == 0:
            raise CommandExecutionError(
                f"No more previous snapshots available: {snaps[0].getName()} is the oldest snapshot of VM {domain}"
                f" (name it with vm_snapshot={snaps[0].getName()} to go back to it)"
            )
        index = current - 1
    newer = [s.getName() for s in snaps[index + 1 :]] if cleanup else []
    return dom, snaps[index], newer


def revert(conn: Conn, domain: str, vm_snapshot: str | None = None, cleanup: bool = False, test: bool = False) -> Data:
    """Salt's ``revert_snapshot``: {reverted, deleted: [names] or 'N/A'}. The VM comes back in the state
    the snapshot recorded (running, with its memory, or shut off)."""
    dom, snap, newer = revert_plan(conn, domain, vm_snapshot, cleanup)
    dropped = []
    if not test:
        # first: QEMU refuses to load a snapshot into a disk with active dirty bitmaps (and the VM is gone)
        dropped = discard_checkpoints(dom)
        with lv_errors(f"revert VM {domain!r} to snapshot {snap.getName()!r}"):
            dom.revertToSnapshot(snap, 0)
        for name in newer:
            with lv_errors(f"delete snapshot {name!r} of VM {domain!r}"):
                dom.snapshotLookupByName(name, 0).delete(0)
    out = {"reverted": snap.getName(), "deleted": newer if cleanup else "N/A"}
    if dropped:
        out["checkpoints_discarded"] = dropped
    return out


def discard_checkpoints(dom: Domain, metadata_only: bool = False) -> list[str]:
    """Delete the VM's backup checkpoints (names) before a revert: QEMU refuses to load an internal
    snapshot into a disk with active dirty bitmaps, and after a revert they would no longer say what
    changed (the revert is no guest write), so an incremental built on them would miss blocks. The
    next backup is a full one (``saltvirt.vm.backup`` says why). ``metadata_only``: the
    disks holding the bitmaps are gone (a restore replaced them)."""
    flags = libvirt.VIR_DOMAIN_CHECKPOINT_DELETE_METADATA_ONLY if metadata_only else 0
    try:
        cps = dom.listAllCheckpoints(0)
    except libvirt.libvirtError:  # a driver without checkpoints (test:///) has none to drop
        return []
    names = []
    for cp in cps:
        with lv_errors(f"delete checkpoint {cp.getName()!r} of VM {dom.name()!r}"):
            cp.delete(flags)
        names.append(cp.getName())
    return names


def delete(conn: Conn, domain: str, names_: Iterable[str] = (), test: bool = False) -> Data:
    """Salt's ``delete_snapshots``: the named snapshots (none named: all). Every name must exist (nothing
    is deleted otherwise). Returns {available: {vm: [...] or 'N/A'}, deleted: {name: description}}."""
    dom = get_domain(conn, domain)
    snaps = _snapshots(dom)
    have = {s.getName() for s in snaps}
    missing = [n for n in names_ if n not in have]
    if missing:
        raise CommandExecutionError(
            f"VM {domain} has no snapshot {', '.join(missing)} (it has: {', '.join(sorted(have)) or 'none'}): "
            "nothing deleted"
        )
    deleted = {}
    for snap in reversed(snaps):  # newest first: no children left to merge into a deleted parent
        if names_ and snap.getName() not in names_:
            continue
        deleted[snap.getName()] = _describe(snap)
        if not test:
            with lv_errors(f"delete snapshot {snap.getName()!r} of VM {domain!r}"):
                snap.delete(0)
    left = [_describe(s) for s in _snapshots(dom)] if not test else [d for n, d in _all(snaps) if n not in deleted]
    return {"available": {domain: left or "N/A"}, "deleted": deleted}


def _all(snaps):
    return [(s.getName(), _describe(s)) for s in snaps]


def refuse_migration(dom: Domain) -> None:
    """libvirt cannot migrate a VM with internal snapshots: say so before anything is done."""
    try:
        count = dom.snapshotNum(0)
    except libvirt.libvirtError:
        return
    if count:
        listed = ", ".join(s.getName() for s in _snapshots(dom))
        raise CommandExecutionError(
            f"VM {dom.name()} has {count} snapshot(s) ({listed}): libvirt cannot migrate a VM with internal "
            f"snapshots. Delete them first (salt <hypervisor> virt.delete_snapshots {dom.name()}), nothing was "
            "migrated"
        )
