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
  only from ``default``, new volumes anywhere);
* what a call overwrites or deletes (:func:`changeable`, :func:`pool_unused`): the same use and ownership
  checks, plus no image or volume backing onto it.

The operator's settings come from the minion config only (:func:`saltvirt.base.switches.operator_settings`),
never from a call.
"""

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import switches, validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import query
from saltvirt.host.conn import libvirt
from saltvirt.storage import foreign, images, intake, pools

log = logging.getLogger(__name__)

DEFAULT_ATTACH_POOLS = ("default",)  # libvirt's /var/lib/libvirt/images, as virt:allowed_paths' default
ADOPT_KEY = "virt:adopt_orphan_disks"


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


def check_serials(chardevs: Iterable[Mapping[str, Any]], settings: Mapping[str, Any] | None) -> None:
    """Refuse a TCP serial port or console (``serials``/``consoles`` of ``type: tcp``, from
    :func:`saltvirt.model.checks.chardevs`) outside the operator's ``virt:serial_tcp_ports`` (default:
    none) or listening on an address not in ``virt:serial_tcp_listen`` (default: loopback only): whoever
    reaches the port has the guest's console, and the port is the hypervisor's."""
    ports = (settings or {}).get("serial_tcp_ports")
    listen = (settings or {}).get("serial_tcp_listen", switches.DEFAULT_SERIAL_LISTEN)
    for dev in chardevs or ():
        if dev.get("type") != "tcp":
            continue
        if ports is None:
            raise SaltInvocationError(
                f"serial port tcp:{dev['port']}: TCP serial ports are off on this hypervisor: use type pty "
                "(virt.console), or the operator sets a port range in virt:serial_tcp_ports in the minion config"
            )
        if not ports[0] <= dev["port"] <= ports[1]:
            raise SaltInvocationError(
                f"serial port tcp:{dev['port']} is outside the ports the operator made available for serial "
                f"consoles ({ports[0]}-{ports[1]}): pick one of them, or the operator widens virt:serial_tcp_ports "
                "in the minion config"
            )
        if dev.get("host") not in listen:
            raise SaltInvocationError(
                f"serial port tcp:{dev['port']}: listening on {dev.get('host')} is not allowed "
                f"({', '.join(listen) or 'none'}): leave host out (local only), or the operator lists the address "
                "in virt:serial_tcp_listen in the minion config"
            )


# who uses what ------------------------------------------------------------------------------------
def _other_domains(conn, vm, uuid):
    """``{realpath: VM}`` of every disk file (and its backing file) and ``{(pool, volume): VM}`` of every
    volume disk of the other domains of this host, defined or running."""
    paths: dict[str, str] = {}
    volumes: dict[tuple[str, str], str] = {}
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
            vol = pools.lookup_volume(conn, pool, volume)
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
    """Check every disk of ``disks`` (``saltvirt.model.vmspec.Disk``) that attaches something existing
    (``attach``: a file, or a volume ``pool``/``volume``); the disks are not changed. ``uuid``: the VM's,
    None while ``virt.init`` creates it. Returns ``[{name, path, format}]``: the path (a volume's, from its
    pool) and the format found on it (with ``adopted_from`` when the operator's adoption switch let a gone
    VM's disk through); ``saltvirt.vm.resolve`` puts them into its resolved copy of the spec. Raises
    SaltInvocationError before anything is attached."""
    disks = [d for d in disks if d.attach]
    if not disks:
        return []
    others, other_volumes = _other_domains(conn, vm, uuid)
    backed = images.backing_users(images_dir) if os.path.isdir(images_dir) else {}
    manifests = _manifests(images_dir)
    out = []
    for disk in disks:
        owner, path = None, disk.path
        if disk.pool:
            check_pool(disk.pool, True, settings)
            vol = pools.lookup_volume(conn, disk.pool, disk.volume)
            if vol is None:
                raise SaltInvocationError(
                    f"disk {disk.name}: volume {disk.volume!r} does not exist in pool {disk.pool}"
                )
            path = vol.path()
            user = other_volumes.get((disk.pool, disk.volume))
            if user:
                raise _in_use(disk.name, f"volume {disk.pool}/{disk.volume}", user)
            owner = _volume_owner(manifests, disk.pool, disk.volume, vol.key())
        if not path or not os.path.exists(path):
            raise SaltInvocationError(f"disk {disk.name}: {path} does not exist (give a size to create it)")
        real = os.path.realpath(path)
        if real in others:
            raise _in_use(disk.name, path, others[real])
        if backed.get(real):
            raise SaltInvocationError(
                f"disk {disk.name}: {path} is the backing file of {sorted(backed[real])[0]}: refused (writing "
                "it would change that disk). Attach a copy of it instead"
            )
        if _held_by_host(real):
            raise SaltInvocationError(
                f"disk {disk.name}: {path} is in use by this host (mounted, swap or a volume group): refused"
            )
        owner = owner or _file_owner(images_dir, manifests, real)
        adopted = _check_owner(conn, owner, disk.name, path, vm, uuid, settings)
        trusted = (settings or {}).get("trusted_images") or ()
        fmt = intake.existing_disk(path, disk.format, disk.name, trusted)
        out.append({"name": disk.name, "path": path, "format": fmt})
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


def readable(
    conn: Conn, files: Iterable[tuple[str, str]], *, images_dir: str, settings: Mapping[str, Any] | None = None
) -> None:
    """Host files read into something no VM owns yet: ``[(what, path)]``, e.g. a new volume's
    ``backing_store`` or a file ``virt.volume_upload`` copies into a volume. The ownership door of
    :func:`admit`: not a disk or backing file of a VM of this host, not a file a VM owns (a gone VM's
    only with ``virt:adopt_orphan_disks``), not salt-virt's cache, not a block device the host holds.
    A file the operator lists in ``virt:insecure_trusted_images`` (a base many volumes back onto) passes."""
    files = [(what, str(path)) for what, path in files if path]
    if not files:
        return
    others, _ = _other_domains(conn, None, None)
    manifests = _manifests(images_dir)
    trusted = {os.path.realpath(t) for t in (settings or {}).get("trusted_images") or ()}
    for what, path in files:
        real = os.path.realpath(path)
        if real in trusted:
            continue
        owner = (others[real], None) if real in others else _file_owner(images_dir, manifests, real, read_only=True)
        if owner is not None and _exists(conn, *owner):
            raise SaltInvocationError(
                f"{what}: {path} is a disk of VM {owner[0]!r}: refused (only what no VM owns, or a base the "
                "operator lists in virt:insecure_trusted_images). Use a copy of your own"
            )
        _check_owner(conn, owner, what, path, None, None, settings)  # a gone VM's: the adoption switch
        if os.path.exists(real) and _held_by_host(real):
            raise SaltInvocationError(
                f"{what}: {path} is in use by this host (mounted, swap or a volume group): refused"
            )


# what a call does to an existing volume: (why a used one is refused, what to do instead)
VOLUME_CHANGES = {
    "upload": ("an upload overwrites it", "Upload into a new volume"),
    "delete": ("deleting it destroys what that holds", "Remove that first (virt.purge for a VM), or keep the volume"),
}


def changeable(
    conn: Conn,
    pool: str,
    volume: str,
    vol: Any,
    change: str,
    *,
    images_dir: str,
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Refuse to ``change`` (a key of :data:`VOLUME_CHANGES`: ``virt.volume_upload`` overwrites,
    ``virt.volume_delete`` deletes) the volume ``pool``/``volume`` (``vol``: its libvirt object) when a
    domain of this host uses it (defined or running, salt-virt's or not, as a disk or in a disk's backing
    chain), an image or volume backs onto it, or a VM owns it (its manifest records it; a gone VM's only
    with ``virt:adopt_orphan_disks``)."""
    others, other_volumes = _other_domains(conn, None, None)
    real = os.path.realpath(vol.path())
    user = other_volumes.get((pool, volume)) or others.get(real)
    manifests = _manifests(images_dir)
    owner = _volume_owner(manifests, pool, volume, vol.key())
    if owner is None and os.path.isabs(real):
        owner = _file_owner(images_dir, manifests, real, read_only=True)
    if user is None and owner is not None and _exists(conn, *owner):
        user = owner[0]
    if user is not None:
        raise _volume_used(f"volume {pool}/{volume}", f"a disk of VM {user!r}", change)
    backs = foreign.backing_users(conn, images_dir, (settings or {}).get("allowed_paths") or ())
    over = sorted(u for u in backs.get(real, ()) if u != real)
    if over:
        raise _volume_used(f"volume {pool}/{volume}", f"the backing file of {over[0]}", change)
    _check_owner(conn, owner, f"{pool}/{volume}", vol.path(), None, None, settings)


def pool_unused(
    conn: Conn,
    pool: str,
    root: str | None,
    *,
    volumes: Mapping[str, tuple[str, str]] | None = None,
    images_dir: str,
    settings: Mapping[str, Any] | None = None,
    purge: bool = False,
    host_id: str | None = None,
) -> list[Data]:
    """Refuse to delete the pool ``pool`` (what deleting it removes lies below ``root``: its target
    directory, ``/dev/<volume group>``, ``/dev/zvol/<zpool>``; running or not) while a domain of this host
    uses one of its volumes (by pool name, or a file below ``root`` as a disk or in a backing chain), an
    image or volume outside it backs onto one, or a VM owns one (as :func:`changeable`). ``volumes``: the
    volumes libvirt lists now (a running pool), ``{path: (name, key)}``, wherever they are.

    ``purge`` (the operator purges the running pool: every volume libvirt lists goes): a listed volume a
    manifest records for a VM that no longer exists on this host, and that nothing above uses, is an orphan
    that goes with the pool, whatever ``virt:adopt_orphan_disks`` says (that switch is about giving it to
    another VM); one whose manifest names another hypervisor (``host``, not ``host_id``) as the VM's maker
    is refused (with ``virt:images`` shared, the VM may run there). Returns the orphans,
    ``[{volume, vm, uuid, vm_dir, record}]`` (``record``: the manifest's volume entry, None for a file)."""
    listed = {os.path.realpath(p): nk for p, nk in (volumes or {}).items() if p and os.path.isabs(p)}
    real_root = os.path.realpath(root) if root else None
    entries = set(listed)
    if real_root and os.path.isdir(real_root):  # /dev/<vg>/<lv> are symlinks to /dev/dm-N
        with contextlib.suppress(OSError):
            entries |= {os.path.realpath(os.path.join(real_root, e)) for e in os.listdir(real_root)}

    def inside(path):
        real = os.path.realpath(path)
        return real in entries or bool(real_root and validate.is_inside(real, real_root))

    others, other_volumes = _other_domains(conn, None, None)
    used = [(v, vm) for (p, v), vm in sorted(other_volumes.items()) if p == pool]
    used += [(path, vm) for path, vm in sorted(others.items()) if inside(path)]
    manifests = _manifests(images_dir)
    owned: list[tuple[Any, tuple[str, str | None], str, Data | None]] = [
        (rec.get("volume"), (m["vm"], m.get("uuid")), vm_dir, rec)
        for vm_dir, m in manifests.items()
        for rec in m.get("volumes") or []
        if isinstance(rec, dict) and rec.get("pool") == pool
    ]
    owned += [
        (f, (m["vm"], m.get("uuid")), vm_dir, None) for vm_dir, m in manifests.items() for f in m["files"] if inside(f)
    ]
    used += [(what, owner[0]) for what, owner, _, _ in owned if _exists(conn, *owner)]
    if used:
        raise _volume_used(f"pool {pool}: {used[0][0]}", f"a disk of VM {used[0][1]!r}", "delete")
    backs = foreign.backing_users(conn, images_dir, (settings or {}).get("allowed_paths") or ())
    for backing, over in sorted(backs.items()):
        outside = sorted(u for u in over if not inside(u))
        if inside(backing) and outside:
            raise _volume_used(f"pool {pool}: {backing}", f"the backing file of {outside[0]}", "delete")
    if purge:
        return _orphans(pool, owned, listed, manifests, host_id)
    for what, owner, _, _ in owned:  # a gone VM's: the adoption switch
        _check_owner(conn, owner, f"{pool}/{what}", str(what), None, None, settings)
    return []


def _orphans(pool, owned, listed, manifests, host_id):
    """The volumes libvirt lists (``listed``: {realpath: (name, key)}) that ``owned`` (entries of VMs that no
    longer exist on this host) records; a record whose key is not the volume's any more (replaced since) and
    an entry libvirt does not list (gone already: a purge deletes nothing of it) are none."""
    by_name = {name: key for name, key in listed.values()}
    out = []
    for what, (vm, uuid), vm_dir, rec in owned:
        if rec is not None:
            volume = what if what in by_name and rec.get("key") in (None, by_name[what]) else None
        else:
            volume = (listed.get(os.path.realpath(what)) or (None,))[0]
        if volume is None:
            continue
        creator = manifests[vm_dir].get("host")
        if creator and creator != host_id:
            raise SaltInvocationError(
                f"pool {pool}: {volume} belongs to VM {vm!r}, which hypervisor {creator} made (its manifest in "
                f"{vm_dir}) and may run there: refused (deleting it destroys what that holds). Purge that VM on "
                f"{creator} first (virt.purge), or keep the pool"
            )
        out.append({"volume": volume, "vm": vm, "uuid": uuid, "vm_dir": vm_dir, "record": rec})
    return out


def _volume_used(what, user, change):
    why, todo = VOLUME_CHANGES[change]
    return SaltInvocationError(f"{what} is {user}: refused ({why}). {todo}")


def _in_use(name, what, user):
    return SaltInvocationError(
        f"disk {name}: {what} is a disk of VM {user!r}: refused (a VM is given only its own disks). "
        f"Detach it there and copy it, or give this VM a disk of its own"
    )
