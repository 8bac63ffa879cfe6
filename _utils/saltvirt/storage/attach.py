"""The one door for every existing disk a VM is given (``virt.init``, ``virt.update``, the states): files
attached by path (Salt's ``disks=[{name, source_file | path, format}]``) and existing pool volumes
(``{name, pool, source_file}``). A caller may give a VM what the operator made available, nothing more:

* format (:func:`saltvirt.storage.intake.existing_disk`): raw, or a qcow2 with nothing outside itself;
  a declared format must be what is on disk, and an existing disk is never assumed to be qcow2;
* use: a disk another VM of this host uses (defined or running, with its backing chain), a file an image
  below ``virt:images`` backs onto, and a block device the host itself holds (mounted, swap, a volume
  group's PV) are refused;
* ownership: a file inside ``virt:images`` belongs to the VM whose directory it is in (its ownership
  manifest, ``storage.images``), a volume to the VM whose manifest recorded it; another VM's disk is
  refused, and so is one of a VM that is gone unless the operator set ``virt:adopt_orphan_disks: True``;
  salt-virt's own directories (``.bases``, ``.cache``, ``.locks``) and images directly in ``virt:images``
  are never a VM's disk;
* pools (:func:`check_pool`): only those the operator lists in ``virt:pools`` (default: existing volumes
  only from ``default``, new volumes anywhere).

The operator's settings come from the minion config only (:func:`operator_settings`), never from a call.
"""

from collections.abc import Iterable, Mapping
from typing import Any
import contextlib
import errno
import logging
import os
import stat

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import query
from saltvirt.host.conn import libvirt
from saltvirt.storage import images, intake, pools as storage

log = logging.getLogger(__name__)

DEFAULT_ATTACH_POOLS = ("default",)  # libvirt's /var/lib/libvirt/images, as virt:allowed_paths' default
ADOPT_KEY = "virt:adopt_orphan_disks"


def operator_settings(opts: Any) -> Data:
    """The operator's disk and device switches from the minion config ``opts`` (never a call, pillar or
    grains): ``adopt_orphan_disks`` (bool), ``pools`` (tuple of pool names, or None when not set),
    ``host_devices`` (tuple of node device names a VM may be given; none by default) and
    ``trusted_images`` (``virt:insecure_trusted_images``: bases an attached overlay may back onto)."""
    conf = ({} if opts is None else opts).get("virt") or {}
    names = validate.config_names
    pools = conf.get("pools")
    return {
        "adopt_orphan_disks": validate.to_bool(conf.get("adopt_orphan_disks", False)),
        "pools": None if pools is None else names(pools, "virt:pools"),
        "host_devices": names(conf.get("host_devices") or [], "virt:host_devices"),
        "trusted_images": names(conf.get("insecure_trusted_images") or [], "virt:insecure_trusted_images"),
    }


def check_pool(pool: str, attach: bool, settings: Mapping[str, Any] | None) -> None:
    """Refuse a pool the operator has not made available: ``virt:pools`` lists them; unset, a new volume
    may go to any pool and an existing one is attached only from ``default``."""
    allowed = (settings or {}).get("pools")
    if allowed is None:
        if not attach or pool in DEFAULT_ATTACH_POOLS:
            return
        allowed = DEFAULT_ATTACH_POOLS
    if pool not in allowed:
        what = "attach its existing volumes" if attach else "put VM disks on it"
        raise SaltInvocationError(
            f"pool {pool!r} is not one the operator made available to VMs ({', '.join(allowed) or 'none'}): "
            f"to {what}, the operator adds it to virt:pools in the minion config"
        )


def check_host_devices(names: Iterable[str], settings: Mapping[str, Any] | None) -> None:
    """Refuse a host device the operator has not listed in ``virt:host_devices`` (default: none)."""
    allowed = (settings or {}).get("host_devices") or ()
    for name in names or ():
        if name not in allowed:
            raise SaltInvocationError(
                f"host_devices: {name!r} is not one the operator made available to VMs "
                f"({', '.join(allowed) or 'none'}): the operator lists it in virt:host_devices in the minion config"
            )


# who uses what ------------------------------------------------------------------------------------
def _other_domains(conn, vm, uuid):
    """``{realpath: VM}`` of every disk file (and its backing file) and ``{(pool, volume): VM}`` of every
    volume disk of the other domains of this host, defined or running."""
    paths, volumes = {}, {}
    for name, disk in query.domain_disks(conn, vm, uuid, unread=": nothing was attached"):
        if disk.get("type") == "volume" and disk.get("pool"):
            volumes.setdefault((disk["pool"], disk["volume"]), name)
            continue
        for path in (disk.get("file"), disk.get("backing_file")):
            if path and os.path.isabs(path):
                paths.setdefault(os.path.realpath(path), name)
                for below in images.backing_chain(path):
                    paths.setdefault(below, name)
    for (pool, volume), name in volumes.items():
        with contextlib.suppress(CommandExecutionError, libvirt.libvirtError):
            vol = storage.lookup_volume(conn, pool, volume)
            if vol is not None:
                paths.setdefault(os.path.realpath(vol.path()), name)
    return paths, volumes


def _manifests(images_dir):
    """``{VM directory: manifest}`` of every VM directory below ``images_dir``."""
    out = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(images_dir):
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                manifest = images.load_manifest(entry.path)
                if manifest is not None:
                    out[entry.path] = manifest
    return out


def _volume_owner(manifests, pool, volume, key):
    for manifest in manifests.values():
        for rec in manifest.get("volumes") or []:
            same = isinstance(rec, dict) and (rec.get("pool"), rec.get("volume")) == (pool, volume)
            if same and rec.get("key") in (None, key):  # another key: replaced since, not that VM's any more
                return manifest["vm"], manifest.get("uuid")
    return None


def _file_owner(images_dir, manifests, real, read_only=False):
    """(VM, its uuid or None) a file belongs to by the manifests or, inside ``virt:images``, by the VM
    directory it is in; None when no VM owns it. Refuses what is salt-virt's (its caches hold other
    callers' downloads) or, unless ``read_only`` (a kernel the operator put there), the operator's."""
    for manifest in manifests.values():
        if real in {os.path.realpath(f) for f in manifest["files"]}:
            return manifest["vm"], manifest.get("uuid")
    root = os.path.realpath(images_dir)
    if not validate.is_inside(real, root):
        return None
    top, _, rest = os.path.relpath(real, root).partition(os.sep)
    if read_only and not rest and not top.startswith("."):
        return None
    if top.startswith(".") or not rest:
        what = "salt-virt's own image cache" if top.startswith(".") else "an image of the operator's"
        raise SaltInvocationError(
            f"{real} is {what} in virt:images, not a VM's disk: refused. Attach a disk of this VM, or one "
            "from a directory of virt:allowed_paths"
        )
    manifest = manifests.get(os.path.join(root, top))
    return (manifest["vm"], manifest.get("uuid")) if manifest else (top, None)


def _exists(conn, name, uuid):
    try:
        if uuid:
            conn.lookupByUUIDString(uuid)
        else:
            conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return False
        raise CommandExecutionError(f"cannot look up VM {name}: {exc.get_error_message()}") from None
    return True


def _check_owner(conn, owner, disk_name, path, vm, uuid, settings):
    """None when the disk is this VM's (or no VM's); the VM it is adopted from; else a refusal."""
    if owner is None:
        return None
    name, owner_uuid = owner
    if name == vm and (owner_uuid is None or owner_uuid == uuid):
        return None
    if name != vm and _exists(conn, name, owner_uuid):
        raise _in_use(disk_name, path, name)
    if not (settings or {}).get("adopt_orphan_disks"):
        raise SaltInvocationError(
            f"disk {disk_name}: {path} belongs to VM {name!r}, which no longer exists on this host: refused. "
            f"Its disks go to another VM only if the operator sets {ADOPT_KEY}: True in the minion config"
        )
    log.warning("disk %s of VM %s: adopting %s of the gone VM %s (%s)", disk_name, vm, path, name, ADOPT_KEY)
    return name


def _held_by_host(path):
    """True when ``path`` is a block device the host itself holds open exclusively (mounted, swap, a
    PV or dm table): O_EXCL on a block device fails with EBUSY then."""
    if not stat.S_ISBLK(os.stat(path).st_mode):
        return False
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_EXCL))
    except OSError as exc:
        return exc.errno == errno.EBUSY
    return False


# the door -----------------------------------------------------------------------------------------
def admit(
    conn: Conn,
    disks: Iterable[Any],
    *,
    vm: str,
    uuid: str | None,
    images_dir: str,
    settings: Mapping[str, Any] | None = None,
) -> list[Data]:
    """Check every disk of ``disks`` (``saltvirt.spec.vmspec.Disk``) that attaches something existing
    (``attach``: a file, or a volume ``pool``/``volume``) and set its ``format`` (and a volume's ``path``).
    ``uuid``: the VM's, None while ``virt.init`` creates it. Returns ``[{name, path, format}]`` (with
    ``adopted_from`` when the operator's adoption switch let a gone VM's disk through). Raises
    SaltInvocationError before anything is attached."""
    disks = [d for d in disks if d.attach]
    if not disks:
        return []
    others, other_volumes = _other_domains(conn, vm, uuid)
    backed = images.backing_users(images_dir) if os.path.isdir(images_dir) else {}
    manifests = _manifests(images_dir)
    out = []
    for disk in disks:
        owner = None
        if disk.pool:
            check_pool(disk.pool, True, settings)
            vol = storage.lookup_volume(conn, disk.pool, disk.volume)
            if vol is None:
                raise SaltInvocationError(
                    f"disk {disk.name}: volume {disk.volume!r} does not exist in pool {disk.pool}"
                )
            disk.path = vol.path()
            user = other_volumes.get((disk.pool, disk.volume))
            if user:
                raise _in_use(disk.name, f"volume {disk.pool}/{disk.volume}", user)
            owner = _volume_owner(manifests, disk.pool, disk.volume, vol.key())
        if not disk.path or not os.path.exists(disk.path):
            raise SaltInvocationError(f"disk {disk.name}: {disk.path} does not exist (give a size to create it)")
        real = os.path.realpath(disk.path)
        if real in others:
            raise _in_use(disk.name, disk.path, others[real])
        if backed.get(real):
            raise SaltInvocationError(
                f"disk {disk.name}: {disk.path} is the backing file of {sorted(backed[real])[0]}: refused (writing "
                "it would change that disk). Attach a copy of it instead"
            )
        if _held_by_host(real):
            raise SaltInvocationError(
                f"disk {disk.name}: {disk.path} is in use by this host (mounted, swap or a volume group): refused"
            )
        owner = owner or _file_owner(images_dir, manifests, real)
        adopted = _check_owner(conn, owner, disk.name, disk.path, vm, uuid, settings)
        trusted = (settings or {}).get("trusted_images") or ()
        disk.format = intake.existing_disk(disk.path, disk.format, disk.name, trusted)
        out.append({"name": disk.name, "path": disk.path, "format": disk.format})
        if adopted:
            out[-1]["adopted_from"] = adopted
    return out


def host_files(
    conn: Conn,
    files: Iterable[tuple[str, str | None]],
    *,
    vm: str,
    uuid: str | None,
    images_dir: str,
) -> None:
    """The host files a VM is given that are not disks: ``[(what, path)]``, e.g. ``boot:kernel``,
    ``boot:initrd`` (read into the guest's memory) and ``serial_log`` (qemu appends the guest's console to
    it, virtlogd rotates it). None of them may be a disk or backing file of another VM of this host, a
    file another VM owns (gone or not: no adoption here), salt-virt's cache or a base images back onto;
    a serial log is also never an existing disk of this VM. Paths that do not exist yet pass."""
    existing = [(what, str(path)) for what, path in files if path and os.path.lexists(path)]
    if not existing:
        return
    others, _ = _other_domains(conn, vm, uuid)
    backed = images.backing_users(images_dir) if os.path.isdir(images_dir) else {}
    manifests = _manifests(images_dir)
    listed = {os.path.realpath(f) for manifest in manifests.values() for f in manifest["files"]}
    for what, path in existing:
        real = os.path.realpath(path)
        owner = others.get(real)
        if owner is None:
            found = _file_owner(images_dir, manifests, real, read_only=what != "serial_log")
            owner = found[0] if found and found[0] != vm else None
        if owner is not None:
            raise SaltInvocationError(
                f"{what}: {path} is a file of VM {owner!r}: refused (a VM is given only its own files and the "
                "operator's). Use a file of its own"
            )
        if backed.get(real):
            raise SaltInvocationError(
                f"{what}: {path} is the backing file of {sorted(backed[real])[0]}: refused. Use a file of its own"
            )
        if what == "serial_log" and (real in listed or intake.sniff(real) != "raw"):
            raise SaltInvocationError(f"serial_log: {path} is a VM's disk or an image: refused. Log to a new file")


def _in_use(name, what, user):
    return SaltInvocationError(
        f"disk {name}: {what} is a disk of VM {user!r}: refused (a VM is given only its own disks). "
        f"Detach it there and copy it, or give this VM a disk of its own"
    )
