"""The one description of a VM's desired shape, shared by ``virt.init`` and the ``virt.running`` /
``virt.defined`` states: built from arguments + config profiles, rendered by :mod:`saltvirt.xml.domain.definition`,
and compared with what libvirt has by :func:`diff`.

Config (minion config only: grains and pillar are written by callers)::

    virt:
      images: /srv/salt-images          # one directory per VM below it
      nic:
        default:                        # profile name; list form or the classic dict form
          - {name: eth0, type: bridge, source: br0, model: virtio}
        isolated:
          eth0: {network: isolated}
      disk:
        default:
          - system: {format: qcow2}
        big:
          - system: {size: 20480}
          - data: {size: 102400, format: raw}
"""

import copy
import os
import re
import secrets
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.model import checks, cpumem, vmargs

DEFAULT_IMAGES_DIR = "/srv/salt-images"
DISK_FORMATS = ("qcow2", "raw")  # the only disk formats a VM may get (storage.images checks what is on disk)
SERIAL_LOG_DIR = "/var/log/libvirt/qemu"
DEFAULT_NICS = [{"name": "eth0", "type": "bridge", "source": "br0", "model": "virtio"}]
DEFAULT_DISKS = [{"name": "system"}]  # from the image; without an image: a blank disk of this size
DEFAULT_BLANK_DISK_MIB = 8192
# QEMU >= 5.0 gives each TCG VM a translation cache of up to 1 GiB of host memory beyond its RAM: 20 small
# VMs then need ~20 GiB more than placement counts. 128 MiB holds a Linux guest's boot and a salt-minion
# (bench/RESULTS.md, R7); virt:tcg_tb_cache_mib: 0 keeps QEMU's default
DEFAULT_TCG_TB_CACHE_MIB = 128
NIC_TYPES = ("bridge", "network", "direct")
FIRMWARE_DIRS = ("/usr/share/OVMF", "/usr/share/qemu")  # the distribution's UEFI firmware (boot:loader/nvram)
DISK_BUSES = {"virtio": "vd", "scsi": "sd", "sata": "sd", "ide": "hd"}
# the NoCloud seed volume (cloud_init=...): a read-only CD-ROM on SATA (libvirt adds the AHCI controller on
# i440fx and q35 alike; IDE does not exist on q35), present in the definition until the first start
CIDATA_DISK = {"name": "cidata", "file": "cidata.iso", "bus": "sata"}


@dataclass
class Disk:
    name: str
    size: int | None = None  # MiB; None = the image's size
    format: str | None = None  # qcow2|raw; None = the image's format (attached: what is on disk, storage.attach)
    path: str | None = None  # file on the hypervisor
    image: str | None = None  # source image to clone into ``path``
    overlay: bool = False  # qcow2 overlay on the cached image instead of a full copy
    bus: str = "virtio"
    device: str = "disk"  # disk|cdrom
    target: str | None = None  # vda, vdb, ...
    attach: bool = False  # an existing file named by ``path``: attached, never created nor deleted
    pool: str | None = None  # a libvirt storage pool: the disk is its volume ``volume`` (type='volume')
    volume: str | None = None  # <vm>_<disk> by default; ``source_file`` names an existing one (attached)


@dataclass
class Nic:
    name: str
    type: str = "bridge"
    source: str = "br0"
    model: str = "virtio"
    mac: str | None = None


def console_password() -> str:
    """A random VNC password nobody is told: 8 characters (48 bits), all QEMU's VNC authentication (DES) reads.
    One generator for a new VM's console (``virt.init``), a websocket console built without one
    (:func:`saltvirt.xml.domain.definition.build`) and the web console's one-time tickets
    (``saltvirt.host.vncticket``)."""
    return secrets.token_urlsafe(6)


@dataclass
class Graphics:
    type: str = "vnc"
    listen: str = "127.0.0.1"
    port: int = -1  # -1 = autoport
    password: str | None = None
    # QEMU's VNC over websocket (the web console's noVNC, docs/topics/console.md): -1 = a free port; None: none
    websocket: int | None = None


@dataclass
class Boot:
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None
    efi: bool = False  # UEFI firmware: libvirt picks the distribution's OVMF (<os firmware='efi'>) unless loader
    loader: str | None = None  # path of the OVMF code (pflash)
    nvram: str | None = None  # template of the UEFI variables (the VM's own copy is libvirt's)
    secure_boot: bool = False  # OVMF with secure boot (machine q35 and SMM)


@dataclass
class VMSpec:
    name: str
    cpu: int
    mem: int  # MiB
    vtype: str = "qemu"
    arch: str = "x86_64"
    disks: list = field(default_factory=list)
    nics: list = field(default_factory=list)
    graphics: Graphics | None = None
    boot: Boot | None = None
    serial_log: str | None = None
    vm_dir: str | None = None
    # chosen by virt.init before it makes anything, so the ownership manifest names the VM by it from the
    # start (a cleanup judges leftovers by UUID); None: libvirt makes one
    uuid: str | None = None
    group: str | None = None  # anti-affinity group, kept in the domain's <metadata>
    # the minion key seeded into the guest ({minion_id, fingerprint}), kept in the domain's <metadata>:
    # salt-run virt.purge deletes a master key only when it is this very key
    minion_key: dict | None = None
    # the tenant the VM belongs to and the Salt user who created it ({tenant, creator}), in <metadata>:
    # written by salt-run virt.init from the job's authenticated user (saltvirt.fleet.callers)
    owner: dict | None = None
    # the image it was created from, kept in <metadata> (the ``image`` grain): :func:`image_origin`
    image_origin: str | None = None
    # automatic HA restarts it elsewhere when its host is lost (saltvirt.fleet.ha), kept in <metadata>
    ha: bool = False
    # cloud_init= as saltvirt.model.checks.cloud_init checked it ({} for True), None: no cidata volume
    cloud_init: dict | None = None
    guest_agent: bool = True  # the QEMU guest agent's channel (guest IPs from inside the guest)
    boot_dev: list | None = None  # boot order (["hd", "cdrom", "network"]); None: hd, or the kernel given in boot
    stop_on_reboot: bool = False
    serials: list = field(default_factory=list)  # extra serial ports after the console (port 0): checks.chardevs
    consoles: list = field(default_factory=list)  # extra consoles ({type, target_type: virtio|serial, ...})
    # the rows that are one element of their own (saltvirt.xml.domain.elements: vTPM, watchdog, clock, ...), by
    # row name: their checked value, which the element's builder writes; a row with a field here fills the field
    elements: dict = field(default_factory=dict)
    hypervisor_features: dict = field(default_factory=dict)  # {"kvm-hint-dedicated": True, ...}
    cpu_model: dict | None = None  # Salt's cpu dict (cpumem.cpu_detail): mode, model, topology, features
    memtune: dict | None = None  # Salt's mem dict limits in MiB: hard_limit, soft_limit, swap_hard_limit, ...
    numatune: dict | None = None  # {mode, nodeset, memnodes}: host NUMA nodes the guest memory comes from
    vcpu: dict | None = None  # Salt's cpu:current/placement/cpuset: the attributes of <vcpu>
    cputune: dict | None = None  # Salt's cpu:tuning (cpumem.cpu_tuning): vcpupin, emulatorpin, shares, ...
    mem_current: int | None = None  # Salt's mem:current (MiB, <currentMemory>); None: all of mem
    max_mem: dict | None = None  # Salt's mem:max + slots: {size (MiB), slots} (<maxMemory>, memory hotplug)
    # TCG only: QEMU's translated-code cache per VM (MiB; None: QEMU's own default, 1 GiB of host memory per
    # VM since QEMU 5.0). The operator's virt:tcg_tb_cache_mib (:func:`tb_cache_mib`), never a call's
    tb_cache_mib: int | None = None
    host_devices: list = field(default_factory=list)  # Salt's host_devices: node device names
    hostdevs: list = field(default_factory=list)  # what they are on the hypervisor (saltvirt.host.caps.host_devices)
    memory_backing: dict | None = None  # Salt's mem:hugepages, nosharepages, locked, ... (cpumem.memory_backing)


FIELDS = frozenset(f.name for f in fields(VMSpec))  # a checked row fills its field, else VMSpec.elements


def named_entries(value: Any, what: str) -> list[Data]:
    """Profiles come as a list of {name: {...}}, a list of {'name': n, ...} or a dict {name: {...}}: as a
    list of ``{name, ...}`` (checked: every entry a mapping with a name)."""
    if value is None:
        return []
    if isinstance(value, dict):
        value = [{k: v} for k, v in value.items()]
    if not isinstance(value, list):
        raise SaltInvocationError(f"{what} must be a list of named entries, got {value!r}")
    out = []
    for item in value:
        if not isinstance(item, dict):
            raise SaltInvocationError(f"{what} entry must be a mapping, got {item!r}")
        if "name" in item:
            entry = dict(item)
        elif len(item) == 1:
            name, params = next(iter(item.items()))
            entry = dict(params or {}, name=name)
        else:
            raise SaltInvocationError(f"{what} entry {item!r} has no name")
        entry["name"] = str(entry["name"])
        out.append(entry)
    return out


def merge_by_name(base: Iterable[Data], overrides: Iterable[Data]) -> list[Data]:
    """Entries of ``overrides`` replace/extend same-named entries of ``base``; new names are appended."""
    merged = [copy.deepcopy(e) for e in base]
    index = {e["name"]: i for i, e in enumerate(merged)}
    for entry in overrides:
        if entry["name"] in index:
            merged[index[entry["name"]]].update(entry)
        else:
            index[entry["name"]] = len(merged)
            merged.append(copy.deepcopy(entry))
    return merged


def profile_entries(profiles: Any, kind: str, name: Any, default: list[Data]) -> list[Data]:
    """The entries of ``kind`` (``nic``/``disk``) profile ``name`` in ``profiles`` (``virt:nic``/``virt:disk``);
    ``default`` for an undefined ``default`` profile, none for ``None``/``none``."""
    if name in (None, "", "none", False):
        return []
    if not isinstance(name, str):
        plural = "interfaces" if kind == "nic" else "disks"
        raise SaltInvocationError(
            f"{kind}= names a profile (a string), not {type(name).__name__} {name!r}: list devices in {plural}="
        )
    table = (profiles or {}).get(kind) or {}
    if name in table:
        return named_entries(table[name], f"virt:{kind}:{name}")
    if name == "default":
        return copy.deepcopy(default)
    raise SaltInvocationError(
        f"{kind} profile {name!r} is not defined: add it under virt:{kind}:{name} in the minion config or "
        f"pillar (defined: {', '.join(sorted(table)) or 'none'})"
    )


def image_origin(image: Any, catalog_image: Any = None) -> str | None:
    """What a new VM records as the image it came from (``virt.init``): the catalog entry's name when
    ``salt-run virt.init`` resolved ``image`` from its catalog (``catalog_image``), else the source as given
    without user:password, query and fragment (a URL may carry a token: it would be in every ``vm_info``);
    None without an image."""
    if not image:
        if catalog_image is not None:
            raise SaltInvocationError("catalog_image names the catalog entry image= came from: image= is missing")
        return None
    if catalog_image is not None:
        return validate.vm_name(catalog_image, "catalog image name")
    if not isinstance(image, str):
        raise SaltInvocationError(
            f"image must be a salt:// URL, an https URL or an absolute path, not a {type(image).__name__}"
        )
    image = image.strip()
    if "://" not in image:
        return image  # a path on the hypervisor: no credentials
    try:  # split as saltvirt.storage.intake fetches it
        urllib.parse.urlsplit(image)
    except ValueError:
        raise SaltInvocationError("image is not a URL urllib reads (not repeated here: it may hold a secret)") from None
    return validate.shown_url(image)


def _nic_shorthand(entry, what="interfaces"):
    """Classic profile shorthand -> explicit keys: {bridge: br0} / {network: default} / {eth: e1000}."""
    checks.check_keys(entry, f"{what} {entry.get('name')}", checks.NIC_KEYS, extra=checks.NIC_SHORTHAND)
    entry = dict(entry)
    for kind in NIC_TYPES:
        if kind in entry and "source" not in entry:
            entry["type"], entry["source"] = kind, entry.pop(kind)
    if "eth" in entry:
        entry.setdefault("model", entry.pop("eth"))
    return entry


def _nic(entry):
    checks.nic(entry, f"NIC {entry['name']}")
    nic_type = entry.get("type", "bridge")
    if nic_type not in NIC_TYPES:
        raise SaltInvocationError(f"NIC {entry['name']}: type must be one of {NIC_TYPES}, got {nic_type!r}")
    if not entry.get("source"):
        raise SaltInvocationError(f"NIC {entry['name']}: a source (bridge, network or device name) is needed")
    return Nic(
        name=entry["name"],
        type=nic_type,
        source=str(entry["source"]),
        model=str(entry.get("model") or "virtio"),
        mac=entry.get("mac"),
    )


def _disk_bus(entry):
    bus = entry.get("bus") or entry.get("model") or "virtio"
    if bus not in DISK_BUSES:
        raise SaltInvocationError(f"disk {entry['name']}: bus must be one of {tuple(DISK_BUSES)}, got {bus!r}")
    return bus


def _pool_disk(entry, vm_dir, image, image_format, is_first):
    """A disk on a pool volume (Salt's ``disks=[{name, pool, size, format, image | source_file}]``); the
    pool decides the default format and a disk pool's partition name (saltvirt.storage.volumes.resolve)."""
    validate.vm_name(entry["name"], "disk name")
    pool = validate.vm_name(str(entry["pool"]), f"pool of disk {entry['name']}")
    source = entry.get("path")  # Salt's source_file (checks maps it to path): an existing volume's name
    if source is not None:
        validate.vm_name(str(source), f"source_file (volume name) of disk {entry['name']}")
    disk_image = None if source else entry.get("image") or (image if is_first else None)
    size = entry.get("size")
    if size is not None:
        size = validate.positive_int(size, f"size of disk {entry['name']} (MiB)")
    if not source and not disk_image and size is None:
        if not entry.get("default_size"):
            raise SaltInvocationError(f"disk {entry['name']} needs a size (MiB), an image or a source_file volume")
        size = entry["default_size"]
    fmt = entry.get("format") or (image_format if disk_image and image_format in DISK_FORMATS else None)
    if fmt is not None and fmt not in DISK_FORMATS:
        raise SaltInvocationError(f"disk {entry['name']}: format must be one of {DISK_FORMATS}, got {fmt!r}")
    if validate.to_bool(entry.get("overlay", False)):
        raise SaltInvocationError(f"disk {entry['name']}: a pool volume is a full copy of its image, not an overlay")
    bus = _disk_bus(entry)
    return Disk(
        name=entry["name"],
        size=size,
        format=fmt,
        image=disk_image,
        bus=bus,
        target=entry.get("target"),
        attach=bool(source),
        pool=pool,
        volume=str(source) if source else f"{os.path.basename(vm_dir)}_{entry['name']}",
    )


def _disk(entry, vm_dir, image, enable_qcow, image_format, is_first, roots=()):
    entry = checks.disk(entry, f"disk {entry['name']}")
    if entry.get("pool"):
        return _pool_disk(entry, vm_dir, image, image_format, is_first)
    disk_image = entry.get("image") or (image if is_first else None)
    overlay = validate.to_bool(entry.get("overlay", enable_qcow)) and bool(disk_image)
    size = entry.get("size")
    if size is not None:
        size = validate.positive_int(size, f"size of disk {entry['name']} (MiB)")
    attach = bool(entry.get("path")) and not disk_image and size is None
    if not disk_image and size is None and entry.get("default_size"):
        size = entry["default_size"]
    if not disk_image and size is None and entry.get("device", "disk") == "disk" and not entry.get("path"):
        raise SaltInvocationError(f"disk {entry['name']} needs a size (MiB) or an image")
    fmt = entry.get("format")
    if overlay:
        if fmt not in (None, "qcow2"):
            raise SaltInvocationError(f"disk {entry['name']}: a qcow2 overlay (enable_qcow) cannot be {fmt}")
        fmt = "qcow2"
    if fmt is None and not attach:  # an existing disk's format is what is on it (saltvirt.storage.attach)
        fmt = (image_format if disk_image else None) or "qcow2"
    if fmt is not None and fmt not in DISK_FORMATS:
        raise SaltInvocationError(f"disk {entry['name']}: format must be one of {DISK_FORMATS}, got {fmt!r}")
    bus = _disk_bus(entry)
    validate.vm_name(entry["name"], "disk name")
    path = entry.get("path")
    if path:
        validate.confined(path, f"path of disk {entry['name']}", roots)
    else:
        path = os.path.join(vm_dir, f"{entry['name']}.{fmt}")
    return Disk(
        name=entry["name"],
        size=size,
        format=fmt,
        path=path,
        image=disk_image,
        overlay=overlay,
        bus=bus,
        device=entry.get("device", "disk"),
        target=entry.get("target"),
        attach=attach,
    )


def new_disks_mib(disks: Any, system_mib: int = 0) -> int:
    """MiB the disks of a new VM take, from ``virt.init``'s ``disks`` as :func:`build` reads them: the system
    disk (``system_mib``, the image's size; an entry of ``disks`` named ``system`` with a bigger ``size``: that
    size, ``virt.init`` grows the copy) plus the ``size`` of every other disk. A disk without a size (attached
    from an existing file or volume, or a copy of another image at its own size) adds nothing."""
    total = 0
    for given in named_entries(disks, "disks"):
        entry = checks.disk(given, f"disk {given['name']}")
        size = entry.get("size")
        mib = 0 if size is None else validate.positive_int(size, f"size of disk {entry['name']} (MiB)")
        if entry["name"] == DEFAULT_DISKS[0]["name"]:
            system_mib = max(system_mib, mib)
        elif entry.get("device", "disk") == "disk":
            total += mib
    return total + system_mib


def _assign_targets(disks: list[Disk]) -> None:
    used = {d.target for d in disks if d.target}
    counters: dict[str, int] = {}
    for disk in disks:
        if disk.target:
            continue
        prefix = DISK_BUSES[disk.bus]
        n = counters.get(prefix, 0)
        while f"{prefix}{chr(ord('a') + n)}" in used:
            n += 1
        disk.target = f"{prefix}{chr(ord('a') + n)}"
        used.add(disk.target)
        counters[prefix] = n + 1


def _graphics_listen(listen):
    """An address or host name: libvirt echoes it back unescaped, so anything else breaks its XML."""
    if not isinstance(listen, str) or not re.fullmatch(r"[A-Za-z0-9.:_-]{1,255}", listen):
        raise SaltInvocationError(f"graphics listen must be an IP address or host name, not {listen!r}")
    return listen


def _graphics_port(port):
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"graphics port must be a number (-1: automatic), not {port!r}") from None
    if port != -1 and not 1 <= port <= 65535:
        raise SaltInvocationError(f"graphics port must be -1 (automatic) or 1-65535, not {port}")
    return port


def disk_entries(profiles: Any, disk: Any = "default", disks: Any = None) -> list[Data]:
    """A new VM's disk entries, as :func:`build` reads them: the ``disk`` profile's (the built-in ``default``:
    the system disk, blank at :data:`DEFAULT_BLANK_DISK_MIB` without an image) merged by name with ``disks``."""
    default_disks = [dict(DEFAULT_DISKS[0], default_size=DEFAULT_BLANK_DISK_MIB)]
    return merge_by_name(profile_entries(profiles, "disk", disk, default_disks), named_entries(disks, "disks"))


def build(
    req: vmargs.InitRequest,
    *,
    image_format: str | None = None,
    images_dir: str = DEFAULT_IMAGES_DIR,
    profiles: Any = None,
    allowed_paths: Any = (),
) -> VMSpec:
    """Validate the arguments of ``virt.init`` / ``virt.running`` (``req``) and return a :class:`VMSpec`.

    The table's plain rows (a checker and the field it fills: :data:`saltvirt.model.vmargs.ARGS`) are one loop;
    the rest combine several arguments (cpu/mem, NICs, disks, graphics, boot, serial log). ``req.vtype`` is
    the domain type the host runs (``virt.init`` detects it first; None: qemu) and ``req.image`` the local
    image the first disk is cloned from, of ``image_format``.

    Disk paths, ``boot`` kernel/initrd and ``serial_log`` must lie inside ``images_dir`` or one of
    ``allowed_paths`` (the operator's ``virt:allowed_paths`` from the minion config, never from the
    call); serial logs may also go to libvirt's log directory (:data:`SERIAL_LOG_DIR`).
    """
    name = validate.vm_name(req.name)
    vtype = req.vtype or "qemu"
    plain: dict[str, Any] = {}
    own: dict[str, Any] = {}  # VMSpec.elements
    for row in vmargs.ARGS:
        if row.check is not None:
            checked = row.check(getattr(req, row.name))
            if row.into in FIELDS:
                plain[row.into] = checked
            elif row.into:
                own[row.into] = checked
    cpu, cpu_model = cpumem.cpu_detail(req.cpu)
    if cpu_model and cpu_model["mode"] == "host-passthrough" and vtype != "kvm":
        raise SaltInvocationError(f"cpu:mode host-passthrough needs KVM; this VM is {vtype} (emulated): use host-model")
    mem, memtune = cpumem.mem_detail(req.mem)
    cpu = checks.scalar(cpu, "cpu", "cpu=2")
    mem = checks.scalar(mem, "mem", "mem=1024 (MiB)")
    cpu = validate.positive_int(cpu, "cpu (number of vCPUs)", maximum=4096)
    mem = validate.positive_int(mem, "mem (MiB)", maximum=64 * 1024 * 1024)
    vcpu, cputune = _cpu_parts(cpu_model, mem)
    cells = len((cpu_model or {}).get("numa") or [])
    mem_current, max_mem, backing = cpumem.mem_layout(req.mem, mem, cells)
    validate.absolute_path(images_dir, "virt:images")
    vm_dir = validate.inside(images_dir, name)
    roots = (images_dir, *validate.allowed_paths(allowed_paths))
    enable_qcow = validate.to_bool(req.enable_qcow)

    nic_entries = merge_by_name(
        [_nic_shorthand(e, f"virt:nic:{req.nic}") for e in profile_entries(profiles, "nic", req.nic, DEFAULT_NICS)],
        [_nic_shorthand(e) for e in named_entries(req.interfaces, "interfaces")],
    )
    entries = disk_entries(profiles, req.disk, req.disks)
    image = req.image
    disks = [_disk(e, vm_dir, image, enable_qcow, image_format, i == 0, roots) for i, e in enumerate(entries)]
    if plain["cloud_init"] is not None:
        disks.append(_cidata_disk(disks, vm_dir))
    _assign_targets(disks)
    return VMSpec(
        name=name,
        cpu=cpu,
        mem=mem,
        vtype=vtype,
        disks=disks,
        nics=[_nic(e) for e in nic_entries],
        graphics=_graphics(req.graphics, req.enable_vnc),
        boot=_boot(req.boot, roots),
        serial_log=_serial_log(req.serial_log, name, roots),
        vm_dir=vm_dir,
        cpu_model=cpu_model,
        memtune=memtune,
        numatune=cpumem.numatune(req.numatune, cells),
        vcpu=vcpu,
        cputune=cputune,
        mem_current=mem_current,
        max_mem=max_mem,
        memory_backing=backing,
        elements=own,
        **plain,
    )


def _graphics(graphics, enable_vnc):
    params = checks.graphics(graphics, enable_vnc)
    if not params:
        return None
    return Graphics(
        type=params["type"],
        listen=_graphics_listen(params.get("listen", "127.0.0.1")),
        port=_graphics_port(params.get("port", -1)),
        password=params.get("password"),
        websocket=-1 if params["type"] == "vnc" else None,  # where it listens: the VNC's listen address
    )


def _boot(boot, roots):
    if not checks.boot(boot):
        return None
    for key in ("kernel", "initrd"):
        if boot.get(key):
            validate.confined(boot[key], f"boot:{key}", roots)
    boot_obj = Boot(kernel=boot.get("kernel"), initrd=boot.get("initrd"), cmdline=boot.get("cmdline"))
    _firmware(boot_obj, boot)
    return boot_obj


def _serial_log(serial_log, name, roots):
    if serial_log is True:
        return os.path.join(SERIAL_LOG_DIR, f"{name}-serial.log")
    if serial_log:
        validate.confined(serial_log, "serial_log", (*roots, SERIAL_LOG_DIR), f"virt:images, {SERIAL_LOG_DIR}")
        return serial_log
    return None


def _cpu_parts(cpu_model, mem):
    """Salt's cpu dict beside <cpu>: ``(<vcpu> attributes, <cputune>)`` taken out of ``cpu_model``; its
    NUMA cells stay in it (they are inside <cpu>) and must hold the boot memory exactly (libvirt sums them)."""
    if not cpu_model:
        return None, None
    cells = cpu_model.get("numa") or []
    if cells and sum(c["memory"] for c in cells) != mem:
        raise SaltInvocationError(
            f"cpu:numa cells hold {sum(c['memory'] for c in cells)} MiB and mem is {mem} MiB: libvirt makes the "
            "memory the sum of the cells, so make them add up to mem"
        )
    return cpu_model.pop("vcpu", None), cpu_model.pop("tuning", None)


def _cidata_disk(disks, vm_dir):
    """The cloud-init NoCloud CD-ROM (its ISO is written by saltvirt.guest.cloudinit into the VM's directory)."""
    if any(d.name == CIDATA_DISK["name"] for d in disks):
        raise SaltInvocationError(
            f"a disk named {CIDATA_DISK['name']!r} is given and cloud_init needs that name for its seed volume: "
            "rename the disk"
        )
    path = os.path.join(vm_dir, CIDATA_DISK["file"])
    return Disk(name=CIDATA_DISK["name"], format="raw", path=path, bus=CIDATA_DISK["bus"], device="cdrom")


def cidata_disk(spec: VMSpec) -> Disk | None:
    """The spec's cloud-init seed CD-ROM, or None."""
    if spec.cloud_init is None:
        return None
    return next((d for d in spec.disks if d.name == CIDATA_DISK["name"] and d.device == "cdrom"), None)


def _firmware(boot_obj, boot):
    """boot:efi/loader/nvram/secure_boot into ``boot_obj``: firmware paths absolute (which files a VM may
    have is the hypervisor's to say: :mod:`saltvirt.storage.firmware`)."""
    for key in ("loader", "nvram"):
        if boot.get(key):
            setattr(boot_obj, key, validate.absolute_path(boot[key], f"boot:{key}"))
    efi = boot.get("efi")
    efi = None if efi is None else checks.flag(efi, "boot:efi")
    secure = checks.flag(boot.get("secure_boot", False), "boot:secure_boot")
    if efi is False and (boot_obj.loader or secure):
        raise SaltInvocationError("boot:efi is False but boot:loader or boot:secure_boot asks for UEFI: drop one")
    if boot_obj.nvram and not boot_obj.loader:
        raise SaltInvocationError("boot:nvram (the UEFI variables template) goes with boot:loader (the OVMF code)")
    boot_obj.secure_boot = secure
    boot_obj.efi = bool(efi or secure) and not boot_obj.loader


def tb_cache_mib(value: Any, vtype: str) -> int | None:
    """The translation cache a VM of domain type ``vtype`` gets from the operator's
    ``virt:tcg_tb_cache_mib`` (``value``; None: :data:`DEFAULT_TCG_TB_CACHE_MIB`, 0: QEMU's default):
    None for KVM, which translates nothing."""
    if vtype != "qemu":
        return None
    value = DEFAULT_TCG_TB_CACHE_MIB if value is None else value
    if value in (0, "0"):
        return None
    return validate.positive_int(value, "virt:tcg_tb_cache_mib (MiB, 0: QEMU's default) in the minion config", 65536)
