"""libvirt domain XML, built and read with ElementTree only (escaping for free).

The only module that builds or reads domain XML: :func:`build` writes a new VM from its spec with one
builder per device (:func:`disk`, :func:`interface`, :func:`graphics`, ...), :func:`parse` reads what
salt-virt reports, and the editing helpers (:func:`edit_devices`, :func:`interface_by_mac`,
:func:`device_xml`) change an existing definition with the same builders (``saltvirt.vm.converge``).
"""

import copy
import os
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable, Mapping

# the feature elements (firmware, boot order, chardevs, vTPM, tuning, NUMA, clock, host devices) are read and
# replaced by domxml_features, a part of this module kept in its own file: re-exported here
from saltvirt.base.salttypes import Data
from saltvirt.spec.vmspec import Disk, Graphics, Nic, VMSpec, console_password
from saltvirt.xml.domxml_features import CPUTUNE_SCALARS, FEATURES, feature_facts, replace_features  # noqa: F401
from saltvirt.xml.etree import attr as _attr
from saltvirt.xml.etree import el as _el
from saltvirt.xml.etree import every as _every
from saltvirt.xml.etree import first as _first
from saltvirt.xml.etree import mib as _mib
from saltvirt.xml.etree import need as _need
from saltvirt.xml.etree import read
from saltvirt.xml.etree import sub as _sub
from saltvirt.xml.etree import to_int as _int

METADATA_NS = "https://github.com/salt-virt/salt-virt/metadata/1"
_VM = f"{{{METADATA_NS}}}vm"  # salt-virt's element in a domain's <metadata>
HA_ON = "true"  # the text of <saltvirt:ha> (no element: not HA)
GUEST_AGENT = "org.qemu.guest_agent.0"  # the virtio-serial port name the QEMU guest agent listens on
ET.register_namespace("saltvirt", METADATA_NS)


def _metadata(dom, spec):
    """salt-virt's own <metadata>: the anti-affinity group, the minion key virt.init seeded, the owner, the
    image the VM came from, the HA flag (read back by :func:`parse`)."""
    if not (spec.group or spec.minion_key or spec.owner or spec.image_origin or spec.ha):
        return
    meta = _sub(_sub(dom, "metadata"), f"{{{METADATA_NS}}}vm")
    if spec.group:
        _sub(meta, f"{{{METADATA_NS}}}group", spec.group)
    if spec.minion_key:
        key = spec.minion_key
        _sub(meta, f"{{{METADATA_NS}}}minion", id=key["minion_id"], key_sha256=key["fingerprint"])
    if spec.owner:
        _sub(meta, f"{{{METADATA_NS}}}owner", **spec.owner)
    if spec.image_origin:
        _sub(meta, f"{{{METADATA_NS}}}image", spec.image_origin)
    if spec.ha:
        _sub(meta, f"{{{METADATA_NS}}}ha", HA_ON)


def with_ha(xml: str, on: bool) -> str:
    """salt-virt's ``<vm>`` element of domain ``xml`` with the HA flag ``on`` (as :func:`_metadata` writes it) or
    without it, for libvirt's ``setMetadata`` (which replaces that element, live or in the definition): without a
    namespace, libvirt gives it and its children ours."""
    old = _first(read(xml), "metadata", _VM)
    vm = ET.Element("vm")
    for child in [] if old is None else list(old):
        if child.tag != f"{{{METADATA_NS}}}ha":
            vm.append(copy.deepcopy(child))
    for el in vm.iter():
        el.tag, el.tail = el.tag.split("}")[-1], None
    if on:
        _sub(vm, "ha", HA_ON)
    return ET.tostring(vm, encoding="unicode")


def build(spec: VMSpec) -> str:
    """Domain XML (str) for a :class:`saltvirt.spec.vmspec.VMSpec`."""
    dom = ET.Element("domain", type=spec.vtype)
    _sub(dom, "name", spec.name)
    if spec.uuid:
        _sub(dom, "uuid", spec.uuid)
    if spec.max_mem:
        _sub(dom, "maxMemory", spec.max_mem["size"], slots=spec.max_mem["slots"], unit="MiB")
    _sub(dom, "memory", spec.mem, unit="MiB")
    _sub(dom, "currentMemory", spec.mem_current or spec.mem, unit="MiB")
    _sub(dom, "vcpu", spec.cpu, **(spec.vcpu or {}))
    _metadata(dom, spec)
    dom.append(os_config(spec))
    dom.append(features(spec))
    if spec.cpu_model:
        dom.append(cpu(spec.cpu_model))
    if spec.cputune:
        dom.append(cputune(spec.cputune))
    if spec.memtune:
        dom.append(memtune(spec.memtune))
    if spec.memory_backing:
        dom.append(memory_backing(spec.memory_backing))
    if spec.numatune:
        dom.append(numatune(spec.numatune))
    if spec.clock:
        dom.append(clock(spec.clock))
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "destroy" if spec.stop_on_reboot else "restart")
    _sub(dom, "on_crash", "destroy")
    devices = _sub(dom, "devices")
    devices.extend(disk(d) for d in spec.disks)
    devices.extend(interface(n) for n in spec.nics)
    devices.extend([serial(spec.serial_log), console()])
    if spec.guest_agent:
        devices.append(guest_agent_channel())
    devices.extend(chardev("serial", c, port) for port, c in enumerate(spec.serials, start=1))
    devices.extend(chardev("console", c, port) for port, c in enumerate(spec.consoles, start=1))
    if spec.tpm:
        devices.append(tpm(spec.tpm))
    devices.extend(hostdev(h) for h in spec.hostdevs)
    if spec.graphics:
        devices.extend([graphics(spec.graphics), video(), tablet()])
    return ET.tostring(dom, encoding="unicode")


def os_config(spec: VMSpec) -> ET.Element:
    """``<os>``: architecture, machine, firmware (BIOS, UEFI autoselected or a given OVMF), direct
    kernel boot or the boot order. Secure boot needs q35 (OVMF's SMM build)."""
    b = spec.boot
    secure = bool(b and b.secure_boot)
    el = _el("os", firmware="efi" if b and b.efi else None)
    _sub(el, "type", "hvm", arch=spec.arch, machine="q35" if secure else None)
    if b and b.efi and secure:
        fw = _sub(el, "firmware")
        _sub(fw, "feature", enabled="yes", name="enrolled-keys")
        _sub(fw, "feature", enabled="yes", name="secure-boot")
    if b and b.loader:
        _sub(el, "loader", b.loader, readonly="yes", secure="yes" if secure else None, type="pflash")
        if b.nvram:
            _sub(el, "nvram", template=b.nvram)
    if b and b.kernel:
        _sub(el, "kernel", b.kernel)
        if b.initrd:
            _sub(el, "initrd", b.initrd)
        if b.cmdline:
            _sub(el, "cmdline", b.cmdline)
    # with a direct kernel boot only the order given (as Salt: for after the kernel is taken away)
    for dev in spec.boot_dev or ([] if b and b.kernel else ["hd"]):
        _sub(el, "boot", dev=dev)
    return el


def features(spec: VMSpec) -> ET.Element:
    """``<features>``: ACPI, APIC, SMM for secure boot, Salt's KVM hints, and TCG's translation cache."""
    el = _el("features")
    _sub(el, "acpi")
    _sub(el, "apic")
    if spec.boot and spec.boot.secure_boot:
        _sub(el, "smm", state="on")
    if spec.hypervisor_features:
        kvm = _sub(el, "kvm")
        for name, on in sorted(spec.hypervisor_features.items()):
            _sub(kvm, name.removeprefix("kvm-"), state="on" if on else "off")
    if spec.tb_cache_mib and spec.vtype == "qemu":  # libvirt >= 8.0: QEMU's -accel tcg,tb-size
        _sub(_sub(el, "tcg"), "tb-cache", spec.tb_cache_mib, unit="MiB")
    return el


def cpu(c: Data) -> ET.Element:
    """``<cpu>`` from Salt's cpu dict (cpumem.cpu_detail): mode, match, check, model, vendor, topology, features."""
    el = _el("cpu", mode=c["mode"], match=c.get("match"), check=c.get("check"))
    if c.get("model"):
        m = c["model"]
        _sub(el, "model", m["name"], fallback=m.get("fallback"), vendor_id=m.get("vendor_id"))
    if c.get("vendor"):
        _sub(el, "vendor", c["vendor"])
    if c.get("topology"):
        _sub(el, "topology", **c["topology"])
    for name, policy in sorted(c["features"].items()):
        _sub(el, "feature", policy=policy, name=name)
    if c.get("numa"):
        numa = _sub(el, "numa")
        for cell in c["numa"]:
            _sub(numa, "cell", **{k: v for k, v in cell.items() if k != "memory"}, memory=cell["memory"], unit="MiB")
    return el


def cputune(t: Data) -> ET.Element:
    """``<cputune>`` from Salt's cpu:tuning (cpumem.cpu_tuning), in libvirt's order."""
    el = _el("cputune")
    for key in CPUTUNE_SCALARS:
        if key in t:
            _sub(el, key, t[key])
    for vcpu, cpus in sorted(t.get("vcpupin", {}).items()):
        _sub(el, "vcpupin", vcpu=vcpu, cpuset=cpus)
    if t.get("emulatorpin"):
        _sub(el, "emulatorpin", cpuset=t["emulatorpin"])
    return el


def memtune(limits: Data) -> ET.Element:
    """``<memtune>`` with the limits (MiB) of Salt's mem dict."""
    el = _el("memtune")
    for key in ("hard_limit", "soft_limit", "swap_hard_limit", "min_guarantee"):
        if key in limits:
            _sub(el, key, limits[key], unit="MiB")
    return el


def memory_backing(b: Data) -> ET.Element:
    """``<memoryBacking>`` from Salt's mem dict (cpumem.memory_backing): hugepages (page sizes in KiB,
    per guest NUMA cells), nosharepages, locked, source, access, allocation, discard."""
    el = _el("memoryBacking")
    if "hugepages" in b:
        pages = _sub(el, "hugepages")
        for page in b["hugepages"]:
            _sub(pages, "page", size=page["size"], unit="KiB", nodeset=page.get("nodeset"))
    for key in ("nosharepages", "locked"):
        if b.get(key):
            _sub(el, key)
    if b.get("source"):
        _sub(el, "source", type=b["source"])
    if b.get("access"):
        _sub(el, "access", mode=b["access"])
    if b.get("allocation"):
        _sub(el, "allocation", mode=b["allocation"])
    if b.get("discard"):
        _sub(el, "discard")
    return el


def numatune(n: Data) -> ET.Element:
    """``<numatune>``: the host NUMA nodes the guest's memory comes from, and per guest cell (``<memnode>``)."""
    el = _el("numatune")
    if n.get("mode"):
        _sub(el, "memory", mode=n["mode"], nodeset=n["nodeset"])
    for node in n.get("memnodes", []):
        _sub(el, "memnode", cellid=node["cellid"], mode=node["mode"], nodeset=node["nodeset"])
    return el


def clock(c: Data) -> ET.Element:
    """``<clock>`` (speckeys.clock) with its ``<timer>`` elements."""
    el = _el("clock", **{k: v for k, v in c.items() if k != "timers"})
    for t in c["timers"]:
        _sub(el, "timer", **t)
    return el


# one builder per device: an Element, exactly as build() writes it for a new VM --------------------
def disk(d: Disk) -> ET.Element:
    """``<disk>`` for a :class:`saltvirt.spec.vmspec.Disk`: a file, or a volume of a storage pool."""
    if d.pool:
        return _volume_disk(d)
    el = _el("disk", type="file", device=d.device)
    _sub(el, "driver", name="qemu", type=d.format, cache="none" if d.device == "disk" else None)
    if d.path:
        _sub(el, "source", file=d.path)
    _sub(el, "target", dev=d.target, bus=d.bus)
    if d.device == "cdrom":
        _sub(el, "readonly")
    return el


def _volume_disk(d):
    """A disk on a storage pool volume: libvirt resolves pool + volume to the file or block device."""
    el = _el("disk", type="volume", device="disk")
    _sub(el, "driver", name="qemu", type=d.format, cache="none")
    _sub(el, "source", pool=d.pool, volume=d.volume)
    _sub(el, "target", dev=d.target, bus=d.bus)
    return el


def interface(nic: Nic) -> ET.Element:
    """``<interface>`` for a :class:`saltvirt.spec.vmspec.Nic`."""
    el = _el("interface", type=nic.type)
    if nic.mac:
        _sub(el, "mac", address=nic.mac)
    if nic.type == "direct":
        _sub(el, "source", dev=nic.source, mode="bridge")
    else:
        _sub(el, "source", **{nic.type: nic.source})
    _sub(el, "model", type=nic.model)
    return el


def serial(log_file: str | None = None) -> ET.Element:
    """The serial port (pty), logged to ``log_file`` when given."""
    el = _el("serial", type="pty")
    if log_file:
        _sub(el, "log", file=log_file, append="on")
    _sub(el, "target", port=0)
    return el


def console() -> ET.Element:
    el = _el("console", type="pty")
    _sub(el, "target", type="serial", port=0)
    return el


def guest_agent_channel() -> ET.Element:
    """The QEMU guest agent's virtio-serial channel (libvirt picks the socket and adds the controller).
    A guest without the agent just leaves it unused; libvirt reports ``state='connected'`` once it runs."""
    el = _el("channel", type="unix")
    _sub(el, "target", type="virtio", name=GUEST_AGENT)
    return el


def chardev(kind: str, c: Data, port: int) -> ET.Element:
    """An extra ``<serial>`` / ``<console>`` (Salt's serials/consoles entry, checked by speckeys.chardevs)
    at ``port`` (the serial console is port 0); a TCP one listens on its host (telnet or raw)."""
    el = _el(kind, type=c["type"])
    if c["type"] == "tcp":
        _sub(el, "source", mode="bind", host=c["host"], service=c["port"])
        _sub(el, "protocol", type=c["protocol"])
    if kind == "serial":
        _sub(el, "target", port=port)
    else:
        _sub(el, "target", type=c["target_type"], port=port)
    return el


def tpm(t: Data) -> ET.Element:
    """A vTPM emulated by swtpm (libvirt starts it, its state lives below /var/lib/libvirt/swtpm)."""
    el = _el("tpm", model=t["model"])
    _sub(el, "backend", type="emulator", version=t["version"])
    return el


def hostdev(h: Data) -> ET.Element:
    """A host PCI or USB device passed through (saltvirt.host.caps.host_devices); libvirt detaches a PCI
    device from its host driver (managed) while the VM runs."""
    el = _el("hostdev", mode="subsystem", type=h["type"], managed="yes" if h["type"] == "pci" else None)
    src = _sub(el, "source")
    if h["type"] == "pci":
        dom, bus, rest = h["address"].split(":")
        slot, func = rest.split(".")
        _sub(src, "address", domain=f"0x{dom}", bus=f"0x{bus}", slot=f"0x{slot}", function=f"0x{func}")
    else:
        _sub(src, "vendor", id=h["vendor"])
        _sub(src, "product", id=h["product"])
        _sub(src, "address", bus=h["bus"], device=h["device"])
    return el


def graphics(g: Graphics) -> ET.Element:
    """``<graphics>`` for a :class:`saltvirt.spec.vmspec.Graphics` (its password goes into the XML only)."""
    el = _el(
        "graphics",
        type=g.type,
        port=g.port,
        autoport="yes" if g.port in (-1, None) else "no",
        listen=g.listen,
        # a console reachable over websocket never opens without a password: unless one is given, a random one
        # nobody is told (QEMU starts with password authentication only when the XML has one; the web
        # console's tickets then set theirs: saltvirt.host.vncticket)
        passwd=g.password if g.password or g.websocket is None else console_password(),
        websocket=g.websocket,
    )
    _sub(el, "listen", type="address", address=g.listen)
    return el


def video() -> ET.Element:
    el = _el("video")
    _sub(el, "model", type="vga")
    return el


def tablet() -> ET.Element:
    """The USB tablet that keeps the pointer in sync on a graphical console."""
    return _el("input", type="tablet", bus="usb")


# editing an existing definition -------------------------------------------------------------------
def _mac_of(el):
    mac = el.find("mac")
    return (mac.get("address") or "").lower() if mac is not None else ""


def interface_by_mac(devices: str | ET.Element | None, mac: str) -> ET.Element | None:
    """The ``<interface>`` with ``mac`` (lower case) in a domain's XML (str) or its ``<devices>`` element."""
    if isinstance(devices, str):
        devices = _need(ET.fromstring(devices), "devices")
    if devices is None:
        return None
    return next((el for el in devices.findall("interface") if el.find("mac") is not None and _mac_of(el) == mac), None)


def device_xml(el: ET.Element, strip_address: bool = False) -> str:
    """One device element as XML (to attach, detach or update it), without its PCI address if asked."""
    el = ET.fromstring(ET.tostring(el))
    if strip_address:
        for addr in el.findall("address"):
            el.remove(addr)
    return ET.tostring(el, encoding="unicode")


def edit_devices(
    xml: str,
    *,
    graphics_spec: Graphics | None | bool = False,
    remove_macs: Collection[str] = (),
    change_nics: Iterable[Nic] = (),
    add_nics: Iterable[Nic] = (),
    add_disks: Iterable[Disk] = (),
) -> tuple[str, set[str]]:
    """Domain XML with devices changed by the builders above. Returns ``(xml, kept)``: ``kept`` are the
    MACs (lower case) of the interfaces already there, so the ones libvirt completes can be told apart.

    ``graphics_spec``: False keeps graphics as they are, None removes them, a Graphics replaces them.
    ``change_nics``: Nics whose MAC names the interface to change in place (its PCI address kept)."""
    root = ET.fromstring(xml)
    devices = _need(root, "devices")
    if graphics_spec is not False:
        for el in devices.findall("graphics") + devices.findall("video"):
            devices.remove(el)
        if isinstance(graphics_spec, Graphics):
            devices.extend([graphics(graphics_spec), video()])
            if devices.find("input[@type='tablet']") is None:
                devices.append(tablet())
    for mac in remove_macs:
        gone = interface_by_mac(devices, mac)
        if gone is not None:
            devices.remove(gone)
    for nic in change_nics:
        old = interface_by_mac(devices, (nic.mac or "").lower())
        new = interface(nic)
        if old is not None:  # same element, same MAC and PCI address: new type, source, model
            keep = old.findall("address")
            old.clear()
            old.attrib.update(new.attrib)
            old.extend(list(new) + keep)
    kept = {m.get("address", "").lower() for m in devices.findall("interface/mac")}
    devices.extend(interface(n) for n in add_nics)
    devices.extend(disk(d) for d in add_disks)
    return ET.tostring(root, encoding="unicode"), kept


def move_disks(xml: str, disk_map: Mapping[str, str]) -> str:
    """Domain XML with disk sources moved per ``disk_map`` ({source path: target path}); the backing
    chain libvirt reports is dropped for moved disks (the target reads it from the new image)."""
    root = ET.fromstring(xml)
    for el in root.findall("devices/disk"):
        src = el.find("source")
        path = src.get("file") if src is not None else None
        if src is not None and path is not None and path in disk_map:
            src.set("file", disk_map[path])
            for backing in el.findall("backingStore"):
                el.remove(backing)
    return ET.tostring(root, encoding="unicode")


def eject(xml: str, targets: Collection[str]) -> str:
    """Domain XML with the media of the CD-ROM drives ``targets`` (target devs) taken out: the drives stay, empty."""
    root = ET.fromstring(xml)
    for el in root.findall("devices/disk"):
        tgt = el.find("target")
        if el.get("device") == "cdrom" and tgt is not None and tgt.get("dev") in targets:
            for child in el.findall("source") + el.findall("backingStore"):
                el.remove(child)
    return ET.tostring(root, encoding="unicode")


def restored(xml: str, disk_map: Mapping[str, str], new_name: str | None = None) -> str:
    """Domain XML recorded by a backup, made ready to define again: disks moved per ``disk_map``
    (:func:`move_disks`) onto qcow2 files; with ``new_name`` a second VM beside the first: renamed, without the uuid
    and MAC addresses (libvirt makes new ones), with serial logs named after the new VM and none of the
    original's host state (:func:`_new_identity`)."""
    root = ET.fromstring(move_disks(xml, disk_map))
    for el in root.findall("devices/disk"):
        src, drv = el.find("source"), el.find("driver")
        if src is not None and src.get("file") in disk_map.values() and drv is not None:
            drv.set("type", "qcow2")  # a restored disk is always qcow2, whatever the original was
    if new_name:
        old = root.findtext("name") or ""
        _need(root, "name").text = new_name
        for el in root.findall("uuid"):
            root.remove(el)
        for nic in root.findall("devices/interface"):
            for mac in nic.findall("mac"):
                nic.remove(mac)
        for log in root.findall("devices/*/log"):
            path = log.get("file") or ""
            if os.path.basename(path).startswith(f"{old}-"):
                log.set("file", os.path.join(os.path.dirname(path), new_name + os.path.basename(path)[len(old) :]))
        _new_identity(root)
    return ET.tostring(root, encoding="unicode")


def _new_identity(root: ET.Element) -> None:
    """Drop what ties a copy to the original's host state: the minion key record (purging the copy would
    delete the original's key) and the UEFI variables file (both would write one file, and purging
    either removes it); libvirt gives the copy its own variables file, from the template when there is one."""
    for vm in _every(root, "metadata", _VM):
        for el in vm.findall(f"{{{METADATA_NS}}}minion"):
            vm.remove(el)
    os_el = root.find("os")
    for nvram in [] if os_el is None else os_el.findall("nvram"):
        kept = {k: v for k, v in nvram.attrib.items() if k in ("template", "templateFormat", "format")}
        if "template" not in kept and os_el is not None:
            os_el.remove(nvram)
            continue
        nvram.attrib.clear()
        nvram.attrib.update(kept)
        nvram.text = None
        for child in list(nvram):
            nvram.remove(child)


def new_interfaces(xml: str, kept_macs: Collection[str]) -> list[ET.Element]:
    """The ``<interface>`` elements of ``xml`` whose MAC is not in ``kept_macs`` (the ones just added)."""
    devices = _need(ET.fromstring(xml), "devices")
    return [el for el in devices.findall("interface") if el.find("mac") is not None and _mac_of(el) not in kept_macs]


def disks_by_target(xml: str) -> dict[str, ET.Element]:
    """``{target dev: <disk> element}`` of a domain's XML."""
    devices = _need(ET.fromstring(xml), "devices")
    return {dev: el for el in devices.findall("disk") if (dev := _attr(el, "target", "dev")) is not None}


# reading ------------------------------------------------------------------------------------------
def domain_name(xml: str) -> str | None:
    """The ``<name>`` of domain XML given by a user; ValueError when it does not parse."""
    try:
        return ET.fromstring(xml).findtext("name")
    except ET.ParseError as exc:
        raise ValueError(f"the domain XML does not parse: {exc}") from None


def parse(xml: str | ET.Element) -> Data:
    """The facts salt-virt reports about a domain, from its XML (no further libvirt calls)."""
    root = read(xml)
    devices = root.find("devices")
    if devices is None:
        devices = ET.Element("devices")
    disks = []
    for d in devices.findall("disk"):
        src, tgt, drv = d.find("source"), d.find("target"), d.find("driver")
        backing = _first(d, "backingStore", "source")
        disks.append(
            {
                "target": tgt.get("dev") if tgt is not None else None,
                "bus": tgt.get("bus") if tgt is not None else None,
                "device": d.get("device", "disk"),
                "type": d.get("type"),
                "file": (src.get("file") or src.get("dev") or src.get("volume")) if src is not None else None,
                "format": drv.get("type") if drv is not None else None,
                "backing_file": backing.get("file") if backing is not None else None,
                "cache": drv.get("cache") if drv is not None else None,
                "readonly": d.find("readonly") is not None,
                "shareable": d.find("shareable") is not None,
                "pool": src.get("pool") if src is not None else None,
                "volume": src.get("volume") if src is not None else None,
            }
        )
    nics = []
    for i in devices.findall("interface"):
        mac, src, model, tgt = i.find("mac"), i.find("source"), i.find("model"), i.find("target")
        source = None
        if src is not None:
            source = src.get("bridge") or src.get("network") or src.get("dev")
        nics.append(
            {
                "type": i.get("type"),
                "mac": mac.get("address") if mac is not None else None,
                "source": source,
                "model": model.get("type") if model is not None else None,
                "target": tgt.get("dev") if tgt is not None else None,
            }
        )
    graphics = []
    for g in devices.findall("graphics"):
        listen = g.get("listen")
        lel = g.find("listen")
        if lel is not None and lel.get("address"):
            listen = lel.get("address")
        graphics.append(
            {
                "type": g.get("type"),
                "port": _int(g.get("port"), -1),
                "autoport": g.get("autoport") == "yes",
                "listen": listen,
                "password": bool(g.get("passwd")),
                "websocket": _int(g.get("websocket"), 0) or None,  # -1: a free port when it starts
            }
        )
    os_el = root.find("os")
    boot = {}
    if os_el is not None:
        for key in ("kernel", "initrd", "cmdline"):
            el = os_el.find(key)
            if el is not None:
                boot[key] = el.text
    log = _first(devices, "serial", "log")
    vcpu = root.find("vcpu")
    return {
        "name": root.findtext("name"),
        "uuid": root.findtext("uuid"),
        "type": root.get("type"),
        "cpu": _int(vcpu.text if vcpu is not None else None, 1),
        "mem": _mib(root.find("memory")),
        "current_mem": _mib(root.find("currentMemory")),
        "disks": disks,
        "nics": nics,
        "graphics": graphics,
        "boot": boot,
        "serial_log": log.get("file") if log is not None else None,
        "group": _meta_text(root, "group"),
        "minion": _minion(root),
        "owner": owner(root),
        "image": _meta_text(root, "image") or None,  # what virt.init recorded (a catalog name or a source), or None
        "ha": _meta_text(root, "ha") == HA_ON,  # automatic HA restarts it (saltvirt.fleet.ha)
        "guest_agent": _guest_agent(devices),
    }


def _meta_text(root, tag):
    """The text of salt-virt's ``<metadata><sv:vm><sv:{tag}>`` ("" when empty), None without one."""
    el = _first(root, "metadata", _VM, f"{{{METADATA_NS}}}{tag}")
    return None if el is None else el.text or ""


def _guest_agent(devices):
    """The guest agent channel's state: ``connected``/``disconnected`` (a running VM, as libvirt reports
    it), ``unknown`` (no state reported: not running, or a driver that does not say), None (no channel)."""
    for el in _every(devices, "channel", "target"):
        if el.get("name") == GUEST_AGENT:
            return el.get("state") or "unknown"
    return None


def owner(root: ET.Element) -> dict | None:
    """``{tenant, creator}`` salt-run virt.init recorded in the domain's <metadata>, or None."""
    el = _first(root, "metadata", _VM, f"{{{METADATA_NS}}}owner")
    if el is None:
        return None
    return {key: el.get(key) for key in ("tenant", "creator")}


def _minion(root):
    """``{id, key_sha256}`` of the minion key virt.init seeded into this VM (its <metadata>), or None."""
    el = _first(root, "metadata", _VM, f"{{{METADATA_NS}}}minion")
    if el is None or not el.get("id") or not el.get("key_sha256"):
        return None
    return {"id": el.get("id"), "key_sha256": el.get("key_sha256")}


def loader(xml: str | ET.Element) -> Data:
    """``<os><loader>`` as Salt's ``virt.get_loader``: ``{path, <attributes>}``, ``{path: "None"}`` if none."""
    out = {"path": "None"}
    el = _first(read(xml), "os", "loader")
    if el is not None:
        out["path"] = (el.text or "").strip() or "None"
        out.update(el.attrib)
    return out


def salt_facts(xml: str | ET.Element) -> Data:
    """The facts Salt's ``virt.vm_info`` adds: ``loader`` and the ``on_poweroff``/``on_reboot``/``on_crash`` actions."""
    root = read(xml)
    out: Data = {"loader": loader(root)}
    for key in ("on_poweroff", "on_reboot", "on_crash"):
        out[key] = root.findtext(key)
    return out


# Salt's graphics keys, "None" (a string, as Salt's) when the VM has no console or the attribute is unset
SALT_GRAPHICS_KEYS = ("autoport", "keymap", "listen", "port", "type")
SECRET_ATTRS = ("passwd",)  # never reported


def salt_devices(xml: str | ET.Element) -> Data:
    """NICs and graphics as Salt's ``virt.vm_info`` shapes them: ``nics``, one per ``<interface>`` with a
    MAC, ``{type, mac, model?, target?, source: {attr: value}, driver?/address?/virtualport?: {...}}``
    (the attributes of those elements, as Salt), and ``graphics``: the attributes of the first
    ``<graphics>`` as strings over Salt's defaults (``"None"``), the password left out."""
    root = read(xml)
    nics: list[Data] = []
    for iface in _every(root, "devices", "interface"):
        nic: Data = {"type": iface.get("type")}
        for el in iface:
            if el.tag == "mac":
                nic["mac"] = el.get("address")
            elif el.tag == "model":
                nic["model"] = el.get("type")
            elif el.tag == "target":
                nic["target"] = el.get("dev")
            elif el.tag in ("source", "driver", "address", "virtualport"):
                nic[el.tag] = dict(el.attrib)
        nic.setdefault("source", {})
        if nic.get("mac"):
            nics.append(nic)
    graphics = dict.fromkeys(SALT_GRAPHICS_KEYS, "None")
    for el in _every(root, "devices", "graphics")[:1]:
        graphics.update({k: v for k, v in el.attrib.items() if k not in SECRET_ATTRS})
    return {"nics": nics, "graphics": graphics}


def parse_for_compare(xml: str | ET.Element) -> Data:
    """:func:`parse` plus what comparing with a spec needs (``saltvirt.vm.converge``): the current vCPU
    count, each NIC's source by its type (a running VM's network NIC also names its bridge) and the
    graphics passwords. Never report these facts as they are: they hold the passwords."""
    facts = parse(xml)
    root = read(xml)
    vcpu = root.find("vcpu")
    facts["vcpu_current"] = int(vcpu.get("current") or facts["cpu"]) if vcpu is not None else facts["cpu"]
    for nic, el in zip(facts["nics"], root.findall("devices/interface"), strict=True):
        src = el.find("source")
        if src is not None and nic["type"] in ("bridge", "network"):
            nic["source"] = src.get(nic["type"]) or nic["source"]
    facts["features"] = feature_facts(xml)
    passwds = [g.get("passwd") for g in root.findall("devices/graphics")]
    for g, pw in zip(facts["graphics"], passwds, strict=True):
        g["passwd"] = pw
    return facts


# the web console's VNC over websocket (saltvirt.host.vncticket): the reader of the live element, the builder
# of its password change
def vnc_websocket(root: ET.Element) -> ET.Element | None:
    """The running VM's first ``<graphics type='vnc'>`` with a websocket port libvirt gave it, or None."""
    for g in root.findall("devices/graphics"):
        if g.get("type") == "vnc" and _int(g.get("websocket"), -1) > 0:
            return g
    return None


def graphics_password(live: ET.Element, password: str, valid_to: str) -> str:
    """``<graphics>`` for ``updateDeviceFlags``: ``live`` (as :func:`vnc_websocket` found it: libvirt refuses
    any other change of a live console) with a new ``passwd`` valid until ``valid_to`` (UTC,
    ``YYYY-MM-DDThh:mm:ss``)."""
    el = ET.fromstring(ET.tostring(live))
    el.set("passwd", password)
    el.set("passwdValidTo", valid_to)
    el.attrib.pop("connected", None)
    return ET.tostring(el, encoding="unicode")
