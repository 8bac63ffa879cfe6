"""The disk files of a VM salt-virt did not create (``virt.define_xml_*``, virt-install, an older Salt):
what ``virt.purge`` may delete, as Salt's purge deletes a VM's disks, and what it must keep.

A file goes only when all of these hold: it lies inside the roots the operator gave VMs (``virt:images``,
``virt:allowed_paths``, the target directories of this host's directory pools), it is a regular file
(no symlink, no device), it is not in another salt-virt VM's directory, no other domain on this host
uses it (as a disk or anywhere in a disk's backing chain) and no image under the roots backs onto it
(unless that image goes too). Everything else is kept, with the reason.
"""

import os
import stat
from collections.abc import Iterable, Sequence
from typing import Any

from saltvirt.base import validate
from saltvirt.xml import domxml
from saltvirt.storage import images
from saltvirt.host.conn import libvirt

DIR_POOL_TYPES = ("dir", "fs", "netfs")  # pools whose volumes are files in their target directory


def pool_dirs(conn: Any) -> list[str]:
    """Target directories of this host's running directory-like pools."""
    out = []
    for pool in conn.listAllStoragePools(0):
        try:
            if not pool.isActive():
                continue
            root = domxml.read(pool.XMLDesc(0))
        except libvirt.libvirtError:  # gone meanwhile
            continue
        path = root.findtext("target/path")
        if root.get("type") in DIR_POOL_TYPES and path and os.path.isabs(path):
            out.append(path)
    return out


def files_in_use(conn: Any, but: str | None = None) -> dict[str, str]:
    """{realpath: VM name} of every file a domain on this host (other than ``but``) uses: its disks, in
    its definition and while running, and their backing chains."""
    used: dict[str, str] = {}
    for dom in conn.listAllDomains(0):
        try:
            if dom.name() == but:
                continue
            xmls = [dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)] + ([dom.XMLDesc(0)] if dom.isActive() else [])
        except libvirt.libvirtError:  # vanished meanwhile: it uses nothing any more
            continue
        for xml in xmls:
            for disk in domxml.parse(xml)["disks"]:
                if disk.get("file"):
                    for path in [os.path.realpath(disk["file"]), *images.backing_chain(disk["file"])]:
                        used.setdefault(path, dom.name())
    return used


def _salt_virt_owner(path, images_dir):
    """The salt-virt VM whose directory (with its ownership manifest) holds ``path``, or None."""
    if not images_dir or not validate.is_inside(path, images_dir):
        return None
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(images_dir))
    vm_dir = os.path.join(images_dir, rel.split(os.sep)[0])
    manifest = images.load_manifest(vm_dir) if os.path.isdir(vm_dir) else None
    return manifest["vm"] if manifest else None


def _refusal(path, roots, in_use, owner):
    real = os.path.realpath(path)
    if not any(r and (real == os.path.realpath(r) or validate.is_inside(real, r)) for r in roots):
        shown = ", ".join(r for r in roots if r) or "none"
        return f"outside the directories VMs may use ({shown}): salt-virt never deletes files elsewhere"
    if not os.path.lexists(path):
        return "already gone"
    if os.path.islink(path) or not stat.S_ISREG(os.lstat(path).st_mode):
        return "not a regular file"
    if owner:
        return f"in the directory of salt-virt VM {owner!r}"
    if real in in_use:
        return f"used by VM {in_use[real]!r}"
    return None


def remove(
    conn: Any, name: str, files: Iterable[str], images_dir: str, allowed_paths: Sequence[str] = ()
) -> dict[str, Any]:
    """Delete the disk ``files`` of the (already undefined) foreign VM ``name`` that nothing else uses.
    Returns ``{'removed': [paths], 'kept': {path: reason}}``."""
    roots = [images_dir, *allowed_paths, *pool_dirs(conn)]
    in_use = files_in_use(conn, but=name)
    kept: dict[str, str] = {}
    doomed: dict[str, str] = {}
    for path in dict.fromkeys(files):
        reason = _refusal(path, roots, in_use, _salt_virt_owner(path, images_dir))
        if reason:
            kept[path] = reason
        else:
            doomed[os.path.realpath(path)] = path
    users: dict[str, set[str]] = {}
    for root in roots:
        if root and os.path.isdir(root) and doomed:
            for backing, over in images.backing_users(root).items():
                users.setdefault(backing, set()).update(over)
    removed = images.unlink_unless_backing(doomed, users, kept)
    return {"removed": removed, "kept": kept}
