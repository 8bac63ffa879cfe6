"""VM disks on storage pool volumes (``disks=[{name, pool, size, format, image | source_file}]``): resolving
them against the pool, creating the volume (blank, or the image written into it: the image comes through
the same intake as file disks, ``images.fetch``), and the VM's ownership of the volumes it created, kept
in the VM's manifest (``<images>/<vm>/.salt-virt.json``, key ``volumes``) so purge deletes only those."""

import contextlib
import dataclasses
import os
import re
import subprocess
from collections.abc import Iterable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import lv_errors
from saltvirt.storage import attach, images, pools
from saltvirt.xml import poolxml

# pool types whose volumes are files: they take qcow2 (the default) or raw; the others hold raw data
FILE_POOLS = ("dir", "fs", "netfs", "gluster")


def _pool_type(pool_obj):
    return poolxml.parse_pool(pool_obj.XMLDesc(0))["type"]


def _next_partition(pool_obj):
    """A disk pool's volumes are partitions, named after the device: the first free number."""
    device = os.path.basename(poolxml.parse_pool(pool_obj.XMLDesc(0))["source"]["devices"][0]["path"])
    used = {int(m.group(1)) for v in pool_obj.listVolumes() if (m := re.search(r"(\d+)$", v))}
    sep = "p" if device[-1].isdigit() else ""
    return f"{device}{sep}{min(i for i in range(1, len(used) + 2) if i not in used)}"


def resolve(conn: Conn, disks: Iterable[Any], settings: Any = None) -> list[Any]:
    """Check the pool disks of a spec against their pools; returns the disks with what depends on the pool
    filled in (copies: ``disks`` are not changed): the format (qcow2 on file pools, raw elsewhere, unless
    given), a disk pool's partition name, an attached volume's path. An existing volume is refused unless the
    disk names it with ``source_file`` (then it is attached, and its format is what
    :func:`saltvirt.storage.attach.admit` finds on it). ``settings``: the operator's
    (:func:`saltvirt.base.switches.operator_settings`): only the pools of ``virt:pools``."""
    out = []
    for disk in disks:
        out.append(_resolved(conn, disk, settings) if disk.pool else disk)
    return out


def _resolved(conn, disk, settings):
    attach.check_pool(disk.pool, disk.attach, settings)
    pool_obj = pools.running_pool(conn, disk.pool)
    ptype = _pool_type(pool_obj)
    with lv_errors(f"refresh pool {disk.pool!r}"):
        pool_obj.refresh(0)
    if disk.attach:
        vol = pools.lookup_volume(conn, disk.pool, disk.volume)
        if vol is None:
            raise SaltInvocationError(f"disk {disk.name}: volume {disk.volume!r} does not exist in pool {disk.pool}")
        return dataclasses.replace(disk, path=vol.path())  # never libvirt's probed format: attach.admit reads it
    volume = _next_partition(pool_obj) if ptype == "disk" else disk.volume
    fmt = disk.format
    if fmt is None:
        fmt = "qcow2" if ptype in FILE_POOLS else "raw"
    elif fmt != "raw" and ptype not in FILE_POOLS:
        raise SaltInvocationError(f"disk {disk.name}: a {ptype} pool holds raw volumes, not {fmt}")
    if pools.lookup_volume(conn, disk.pool, volume) is not None:
        raise SaltInvocationError(
            f"disk {disk.name}: volume {volume!r} already exists in pool {disk.pool}: refusing to take it "
            f"over. Delete it (virt.volume_delete {disk.pool} {volume}) or attach it with "
            f"source_file: {volume}"
        )
    return dataclasses.replace(disk, volume=volume, format=fmt)


def create(
    conn: Conn, disk: Any, image: str | None = None, src_fmt: str | None = None, stage_dir: str | None = None
) -> Data:
    """Create ``disk``'s volume (``image``: a local file from images.fetch, written into it). Returns
    {name, pool, volume, path, format, key, size} (``disk`` is not changed). ``src_fmt``: the image's format
    as the intake decided it (never guessed again). ``stage_dir``: the disk is
    seeded next; when the volume is not a regular file (LV, partition) the image is copied to a staging
    file there instead (``staged`` in the return: the file to seed) and written by :func:`finish_staged`."""
    size = disk.size or 0
    if image:
        info = images.image_info(image, src_fmt)  # src_fmt: as the image intake decided it
        size = max(size, -(-info["virtual_size"] // 1048576))
    if not size:
        raise SaltInvocationError(f"disk {disk.name} needs a size (MiB) or an image")
    file_pool = _pool_type(pools.running_pool(conn, disk.pool)) in FILE_POOLS
    # only file pools take an image format; a partition, LV, rbd image ... is raw data with its own types
    spec = poolxml.volume_spec(disk.volume, size, format=disk.format if file_pool else None)
    vol: Any = pools.define_volume(conn, disk.pool, spec) and pools.get_volume(conn, disk.pool, disk.volume)
    try:
        made = {
            "name": disk.name,
            "pool": disk.pool,
            "volume": disk.volume,
            "path": vol.path(),
            "format": disk.format,
            "key": vol.key(),
            "size": size,
        }
        if image and stage_dir and not os.path.isfile(made["path"]):
            made["staged"] = os.path.join(stage_dir, f".{disk.name}.staged.{disk.format}")
            images.clone(image, made["staged"], fmt=disk.format, src_fmt=info["format"])
        elif image:
            _write_image(image, info["format"], made["path"], disk.format)
    except BaseException:
        with contextlib.suppress(Exception):
            pools.delete_volume(conn, disk.pool, disk.volume)
        raise
    return made


def finish_staged(made: Data, fmt: str) -> None:
    """Write the seeded staging file (of format ``fmt``) into its volume and remove it."""
    try:
        _write_image(made["staged"], fmt, made["path"], fmt)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(made.pop("staged"))


def _write_image(src, src_fmt, dst, fmt):
    """Copy the image into the new volume (a file or block device the pool made): qemu-img convert -n
    writes into the existing target, so the pool's file, LV or partition stays what the pool made."""
    if not os.path.exists(dst):
        raise CommandExecutionError(f"volume path {dst} is not reachable from this host: cannot write the image")
    cmd = ["qemu-img", "convert", "-n", "-f", src_fmt, "-O", fmt, src, dst]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode:
        raise CommandExecutionError(f"writing {src} into volume {dst} failed: {proc.stderr.strip()}")


def delete(conn: Conn, made: Data) -> None:
    """Undo of create (init failed later)."""
    if made.get("staged"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(made["staged"])
    vol = pools.lookup_volume(conn, made["pool"], made["volume"])
    if vol is not None and vol.key() == made["key"]:
        pools.delete_volume(conn, made["pool"], made["volume"])


# ownership ----------------------------------------------------------------------------------------
def record(vm_dir: str, vm_name: str, made: Data, vm_uuid: str | None = None) -> Data:
    """Add volumes this VM created to its manifest (next to the files it owns)."""
    return images.record_owned_extra(
        vm_dir, vm_name, "volumes", [{k: made[k] for k in ("pool", "volume", "key")}], vm_uuid
    )


def remove_owned(conn: Conn, vm_dir: str, vm_name: str, vm_uuid: str | None, used: Iterable[Data]) -> Data:
    """Delete the volumes among ``used`` ({pool, volume} the VM's disks name) that the manifest says this VM
    created and whose key is unchanged. Returns {'removed': ['pool/volume'], 'kept': {'pool/volume': why}}."""
    owned = images.owned_extra(vm_dir, vm_name, "volumes", vm_uuid)
    removed, kept, gone = [], {}, []
    for ref in used:
        label = f"{ref['pool']}/{ref['volume']}"
        mine = next((o for o in owned if (o["pool"], o["volume"]) == (ref["pool"], ref["volume"])), None)
        if mine is None:
            kept[label] = "not created by salt-virt for this VM (not in its manifest)"
            continue
        try:
            vol = pools.lookup_volume(conn, ref["pool"], ref["volume"])
        except CommandExecutionError as exc:
            kept[label] = str(exc)
            continue
        if vol is None:
            kept[label] = "already gone"
            gone.append(mine)
        elif vol.key() != mine["key"]:
            kept[label] = f"its key is now {vol.key()}, not the {mine['key']} this VM created: someone replaced it"
        else:
            try:
                pools.delete_volume(conn, ref["pool"], ref["volume"])
                removed.append(label)
                gone.append(mine)
            except CommandExecutionError as exc:
                kept[label] = str(exc)
    if gone:
        images.forget_extra(vm_dir, vm_name, "volumes", gone, vm_uuid)
    return {"removed": removed, "kept": kept}


def disk_refs(facts: Data) -> list[Data]:
    """{pool, volume} of the volume disks in definition.parse facts."""
    return [
        {"pool": d["pool"], "volume": d["volume"]}
        for d in facts["disks"]
        if d.get("type") == "volume" and d.get("pool") and d["device"] == "disk"
    ]
