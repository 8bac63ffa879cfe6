"""``virt.restore``: a backup chain rebuilt into fresh disks and the VM defined from the XML the backup
recorded (the backups themselves: :mod:`saltvirt.vm.backup`, :mod:`saltvirt.vm.backupstore`).

Every manifest of the chain is checked first (its MAC: :mod:`saltvirt.vm.backupstore`), what the
recorded definition gives the VM besides the restored disks (:func:`_admit`: the checks any VM's disks
and host files pass), then every file, copied into a private staging directory first (checksum, and that
it backs onto exactly its parent: :func:`saltvirt.vm.backupstore.stage`); then each disk's staged chain
is flattened by ``qemu-img convert`` into a new qcow2 file in
``<virt:images>/<vm>/`` that the VM's ownership manifest lists (purge removes it). Nothing is
overwritten: a restore in place (same name) of a defined VM is refused while it runs unless
``force=True`` (it is stopped then), and the disks it restores over are removed only when salt-virt
created them for this VM; a disk the backup does not have is left in place, detached (``detached`` in
the result). ``as_name`` restores beside the original: a new name, uuid and MAC addresses.
"""

import logging
import os
import shutil
import tempfile

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.fsutil import remove_paths
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import define, domain_exists, get_domain, libvirt, lv_errors
from saltvirt.host.snapshot import discard_checkpoints
from saltvirt.model import vmspec
from saltvirt.storage import attach, firmware, images
from saltvirt.vm import backupstore
from saltvirt.xml.domain import definition, edit

log = logging.getLogger(__name__)


def _existing(conn, name, new, force):
    """The VM that will be replaced (in place), or None; refuses what must not be replaced (nothing is
    changed yet: :func:`_stop` powers it off once the restore is admitted)."""
    if not domain_exists(conn, new):
        return None
    if new != name:
        raise SaltInvocationError(f"a VM named {new} exists already: choose another as_name")
    dom = get_domain(conn, new)
    if dom.isActive() and not force:
        raise CommandExecutionError(
            f"VM {name} is running: restoring in place replaces its disks. Stop it first, restore with "
            f"as_name=<new name> beside it, or pass force=True (it is powered off)"
        )
    return dom


def _stop(dom):
    if dom is not None and dom.isActive():
        with lv_errors(f"stop VM {dom.name()!r}"):
            dom.destroy()


def _admit(conn, xml, restored, *, vm, uuid, images_dir, settings):
    """Check what the definition to restore gives VM ``vm`` besides the disks it restores (``restored``: their
    new files): it came from a backup directory that others may write to, and its MAC says that a hypervisor
    wrote it, not that it fits this one. Every other disk passes the door of any existing disk
    (:func:`saltvirt.storage.attach.admit`: within ``virt:images``/``virt:allowed_paths``, a pool the operator
    lists, no other VM's); a CD-ROM whose medium does not pass is restored empty (read-only media, not in the
    backup). Kernel, initrd and serial log stay within those directories, firmware is the host's or the
    operator's. Returns ``(xml, ejected: {target: why})``."""
    roots = (images_dir, *(settings.get("allowed_paths") or ()))
    facts = definition.parse(xml)
    ejected = {}
    for d in facts["disks"]:
        if d["file"] in restored or not d["file"]:
            continue
        disk = vmspec.Disk(name=d["target"], format=d["format"], device=d["device"], attach=True)
        try:
            if d["pool"]:
                disk.pool, disk.volume = d["pool"], d["volume"]
            elif d["type"] in ("file", "block"):
                disk.path = validate.confined(d["file"], f"path of disk {d['target']}", roots)
            else:
                raise SaltInvocationError(
                    f"disk {d['target']} is a {d['type']} disk: a restore gives a VM the disks it restores, and files "
                    "and pool volumes that pass the checks of any disk; attach it again after the restore"
                )
            attach.admit(conn, [disk], vm=vm, uuid=uuid, images_dir=images_dir, settings=settings)
        except SaltInvocationError as exc:
            if d["device"] != "cdrom":
                raise
            ejected[d["target"]] = str(exc)
    boot = facts["boot"]
    for key in ("kernel", "initrd"):
        if boot.get(key):
            validate.confined(boot[key], f"boot:{key}", roots)
    if facts["serial_log"]:
        validate.confined(facts["serial_log"], "serial_log", (*roots, vmspec.SERIAL_LOG_DIR))
    files = [
        ("boot:kernel", boot.get("kernel")),
        ("boot:initrd", boot.get("initrd")),
        ("serial_log", facts["serial_log"]),
    ]
    attach.host_files(conn, files, vm=vm, uuid=uuid, images_dir=images_dir)
    fw = definition.feature_facts(xml)["firmware"]
    boot_fw = vmspec.Boot(loader=fw["loader"], nvram=fw["nvram"])
    firmware.check(conn, boot_fw, vm=vm, uuid=uuid, images_dir=images_dir, settings=settings)
    return (edit.eject(xml, ejected) if ejected else xml), ejected


def _replaced(vm_dir, dom, old_disks, restored):
    """Remove the disks of the VM restored over (``old_disks``, parsed before) that the backup restored
    (target devs ``restored``), when salt-virt created them for it: ``({removed, kept}, detached)``. Every
    other disk the new definition no longer uses (added after the backup) holds data the backup does not
    have: left where it is, detached, ``{target: file or pool/volume}``."""

    def source(d):
        return f"{d['pool']}/{d['volume']}" if d["pool"] else d["file"]

    now = {source(d) for d in definition.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))["disks"]}
    unused = [d for d in old_disks if d["device"] == "disk" and d["file"] and source(d) not in now]
    gone = [d["file"] for d in unused if d["target"] in restored and d["type"] == "file"]
    detached = {d["target"]: source(d) for d in unused if d["file"] not in gone}
    if detached:
        log.warning("VM %s: restored without disks the backup does not have, left detached: %s", dom.name(), detached)
    replaced: Data = images.remove_owned(vm_dir, dom.name(), dom.UUIDString(), gone) if gone else {}
    return replaced or {"removed": [], "kept": {}}, detached


def _identity_note(xml, new):
    """What a copy still shares with the original: the minion identity inside its disks (its <metadata>
    record is dropped, :func:`saltvirt.xml.domain.edit.restored`)."""
    minion = definition.parse(xml)["minion"]
    if not minion:
        return None
    return (
        f"the disks of {new} hold the minion key of {minion['id']}: started, it connects to the master as minion "
        f"{minion['id']}. Give it its own minion id and key inside the guest before it runs beside the original"
    )


def restore(
    conn: Conn,
    root: str,
    images_dir: str,
    name: str,
    bid: str,
    as_name: str | None = None,
    target: str | None = None,
    force: bool = False,
    start: bool = False,
    *,
    key: bytes,
    settings: Data | None = None,
) -> Data:
    """Restore backup ``bid`` of VM ``name`` (see the module docstring). Returns ``{name, id, chain,
    disks: {target: new file}, defined, started, replaced: {removed, kept}, detached: {target: disk},
    ejected: {target: why}, checkpoints_dropped, note}``. ``settings``: the operator's
    (:func:`saltvirt.base.switches.operator_settings`), for what the definition gives the VM besides the
    restored disks (:func:`_admit`)."""
    new = validate.vm_name(as_name, "as_name") if as_name else name
    directory = backupstore.find(root, name, bid, target)
    with backupstore.locked(directory, name):
        valid, broken, _incomplete = backupstore.scan(directory, key)
        if bid in broken:
            raise CommandExecutionError(f"backup {bid} of VM {name} cannot be restored: {broken[bid]}")
        chain = backupstore.chain_of(valid, bid)
        top = chain[-1]
        old = _existing(conn, name, new, force)
        old_disks = definition.parse(old.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))["disks"] if old is not None else []
        vm_dir = validate.inside(images_dir, new)
        disk_map = {d["source"]: os.path.join(vm_dir, f"{d['target']}-restored-{bid}.qcow2") for d in top["disks"]}
        xml = edit.restored(top["domain_xml"], disk_map, new_name=as_name if new != name else None)
        # in place the VM keeps its uuid (its own disks and volumes pass); a copy is a new VM
        uuid = old.UUIDString() if old is not None else definition.parse(xml)["uuid"] if new == name else None
        try:
            xml, ejected = _admit(
                conn, xml, set(disk_map.values()), vm=new, uuid=uuid, images_dir=images_dir, settings=settings or {}
            )
        except SaltInvocationError as exc:
            copy = f" as {new}" if new != name else ""
            raise SaltInvocationError(f"restoring backup {bid} of VM {name}{copy}: {exc}") from None
        os.makedirs(vm_dir, mode=0o755, exist_ok=True)
        made = []
        staging = tempfile.mkdtemp(prefix=f".restore-{bid}-", dir=vm_dir)  # private: 0700
        try:
            staged = backupstore.stage(directory, chain, staging)
            _stop(old)
            for d in top["disks"]:
                images.clone(staged[d["target"]], disk_map[d["source"]], fmt="qcow2", src_fmt="qcow2")
                made.append(disk_map[d["source"]])
            images.record_owned(vm_dir, new, made)
            with lv_errors(f"define VM {new!r}"):
                dom = define(conn, "domain", xml)
        except BaseException:
            remove_paths(made)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    images.set_uuid(vm_dir, dom.UUIDString())
    dropped = discard_checkpoints(dom, metadata_only=True)
    replaced, detached = _replaced(vm_dir, dom, old_disks, {d["target"] for d in top["disks"]})
    if start:
        with lv_errors(f"start VM {new!r}"):
            dom.create()
    return {
        "name": new,
        "id": bid,
        "note": _identity_note(top["domain_xml"], new) if new != name else None,
        "chain": top["chain"],
        "disks": {d["target"]: disk_map[d["source"]] for d in top["disks"]},
        "defined": True,
        "started": bool(start),
        "replaced": replaced,
        "detached": detached,
        "ejected": ejected,
        "checkpoints_dropped": dropped,
    }
