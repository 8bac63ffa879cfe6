"""Desired -> resolved: the spec :func:`saltvirt.model.vmspec.build` returns is what the caller asked for; what
only this hypervisor knows comes from one step here, which returns a resolved copy and never writes into
the spec it is given.

``virt.init`` (:func:`for_init`, before anything is made): the VM's UUID, the operator's TCG cache, the
image it came from, a console password nobody is told, each disk's image as the intake accepted it, the
pool volumes' formats and partition names, what is found on the disks it attaches (path and format:
:func:`saltvirt.storage.attach.admit`), the host devices it is given. ``virt.update`` (:func:`for_update`):
the same for what a call manages, and the console password the VM has when the call gives none. What is
learnt while the disks are made (a volume's path, the minion key seeded) goes into the resolved copy
with :func:`with_disk_paths` and ``dataclasses.replace``.
"""

import dataclasses
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple
from uuid import uuid4

from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import Conn, Data
from saltvirt.host import caps
from saltvirt.model import vmspec
from saltvirt.storage import attach, firmware, volumes


class ForInit(NamedTuple):
    """What :func:`for_init` resolved: the spec, and what it learnt of the disks' sources."""

    spec: vmspec.VMSpec
    src_formats: dict[str, str]  # disk name -> the format of its image, as the intake decided it
    sources: dict[str, str]  # disk name -> its image as given (path, salt://, URL)
    attached: list[Data]  # the existing disks attached, as attach.admit found them


def for_init(
    conn: Conn,
    desired: vmspec.VMSpec,
    *,
    images_dir: str,
    operator: Data | None,
    tb_cache_mib: int | None,
    image_origin: str | None,
    image: str | None,
    fetched: Data | None,
    accept: Callable[[str], Data],
) -> ForInit:
    """The new VM ``desired`` as this host makes it. ``image``: the VM's image as given, ``fetched``: what
    the intake made of it ({path, format}; None without one); ``accept(source)``: the same door for a disk
    entry's own image. ``tb_cache_mib``: :func:`saltvirt.model.vmspec.tb_cache_mib` of the operator's
    setting. Refuses, before anything is made, a pool, existing disk, host file, firmware file or host
    device the operator did not make available, and a new disk file that exists already."""
    src_formats: dict[str, str] = {}
    sources: dict[str, str] = {}
    disks = []
    for disk in desired.disks:
        if fetched is not None and image and disk.image and disk.image == fetched["path"]:
            src_formats[disk.name], sources[disk.name] = fetched["format"], image
        elif disk.image:  # a disk entry with an image of its own: through the same door
            extra = accept(disk.image)
            sources[disk.name], src_formats[disk.name] = disk.image, extra["format"]
            disks.append(dataclasses.replace(disk, image=extra["path"]))
            continue
        disks.append(disk)
    disks = volumes.resolve(conn, disks, operator)  # pool disks: pool allowed and running, format, no name taken
    for disk in disks:
        if not (disk.pool or disk.attach) and disk.path and os.path.lexists(disk.path):
            raise SaltInvocationError(
                f"disk file {disk.path} already exists: refusing to overwrite it. Remove it yourself if it is "
                f"not needed, or choose another VM name"
            )
    attached = attach.admit(conn, disks, vm=desired.name, uuid=None, images_dir=images_dir, settings=operator)
    boot = desired.boot or vmspec.Boot()
    given = [("boot:kernel", boot.kernel), ("boot:initrd", boot.initrd), ("serial_log", desired.serial_log)]
    attach.host_files(conn, given, vm=desired.name, uuid=None, images_dir=images_dir)
    firmware.check(conn, desired.boot, vm=desired.name, uuid=None, images_dir=images_dir, settings=operator)
    attach.check_host_devices(desired.host_devices, operator)  # only what the operator lists in virt:host_devices
    attach.check_serials(desired.serials + desired.consoles, operator)  # TCP ports: virt:serial_tcp_ports only
    spec = dataclasses.replace(
        desired,
        disks=_found(disks, attached),
        graphics=_console_password(desired.graphics),
        tb_cache_mib=tb_cache_mib,  # the operator's, as vtype: never a call's
        uuid=str(uuid4()),  # ours before anything is made: the manifest records it first
        image_origin=image_origin,  # in <metadata>: the VM's image grain (docs/topics/resources.md)
        hostdevs=caps.host_devices(conn, desired.host_devices),  # unknown names refused before anything is made
    )
    return ForInit(spec, src_formats, sources, attached)


def for_update(
    conn: Conn,
    desired: vmspec.VMSpec,
    config: Data,
    manage: Collection[str],
    *,
    uuid: str,
    images_dir: str,
    operator: Data | None,
) -> vmspec.VMSpec:
    """The existing VM ``desired`` (of UUID ``uuid``, whose definition's facts are ``config``) as this host
    has it, for the fields a call ``manage``s: the console password it has when the call gives none, its
    host devices, what is found on the disks it gets; refuses what the operator did not make available."""
    name = desired.name
    changed: dict[str, Any] = {}
    have = config["graphics"][0] if config["graphics"] else None
    gfx = desired.graphics
    if "graphics" in manage and gfx and not gfx.password and have and have.get("passwd"):
        changed["graphics"] = dataclasses.replace(gfx, password=have["passwd"])  # the VM keeps its own
    if "host_devices" in manage:
        attach.check_host_devices(desired.host_devices, operator)
        changed["hostdevs"] = caps.host_devices(conn, desired.host_devices)
    if "serials" in manage or "consoles" in manage:  # TCP ports: virt:serial_tcp_ports only
        attach.check_serials(desired.serials + desired.consoles, operator)
    if "firmware" in manage:  # UEFI files the guest reads: the host's, the operator's, the VM's own
        firmware.check(conn, desired.boot, vm=name, uuid=uuid, images_dir=images_dir, settings=operator)
    if "kernel_boot" in manage and desired.boot:  # host files the guest reads: never another VM's
        files = [("boot:kernel", desired.boot.kernel), ("boot:initrd", desired.boot.initrd)]
        attach.host_files(conn, files, vm=name, uuid=uuid, images_dir=images_dir)
    if "disks" in manage:  # the disks it adds: through the one door, also for test=True
        have_targets = {d["target"] for d in config["disks"]}
        new = [d for d in desired.disks if d.target not in have_targets]
        for d in new:
            if d.pool:
                attach.check_pool(d.pool, d.attach, operator)
        attached = attach.admit(conn, new, vm=name, uuid=uuid, images_dir=images_dir, settings=operator)
        changed["disks"] = _found(desired.disks, attached)
    return dataclasses.replace(desired, **changed)


def pool_volumes(conn: Conn, spec: vmspec.VMSpec, targets: Collection[str], operator: Data | None) -> vmspec.VMSpec:
    """``spec`` with the pool disks among ``targets`` resolved against their pools
    (:func:`saltvirt.storage.volumes.resolve`: pool allowed and running, format, no volume taken over)."""
    mine = [d for d in spec.disks if d.pool and d.target in targets]
    done = {d.name: d for d in volumes.resolve(conn, mine, operator)}
    return dataclasses.replace(spec, disks=[done.get(d.name, d) if d in mine else d for d in spec.disks])


def with_disk_paths(spec: vmspec.VMSpec, paths: Mapping[str, str]) -> vmspec.VMSpec:
    """``spec`` with the disks named in ``paths`` at those paths (a volume made, a staging file seeded)."""
    return dataclasses.replace(
        spec, disks=[dataclasses.replace(d, path=paths[d.name]) if d.name in paths else d for d in spec.disks]
    )


def _found(disks, attached):
    """``disks`` with the path and format :func:`saltvirt.storage.attach.admit` found on the attached ones."""
    found = {a["name"]: a for a in attached}
    return [
        dataclasses.replace(d, path=found[d.name]["path"], format=found[d.name]["format"]) if d.name in found else d
        for d in disks
    ]


def _console_password(gfx: Any) -> Any:
    """A console without a password is open to whoever reaches its socket: a generated one. It stays in the
    domain XML (virsh dumpxml --security-info NAME on the hypervisor), never in a job return."""
    if gfx and not gfx.password:
        return dataclasses.replace(gfx, password=vmspec.console_password())
    return gfx
