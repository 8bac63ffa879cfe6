"""The disk files of a VM salt-virt did not create (``virt.define_xml_*``, virt-install, an older Salt):
what ``virt.purge`` may delete, as Salt's purge deletes a VM's disks, and what it must keep.

A file goes only when all of these hold: it lies inside the roots the operator gave VMs (``virt:images``,
``virt:allowed_paths``, the target directories of this host's directory pools), it is a regular file
(no symlink, no device), it is not in another salt-virt VM's directory, no other domain on this host
uses it (as a disk or anywhere in a disk's backing chain) and no image under the roots backs onto it
(unless that image goes too). Everything else is kept, with the reason.

Its pool volumes (``<disk type='volume'>``) go the same way, through libvirt: unless another domain names
the same pool volume or uses its file (as a disk or in a backing chain), or an image under the roots backs
onto it. Removable media (CD-ROMs) are never candidates.
"""

import os
import stat
from collections.abc import Iterable, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.host import query
from saltvirt.host.conn import libvirt
from saltvirt.storage import images, pools
from saltvirt.xml import etree, poolxml

DIR_POOL_TYPES = ("dir", "fs", "netfs")  # pools whose volumes are files in their target directory
# what a purge says when it cannot tell what other domains use (it deletes nothing more then)
UNREAD = ": nothing more was deleted (purge again once libvirt can read it)"


def pool_dirs(conn: Any) -> list[str]:
    """Target directories of this host's running directory-like pools."""
    out = []
    for pool in conn.listAllStoragePools(0):
        try:
            if not pool.isActive():
                continue
            root = etree.read(pool.XMLDesc(0))
        except libvirt.libvirtError:  # gone meanwhile
            continue
        path = root.findtext("target/path")
        if root.get("type") in DIR_POOL_TYPES and path and os.path.isabs(path):
            out.append(path)
    return out


def _volume_path(conn, pool, volume):
    """The path of a pool volume (None when the pool is not running or the volume is gone)."""
    try:
        vol = pools.lookup_volume(conn, pool, volume)
        return vol.path() if vol is not None else None
    except (CommandExecutionError, SaltInvocationError, libvirt.libvirtError):
        return None


def files_in_use(conn: Any, but: str | None = None) -> dict[str, str]:
    """{realpath: VM name} of every file a domain on this host (other than ``but``) uses: its disks (a pool
    volume's by its path), in its definition and while running, and their backing chains."""
    used: dict[str, str] = {}
    for vm, disk in query.domain_disks(conn, but, unread=UNREAD):
        path = _volume_path(conn, disk["pool"], disk["volume"]) if disk.get("pool") else disk.get("file")
        if path and os.path.isabs(path):
            for real in [os.path.realpath(path), *images.backing_chain(path)]:
                used.setdefault(real, vm)
    return used


def volumes_in_use(conn: Any, but: str | None = None) -> dict[tuple[str, str], str]:
    """{(pool, volume): VM name} of every pool volume a domain on this host (other than ``but``) names."""
    used: dict[tuple[str, str], str] = {}
    for vm, disk in query.domain_disks(conn, but, unread=UNREAD):
        if disk.get("pool") and disk.get("volume"):
            used.setdefault((disk["pool"], disk["volume"]), vm)
    return used


def backing_users(conn: Any, images_dir: str, allowed_paths: Sequence[str] = ()) -> dict[str, list[str]]:
    """``{backing file (realpath): [images and volumes that back onto it]}``: every qcow2 file below
    ``images_dir``, ``allowed_paths`` and the running directory pools (the whole chain, from the headers),
    and every volume of a running pool whose backing store libvirt reports (an overlay on a logical
    volume, a zvol)."""
    users: dict[str, list[str]] = {}
    for root in dict.fromkeys([images_dir, *allowed_paths, *pool_dirs(conn)]):
        if root and os.path.isdir(root):
            for backing, over in images.backing_users(root).items():
                users.setdefault(backing, []).extend(over)
    for pool in conn.listAllStoragePools(0):
        try:
            vols = pool.listAllVolumes(0) if pool.isActive() else []
            facts = [poolxml.parse_volume(vol.XMLDesc(0)) for vol in vols]
        except libvirt.libvirtError:  # stopped or gone meanwhile: nothing of it is read
            continue
        for fact in facts:
            base = (fact["backing_store"] or {}).get("path")
            if base and fact["path"]:
                over = users.setdefault(os.path.realpath(base), [])
                if os.path.realpath(fact["path"]) not in over:
                    over.append(os.path.realpath(fact["path"]))
    return users


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


def _volume_refusal(conn, ref, in_use, used_refs, users, images_dir):
    """Why the pool volume ``ref`` ({pool, volume}) must stay, or None."""
    key = (ref["pool"], ref["volume"])
    if key in used_refs:
        return f"used by VM {used_refs[key]!r}"
    try:
        vol = pools.lookup_volume(conn, *key)
    except (CommandExecutionError, SaltInvocationError) as exc:
        return str(exc)
    if vol is None:
        return "already gone"
    path = vol.path()
    real = os.path.realpath(path) if os.path.isabs(path) else path
    if real in in_use:
        return f"used by VM {in_use[real]!r}"
    over = sorted(u for u in users.get(real, ()) if os.path.exists(u))
    if over:
        return f"backing file of {over[0]}: delete that image first"
    owner = _salt_virt_owner(path, images_dir) if os.path.isabs(path) else None
    if owner:
        return f"in the directory of salt-virt VM {owner!r}"
    return None


def remove_volumes(
    conn: Any, name: str, refs: Iterable[dict[str, str]], images_dir: str, allowed_paths: Sequence[str] = ()
) -> dict[str, Any]:
    """Delete the pool volumes ``refs`` ({pool, volume}: the disks of the already undefined foreign VM
    ``name``) that nothing else uses, as Salt's purge deletes a VM's volumes. Returns
    ``{'removed': ['pool/volume'], 'kept': {'pool/volume': reason}}``."""
    refs = list({(r["pool"], r["volume"]): r for r in refs}.values())
    removed: list[str] = []
    kept: dict[str, str] = {}
    if not refs:
        return {"removed": removed, "kept": kept}
    in_use, used_refs = files_in_use(conn, but=name), volumes_in_use(conn, but=name)
    users = backing_users(conn, images_dir, allowed_paths)
    for ref in refs:
        label = f"{ref['pool']}/{ref['volume']}"
        reason = _volume_refusal(conn, ref, in_use, used_refs, users, images_dir)
        if reason:
            kept[label] = reason
            continue
        try:
            pools.delete_volume(conn, ref["pool"], ref["volume"])
            removed.append(label)
        except CommandExecutionError as exc:
            kept[label] = str(exc)
    return {"removed": removed, "kept": kept}
