"""libvirt domain XML, built and read with ElementTree only (escaping for free).

The only module that builds or reads domain XML: :func:`build` writes a new VM from its spec with one
builder per device (:func:`disk`, :func:`interface`, :func:`graphics`, ...), :func:`parse` reads what
salt-virt reports, and the editing helpers (:func:`edit_devices`, :func:`interface_by_mac`,
:func:`device_xml`) change an existing definition with the same builders (``saltvirt.converge``).
"""

import xml.etree.ElementTree as ET

METADATA_NS = "https://github.com/salt-virt/salt-virt/metadata/1"
GUEST_AGENT = "org.qemu.guest_agent.0"  # the virtio-serial port name the QEMU guest agent listens on
ET.register_namespace("saltvirt", METADATA_NS)


def _el(tag, text=None, **attrs):
    el = ET.Element(tag, {k: str(v) for k, v in attrs.items() if v is not None})
    if text is not None:
        el.text = str(text)
    return el


def _sub(parent, tag, text=None, **attrs):
    el = _el(tag, text, **attrs)
    parent.append(el)
    return el


def _metadata(dom, spec):
    """salt-virt's own <metadata>: the anti-affinity group, the minion key virt.init seeded."""
    if not (spec.group or spec.minion_key):
        return
    meta = _sub(_sub(dom, "metadata"), f"{{{METADATA_NS}}}vm")
    if spec.group:
        _sub(meta, f"{{{METADATA_NS}}}group", spec.group)
    if spec.minion_key:
        key = spec.minion_key
        _sub(meta, f"{{{METADATA_NS}}}minion", id=key["minion_id"], key_sha256=key["fingerprint"])


def build(spec):
    """Domain XML (str) for a :class:`saltvirt.spec.VMSpec`."""
    dom = ET.Element("domain", type=spec.vtype)
    _sub(dom, "name", spec.name)
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


def os_config(spec):
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
    else:
        for dev in spec.boot_dev or ["hd"]:
            _sub(el, "boot", dev=dev)
    return el


def features(spec):
    """``<features>``: ACPI, APIC, and SMM for secure boot."""
    el = _el("features")
    _sub(el, "acpi")
    _sub(el, "apic")
    if spec.boot and spec.boot.secure_boot:
        _sub(el, "smm", state="on")
    if spec.hypervisor_features:
        kvm = _sub(el, "kvm")
        for name, on in sorted(spec.hypervisor_features.items()):
            _sub(kvm, name.removeprefix("kvm-"), state="on" if on else "off")
    return el


def cpu(c):
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


CPUTUNE_SCALARS = ("shares", "global_period", "global_quota", "period", "quota")
CPUTUNE_SCALARS += ("emulator_period", "emulator_quota", "iothread_period", "iothread_quota")


def cputune(t):
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


def memtune(limits):
    """``<memtune>`` with the limits (MiB) of Salt's mem dict."""
    el = _el("memtune")
    for key in ("hard_limit", "soft_limit", "swap_hard_limit", "min_guarantee"):
        if key in limits:
            _sub(el, key, limits[key], unit="MiB")
    return el


def memory_backing(b):
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


def numatune(n):
    """``<numatune>``: the host NUMA nodes the guest's memory comes from, and per guest cell (``<memnode>``)."""
    el = _el("numatune")
    if n.get("mode"):
        _sub(el, "memory", mode=n["mode"], nodeset=n["nodeset"])
    for node in n.get("memnodes", []):
        _sub(el, "memnode", cellid=node["cellid"], mode=node["mode"], nodeset=node["nodeset"])
    return el


def clock(c):
    """``<clock>`` (speckeys.clock) with its ``<timer>`` elements."""
    el = _el("clock", **{k: v for k, v in c.items() if k != "timers"})
    for t in c["timers"]:
        _sub(el, "timer", **t)
    return el


# one builder per device: an Element, exactly as build() writes it for a new VM --------------------
def disk(d):
    """``<disk>`` for a :class:`saltvirt.spec.Disk`: a file, or a volume of a storage pool."""
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


def interface(nic):
    """``<interface>`` for a :class:`saltvirt.spec.Nic`."""
    el = _el("interface", type=nic.type)
    if nic.mac:
        _sub(el, "mac", address=nic.mac)
    if nic.type == "direct":
        _sub(el, "source", dev=nic.source, mode="bridge")
    else:
        _sub(el, "source", **{nic.type: nic.source})
    _sub(el, "model", type=nic.model)
    return el


def serial(log_file=None):
    """The serial port (pty), logged to ``log_file`` when given."""
    el = _el("serial", type="pty")
    if log_file:
        _sub(el, "log", file=log_file, append="on")
    _sub(el, "target", port=0)
    return el


def console():
    el = _el("console", type="pty")
    _sub(el, "target", type="serial", port=0)
    return el


def guest_agent_channel():
    """The QEMU guest agent's virtio-serial channel (libvirt picks the socket and adds the controller).
    A guest without the agent just leaves it unused; libvirt reports ``state='connected'`` once it runs."""
    el = _el("channel", type="unix")
    _sub(el, "target", type="virtio", name=GUEST_AGENT)
    return el


def chardev(kind, c, port):
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


def tpm(t):
    """A vTPM emulated by swtpm (libvirt starts it, its state lives below /var/lib/libvirt/swtpm)."""
    el = _el("tpm", model=t["model"])
    _sub(el, "backend", type="emulator", version=t["version"])
    return el


def hostdev(h):
    """A host PCI or USB device passed through (saltvirt.caps.host_devices); libvirt detaches a PCI
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


def graphics(g):
    """``<graphics>`` for a :class:`saltvirt.spec.Graphics` (its password goes into the XML only)."""
    el = _el(
        "graphics",
        type=g.type,
        port=g.port,
        autoport="yes" if g.port in (-1, None) else "no",
        listen=g.listen,
        passwd=g.password,
    )
    _sub(el, "listen", type="address", address=g.listen)
    return el


def video():
    el = _el("video")
    _sub(el, "model", type="vga")
    return el


def tablet():
    """The USB tablet that keeps the pointer in sync on a graphical console."""
    return _el("input", type="tablet", bus="usb")


# editing an existing definition -------------------------------------------------------------------
def _mac_of(el):
    mac = el.find("mac")
    return (mac.get("address") or "").lower() if mac is not None else ""


def interface_by_mac(devices, mac):
    """The ``<interface>`` with ``mac`` (lower case) in a domain's XML (str) or its ``<devices>`` element."""
    if isinstance(devices, str):
        devices = ET.fromstring(devices).find("devices")
    return next((el for el in devices.findall("interface") if el.find("mac") is not None and _mac_of(el) == mac), None)


def device_xml(el, strip_address=False):
    """One device element as XML (to attach, detach or update it), without its PCI address if asked."""
    el = ET.fromstring(ET.tostring(el))
    if strip_address:
        for addr in el.findall("address"):
            el.remove(addr)
    return ET.tostring(el, encoding="unicode")


def edit_devices(xml, *, graphics_spec=False, remove_macs=(), change_nics=(), add_nics=(), add_disks=()):
    """Domain XML with devices changed by the builders above. Returns ``(xml, kept)``: ``kept`` are the
    MACs (lower case) of the interfaces already there, so the ones libvirt completes can be told apart.

    ``graphics_spec``: False keeps graphics as they are, None removes them, a Graphics replaces them.
    ``change_nics``: Nics whose MAC names the interface to change in place (its PCI address kept)."""
    root = ET.fromstring(xml)
    devices = root.find("devices")
    if graphics_spec is not False:
        for el in devices.findall("graphics") + devices.findall("video"):
            devices.remove(el)
        if graphics_spec:
            devices.extend([graphics(graphics_spec), video()])
            if devices.find("input[@type='tablet']") is None:
                devices.append(tablet())
    for mac in remove_macs:
        el = interface_by_mac(devices, mac)
        if el is not None:
            devices.remove(el)
    for nic in change_nics:
        el = interface_by_mac(devices, nic.mac.lower())
        new = interface(nic)
        if el is not None:  # same element, same MAC and PCI address: new type, source, model
            keep = el.findall("address")
            el.clear()
            el.attrib.update(new.attrib)
            el.extend(list(new) + keep)
    kept = {m.get("address", "").lower() for m in devices.findall("interface/mac")}
    devices.extend(interface(n) for n in add_nics)
    devices.extend(disk(d) for d in add_disks)
    return ET.tostring(root, encoding="unicode"), kept


def move_disks(xml, disk_map):
    """Domain XML with disk sources moved per ``disk_map`` ({source path: target path}); the backing
    chain libvirt reports is dropped for moved disks (the target reads it from the new image)."""
    root = ET.fromstring(xml)
    for el in root.findall("devices/disk"):
        src = el.find("source")
        if src is not None and src.get("file") in disk_map:
            src.set("file", disk_map[src.get("file")])
            for backing in el.findall("backingStore"):
                el.remove(backing)
    return ET.tostring(root, encoding="unicode")


def new_interfaces(xml, kept_macs):
    """The ``<interface>`` elements of ``xml`` whose MAC is not in ``kept_macs`` (the ones just added)."""
    devices = ET.fromstring(xml).find("devices")
    return [el for el in devices.findall("interface") if el.find("mac") is not None and _mac_of(el) not in kept_macs]


def disks_by_target(xml):
    """``{target dev: <disk> element}`` of a domain's XML."""
    devices = ET.fromstring(xml).find("devices")
    return {el.find("target").get("dev"): el for el in devices.findall("disk") if el.find("target") is not None}


# reading ------------------------------------------------------------------------------------------
def domain_name(xml):
    """The ``<name>`` of domain XML given by a user; ValueError when it does not parse."""
    try:
        return ET.fromstring(xml).findtext("name")
    except ET.ParseError as exc:
        raise ValueError(f"the domain XML does not parse: {exc}") from None


def _int(text, default=0):
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def _mib(el, attr=None):
    """An element's size (its text, or its attribute ``attr``) in MiB; libvirt's default unit is KiB."""
    if el is None:
        return 0
    unit = (el.get("unit") or "KiB").lower()
    factor = {
        "b": 1 / 1048576,
        "bytes": 1 / 1048576,
        "kib": 1 / 1024,
        "k": 1 / 1024,
        "mib": 1,
        "m": 1,
        "gib": 1024,
        "g": 1024,
    }
    return int(_int(el.get(attr) if attr else el.text) * factor.get(unit, 1 / 1024))


def read(xml):
    """The parsed domain XML (``xml``: a string, or what this returned already): parse once, then hand
    the tree to :func:`parse`, :func:`salt_facts` and :func:`loader`."""
    return xml if isinstance(xml, ET.Element) else ET.fromstring(xml)


def parse(xml):
    """The facts salt-virt reports about a domain, from its XML (no further libvirt calls)."""
    root = read(xml)
    devices = root.find("devices")
    if devices is None:
        devices = ET.Element("devices")
    disks = []
    for d in devices.findall("disk"):
        src, tgt, drv = d.find("source"), d.find("target"), d.find("driver")
        backing = d.find("backingStore/source")
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
            }
        )
    os_el = root.find("os")
    boot = {}
    if os_el is not None:
        for key in ("kernel", "initrd", "cmdline"):
            el = os_el.find(key)
            if el is not None:
                boot[key] = el.text
    log = devices.find("serial/log")
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
        "group": root.findtext(f"metadata/{{{METADATA_NS}}}vm/{{{METADATA_NS}}}group"),
        "minion": _minion(root),
        "guest_agent": _guest_agent(devices),
    }


def _guest_agent(devices):
    """The guest agent channel's state: ``connected``/``disconnected`` (a running VM, as libvirt reports
    it), ``unknown`` (no state reported: not running, or a driver that does not say), None (no channel)."""
    for el in devices.findall("channel/target"):
        if el.get("name") == GUEST_AGENT:
            return el.get("state") or "unknown"
    return None


def _minion(root):
    """``{id, key_sha256}`` of the minion key virt.init seeded into this VM (its <metadata>), or None."""
    el = root.find(f"metadata/{{{METADATA_NS}}}vm/{{{METADATA_NS}}}minion")
    if el is None or not el.get("id") or not el.get("key_sha256"):
        return None
    return {"id": el.get("id"), "key_sha256": el.get("key_sha256")}


def loader(xml):
    """``<os><loader>`` as Salt's ``virt.get_loader``: ``{path, <attributes>}``, ``{path: "None"}`` if none."""
    out = {"path": "None"}
    el = read(xml).find("os/loader")
    if el is not None:
        out["path"] = (el.text or "").strip() or "None"
        out.update(el.attrib)
    return out


def salt_facts(xml):
    """The facts Salt's ``virt.vm_info`` adds: ``loader`` and the ``on_poweroff``/``on_reboot``/``on_crash`` actions."""
    root = read(xml)
    out = {"loader": loader(root)}
    for key in ("on_poweroff", "on_reboot", "on_crash"):
        out[key] = root.findtext(key)
    return out


def parse_for_compare(xml):
    """:func:`parse` plus what comparing with a spec needs (``saltvirt.converge``): the current vCPU
    count, each NIC's source by its type (a running VM's network NIC also names its bridge) and the
    graphics passwords. Never report these facts as they are: they hold the passwords."""
    facts = parse(xml)
    root = ET.fromstring(xml)
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


# firmware, boot order, extra chardevs, vTPM: read to compare, replaced in a definition ------------------
FEATURES = (
    "firmware",
    "boot_dev",
    "stop_on_reboot",
    "serials",
    "consoles",
    "tpm",
    "clock",
    "hypervisor_features",
    "cpu_model",
    "memtune",
    "numatune",
    "vcpu",
    "cputune",
    "max_mem",
    "memory_backing",
    "host_devices",
)


def _chardev_facts(el):
    src, proto = el.find("source"), el.find("protocol")
    out = {"type": el.get("type")}
    if el.get("type") == "tcp" and src is not None:
        out.update(
            host=src.get("host"),
            port=_int(src.get("service"), None),
            protocol=proto.get("type") if proto is not None else "raw",
        )
    return out


def _port(el):
    target = el.find("target")
    return _int(target.get("port"), 0) if target is not None else 0


def feature_facts(xml):
    """The firmware, boot order, on_reboot action, extra serial ports (port >= 1), virtio consoles and
    vTPM of domain XML, normalized so what libvirt reads back equals what :func:`build` wrote."""
    root = ET.fromstring(xml)
    os_el = root.find("os")
    if os_el is None:
        os_el = ET.Element("os")
    loader = os_el.find("loader")
    nvram = os_el.find("nvram")
    autoselected = os_el.get("firmware") == "efi"
    fw_secure = os_el.find("firmware/feature[@name='secure-boot']")
    secure = (fw_secure is not None and fw_secure.get("enabled") == "yes") or (
        loader is not None and loader.get("secure") == "yes"
    )
    own_loader = loader is not None and not autoselected and (loader.text or "").strip()
    serials = [el for el in root.findall("devices/serial") if _port(el) >= 1]
    consoles = [el for el in root.findall("devices/console") if el.find("target[@type='virtio']") is not None]
    tpm_el = root.find("devices/tpm")
    max_el = root.find("maxMemory")
    backend = tpm_el.find("backend") if tpm_el is not None else None
    return {
        "firmware": {
            "efi": autoselected or bool(own_loader),
            "loader": own_loader or None,
            "nvram": nvram.get("template") if own_loader and nvram is not None else None,
            "secure_boot": secure,
        },
        "boot_dev": [b.get("dev") for b in os_el.findall("boot")],
        "stop_on_reboot": root.findtext("on_reboot") == "destroy",
        "serials": [_chardev_facts(el) for el in serials],
        "consoles": [_chardev_facts(el) for el in consoles],
        "tpm": {"model": tpm_el.get("model"), "version": backend.get("version") if backend is not None else None}
        if tpm_el is not None
        else None,
        "clock": _clock_facts(root.find("clock")),
        "hypervisor_features": {f"kvm-{el.tag}": el.get("state") == "on" for el in root.findall("features/kvm/*")},
        "cpu_model": _cpu_facts(root.find("cpu")),
        "memtune": {el.tag: _mib(el) for el in root.findall("memtune/*")} or None,
        "numatune": _numatune_facts(root.find("numatune")),
        "vcpu": _vcpu_facts(root.find("vcpu")),
        "cputune": _cputune_facts(root.find("cputune")),
        "max_mem": {"size": _mib(max_el), "slots": _int(max_el.get("slots"))} if max_el is not None else None,
        "memory_backing": _backing_facts(root.find("memoryBacking")),
        "host_devices": [_hostdev_facts(el) for el in root.findall("devices/hostdev")],
    }


def _hostdev_facts(el):
    """A ``<hostdev>``'s source: ``{type: pci, address}`` or ``{type: usb, vendor, product}``."""
    src = el.find("source")
    if src is None:
        return {"type": el.get("type")}
    if el.get("type") == "pci" and src.find("address") is not None:
        a = src.find("address")
        nums = [int(a.get(k) or "0", 16) for k in ("domain", "bus", "slot", "function")]
        return {"type": "pci", "address": "{:04x}:{:02x}:{:02x}.{:x}".format(*nums)}
    ids = {k: src.find(k).get("id") for k in ("vendor", "product") if src.find(k) is not None}
    return {"type": el.get("type"), **ids}


def _backing_facts(el):
    """``<memoryBacking>`` as cpumem.memory_backing writes it (page sizes in KiB)."""
    if el is None or not len(el):
        return None
    out = {}
    if el.find("hugepages") is not None:
        out["hugepages"] = [
            {"size": _kib(p), **({"nodeset": p.get("nodeset")} if p.get("nodeset") else {})}
            for p in el.findall("hugepages/page")
        ]
    for key in ("nosharepages", "locked", "discard"):
        if el.find(key) is not None:
            out[key] = True
    for key, attr in (("source", "type"), ("access", "mode"), ("allocation", "mode")):
        if el.find(key) is not None:
            out[key] = el.find(key).get(attr)
    return out


def _kib(page):
    unit = (page.get("unit") or "KiB").lower().rstrip("b").rstrip("i") or "k"
    return _int(page.get("size")) * {"k": 1, "m": 1024, "g": 1024**2, "t": 1024**3}.get(unit[0], 1)


def _numatune_facts(el):
    """``<numatune>``: its memory's mode and nodeset, and ``memnodes`` when there are some."""
    if el is None or not len(el):
        return None
    out = dict(el.find("memory").attrib) if el.find("memory") is not None else {}
    nodes = [{**m.attrib, "cellid": _int(m.get("cellid"))} for m in el.findall("memnode")]
    return {**out, "memnodes": nodes} if nodes else out


def _vcpu_facts(el):
    """``<vcpu>``'s placement and host cpuset (its count and current are the ``cpu`` field)."""
    if el is None:
        return {"placement": "static", "cpuset": None}
    return {"placement": el.get("placement", "static"), "cpuset": el.get("cpuset")}


def _cputune_facts(el):
    if el is None or not len(el):
        return None
    out = {k: _int(el.findtext(k)) for k in CPUTUNE_SCALARS if el.find(k) is not None}
    pins = {_int(p.get("vcpu")): p.get("cpuset") for p in el.findall("vcpupin")}
    if pins:
        out["vcpupin"] = pins
    if el.find("emulatorpin") is not None:
        out["emulatorpin"] = el.find("emulatorpin").get("cpuset")
    return out


def _cpu_facts(el):
    """``<cpu>`` as cpumem.cpu_detail writes it, without what libvirt adds on define (check, match
    exact, fallback allow, dies)."""
    if el is None:
        return None
    out = {"mode": el.get("mode", "custom")}
    if el.get("match") not in (None, "exact"):  # libvirt writes its default (exact) back
        out["match"] = el.get("match")
    model = el.find("model")
    if model is not None and (model.text or "").strip():
        out["model"] = {"name": model.text.strip(), **{k: v for k, v in model.attrib.items() if k != "fallback"}}
        if model.get("fallback") not in (None, "allow"):
            out["model"]["fallback"] = model.get("fallback")
    if el.findtext("vendor"):
        out["vendor"] = el.findtext("vendor")
    topo = el.find("topology")
    if topo is not None:
        out["topology"] = {k: _int(topo.get(k), 1) for k in ("sockets", "cores", "threads")}
    out["features"] = {f.get("name"): f.get("policy", "require") for f in el.findall("feature")}
    cells = [
        {**{k: v for k, v in c.attrib.items() if k != "unit"}, "id": _int(c.get("id")), "memory": _mib(c, "memory")}
        for c in el.findall("numa/cell")
    ]
    if cells:
        out["numa"] = cells
    return None if out == {"mode": "custom", "features": {}} else out  # libvirt drops an empty <cpu>


def _clock_facts(el):
    """``<clock>``'s attributes and timers; None for libvirt's default (UTC, no timers: what it reads back)."""
    if el is None or (dict(el.attrib) == {"offset": "utc"} and not el.findall("timer")):
        return None
    return {**el.attrib, "timers": [dict(t.attrib) for t in el.findall("timer")]}


def replace_features(xml, new_xml, fields):
    """Domain XML ``xml`` with the elements of ``fields`` (of :data:`FEATURES`) taken from ``new_xml``
    (what :func:`build` writes for the desired spec); everything else is kept as it is."""
    root, new = ET.fromstring(xml), ET.fromstring(new_xml)
    os_el, new_os = root.find("os"), new.find("os")
    if "firmware" in fields:
        _replace_firmware(root, new)
    if "boot_dev" in fields:
        for el in os_el.findall("boot"):
            os_el.remove(el)
        os_el.extend(new_os.findall("boot"))
    if "vcpu" in fields:  # placement/cpuset (and the count, as the cpu setters left it)
        root.find("vcpu").attrib.clear()
        root.find("vcpu").attrib.update(new.find("vcpu").attrib)
    tags = (("clock", "clock"), ("cpu_model", "cpu"), ("memtune", "memtune"), ("numatune", "numatune"))
    tags += (("cputune", "cputune"), ("max_mem", "maxMemory"), ("memory_backing", "memoryBacking"))
    for key, tag in tags:
        if key in fields:
            for el in root.findall(tag):
                root.remove(el)
            root.extend(new.findall(tag))
    if "hypervisor_features" in fields and root.find("features") is not None:
        for el in root.findall("features/kvm"):
            root.find("features").remove(el)
        root.find("features").extend(new.findall("features/kvm"))
    if "stop_on_reboot" in fields:
        on_reboot = root.find("on_reboot")
        if on_reboot is None:
            on_reboot = _sub(root, "on_reboot")
        on_reboot.text = new.findtext("on_reboot")
    devices, new_devices = root.find("devices"), new.find("devices")
    pick = {
        "serials": lambda d: [el for el in d.findall("serial") if _port(el) >= 1],
        "consoles": lambda d: [el for el in d.findall("console") if el.find("target[@type='virtio']") is not None],
        "tpm": lambda d: d.findall("tpm"),
        "host_devices": lambda d: d.findall("hostdev"),
    }
    for key, find in pick.items():
        if key in fields:
            for el in find(devices):
                devices.remove(el)
            devices.extend(find(new_devices))
    return ET.tostring(root, encoding="unicode")


def _replace_firmware(root, new):
    """``<os>``'s firmware attribute, ``<firmware>``, ``<loader>``, ``<nvram>`` and ``<features><smm>``
    from ``new``; ValueError when that needs another machine type (secure boot: q35)."""
    os_el, new_os = root.find("os"), new.find("os")
    old_machine = os_el.find("type").get("machine") or ""
    if new_os.find("type").get("machine") == "q35" and "q35" not in old_machine:
        raise ValueError(f"secure boot needs machine type q35 and this VM is {old_machine or 'i440fx'}")
    os_el.attrib.pop("firmware", None)
    if new_os.get("firmware"):
        os_el.set("firmware", new_os.get("firmware"))
    for tag in ("firmware", "loader", "nvram"):
        for el in os_el.findall(tag):
            os_el.remove(el)
    for i, tag in enumerate(("firmware", "loader", "nvram")):
        for el in new_os.findall(tag):
            os_el.insert(1 + i, el)
    feats = root.find("features")
    if feats is None:
        feats = _sub(root, "features")
    for el in feats.findall("smm"):
        feats.remove(el)
    feats.extend(new.findall("features/smm"))
