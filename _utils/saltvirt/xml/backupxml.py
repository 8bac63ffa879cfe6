"""Backup XML: ``<domainbackup>`` (push mode into files) and ``<domaincheckpoint>`` (one bitmap per
disk), the only builders of both; and the reader of a checkpoint's name and disks.

Push mode: QEMU writes each disk's backup into a qcow2 file salt-virt names. Pull mode: QEMU serves
each disk over NBD and salt-virt reads it (:mod:`saltvirt.vm.backuppull`). A full backup copies
every block; an incremental one (``incremental=<checkpoint>``) only the blocks written since that
checkpoint. Checkpoints are persistent dirty bitmaps in the qcow2 disks, so a disk that is not qcow2
gets ``checkpoint='no'`` and can only ever be copied in full.
"""

import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable, Mapping

from saltvirt.base.salttypes import Data
from saltvirt.xml.etree import sub


def backup_xml(copy: Mapping[str, str], skip: Collection[str] = (), incremental: str | None = None) -> str:
    """``<domainbackup mode='push'>`` writing each disk of ``copy`` ({target dev: new qcow2 file});
    the disks of ``skip`` are named with ``backup='no'`` (libvirt would otherwise copy every disk).
    ``incremental``: the checkpoint whose changes since are copied (none: a full copy)."""
    root = ET.Element("domainbackup", mode="push")
    if incremental:
        sub(root, "incremental", incremental)
    el = sub(root, "disks")
    for target, path in copy.items():
        disk = sub(el, "disk", name=target, backup="yes", type="file")
        sub(disk, "target", file=path)
        sub(disk, "driver", type="qcow2")
    for target in skip:
        sub(el, "disk", name=target, backup="no")
    return ET.tostring(root, encoding="unicode")


def pull_xml(
    socket: str, scratch: Mapping[str, str], skip: Collection[str] = (), incremental: str | None = None
) -> str:
    """``<domainbackup mode='pull'>``: QEMU serves each disk of ``scratch`` ({target dev: scratch qcow2
    file}) as it was at the start over NBD on the unix ``socket``, keeping the old blocks a guest write
    replaces in the disk's scratch file (fleecing: the guest's write waits for a local copy only, never
    for the backup's reader). ``skip`` and ``incremental`` as :func:`backup_xml`."""
    root = ET.Element("domainbackup", mode="pull")
    if incremental:
        sub(root, "incremental", incremental)
    sub(root, "server", transport="unix", socket=socket)
    el = sub(root, "disks")
    for target, path in scratch.items():
        disk = sub(el, "disk", name=target, backup="yes", type="file")
        sub(disk, "scratch", file=path)
    for target in skip:
        sub(el, "disk", name=target, backup="no")
    return ET.tostring(root, encoding="unicode")


def exports(xml: str) -> dict[str, tuple[str, str | None]]:
    """``{target dev: (NBD export name, dirty bitmap name or None)}`` of a running pull-mode job
    (``backupGetXMLDesc``: libvirt names them)."""
    out = {}
    for d in ET.fromstring(xml).findall("disks/disk"):
        if d.get("backup") != "no":
            name = d.get("name") or ""
            out[name] = (d.get("exportname") or name, d.get("exportbitmap"))
    return out


def backup_files(xml: str) -> list[str]:
    """The target and scratch files of a ``<domainbackup>`` (what :func:`backup_xml` or :func:`pull_xml`
    wrote; libvirt's ``backupGetXMLDesc`` of a running job)."""
    disks = ET.fromstring(xml).findall("disks/disk")
    return [t.get("file", "") for d in disks for t in (d.find("target"), d.find("scratch")) if t is not None]


def checkpoint_xml(
    name: str,
    bitmaps: Iterable[str],
    skip: Collection[str] = (),
    description: str | None = None,
    created: int | None = None,
) -> str:
    """``<domaincheckpoint>`` named ``name`` with a bitmap on each disk of ``bitmaps`` (target devs) and
    none on those of ``skip``. ``created`` (unix time): the XML that redefines an existing checkpoint
    (``VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE``), with its creation time and each disk's bitmap named
    (libvirt names a checkpoint's bitmaps after it)."""
    root = ET.Element("domaincheckpoint")
    sub(root, "name", name)
    if description:
        sub(root, "description", description)
    if created is not None:
        sub(root, "creationTime", str(int(created)))
    el = sub(root, "disks")
    for target in bitmaps:
        if created is None:
            sub(el, "disk", name=target, checkpoint="bitmap")
        else:
            sub(el, "disk", name=target, checkpoint="bitmap", bitmap=name)
    for target in skip:
        sub(el, "disk", name=target, checkpoint="no")
    return ET.tostring(root, encoding="unicode")


def parse_checkpoint(xml: str) -> Data:
    """``{name, created (unix time), parent, bitmaps: [target devs]}`` of a checkpoint's XML."""
    root = ET.fromstring(xml)
    return {
        "name": root.findtext("name"),
        "created": int(root.findtext("creationTime") or 0),
        "parent": root.findtext("parent/name"),
        "bitmaps": [d.get("name") for d in root.findall("disks/disk") if d.get("checkpoint") == "bitmap"],
    }
