"""libvirt domain XML, built and read with ElementTree only (escaping for free)."""

import xml.etree.ElementTree as ET

METADATA_NS = "https://github.com/salt-virt/salt-virt/metadata/1"
ET.register_namespace("saltvirt", METADATA_NS)


def _sub(parent, tag, text=None, **attrs):
    el = ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items() if v is not None})
    if text is not None:
        el.text = str(text)
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
    _sub(dom, "memory", spec.mem, unit="MiB")
    _sub(dom, "currentMemory", spec.mem, unit="MiB")
    _sub(dom, "vcpu", spec.cpu)
    _metadata(dom, spec)
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch=spec.arch)
    if spec.boot and spec.boot.kernel:
        _sub(os_el, "kernel", spec.boot.kernel)
        if spec.boot.initrd:
            _sub(os_el, "initrd", spec.boot.initrd)
        if spec.boot.cmdline:
            _sub(os_el, "cmdline", spec.boot.cmdline)
    else:
        _sub(os_el, "boot", dev="hd")
    features = _sub(dom, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    devices = _sub(dom, "devices")
    for disk in spec.disks:
        if disk.pool:
            _volume_disk(devices, disk)
            continue
        d = _sub(devices, "disk", type="file", device=disk.device)
        _sub(d, "driver", name="qemu", type=disk.format, cache="none" if disk.device == "disk" else None)
        if disk.path:
            _sub(d, "source", file=disk.path)
        _sub(d, "target", dev=disk.target, bus=disk.bus)
        if disk.device == "cdrom":
            _sub(d, "readonly")
    for nic in spec.nics:
        i = _sub(devices, "interface", type=nic.type)
        if nic.mac:
            _sub(i, "mac", address=nic.mac)
        if nic.type == "direct":
            _sub(i, "source", dev=nic.source, mode="bridge")
        else:
            _sub(i, "source", **{nic.type: nic.source})
        _sub(i, "model", type=nic.model)
    serial = _sub(devices, "serial", type="pty")
    if spec.serial_log:
        _sub(serial, "log", file=spec.serial_log, append="on")
    _sub(serial, "target", port=0)
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port=0)
    if spec.graphics:
        g = spec.graphics
        gel = _sub(
            devices,
            "graphics",
            type=g.type,
            port=g.port,
            autoport="yes" if g.port in (-1, None) else "no",
            listen=g.listen,
            passwd=g.password,
        )
        _sub(gel, "listen", type="address", address=g.listen)
        _sub(_sub(devices, "video"), "model", type="vga")
        _sub(devices, "input", type="tablet", bus="usb")
    return ET.tostring(dom, encoding="unicode")


def _volume_disk(devices, disk):
    """A disk on a storage pool volume: libvirt resolves pool + volume to the file or block device."""
    d = _sub(devices, "disk", type="volume", device="disk")
    _sub(d, "driver", name="qemu", type=disk.format, cache="none")
    _sub(d, "source", pool=disk.pool, volume=disk.volume)
    _sub(d, "target", dev=disk.target, bus=disk.bus)
    return d


def _int(text, default=0):
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def _mib(el):
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
    return int(_int(el.text) * factor.get(unit, 1 / 1024))


def parse(xml):
    """The facts salt-virt reports about a domain, from its XML (no further libvirt calls)."""
    root = ET.fromstring(xml)
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
    }


def _minion(root):
    """``{id, key_sha256}`` of the minion key virt.init seeded into this VM (its <metadata>), or None."""
    el = root.find(f"metadata/{{{METADATA_NS}}}vm/{{{METADATA_NS}}}minion")
    if el is None or not el.get("id") or not el.get("key_sha256"):
        return None
    return {"id": el.get("id"), "key_sha256": el.get("key_sha256")}


def loader(xml):
    """``<os><loader>`` as Salt's ``virt.get_loader``: ``{path, <attributes>}``, ``{path: "None"}`` if none."""
    out = {"path": "None"}
    el = ET.fromstring(xml).find("os/loader")
    if el is not None:
        out["path"] = (el.text or "").strip() or "None"
        out.update(el.attrib)
    return out


def salt_facts(xml):
    """The facts Salt's ``virt.vm_info`` adds: ``loader`` and the ``on_poweroff``/``on_reboot``/``on_crash`` actions."""
    root = ET.fromstring(xml)
    out = {"loader": loader(xml)}
    for key in ("on_poweroff", "on_reboot", "on_crash"):
        out[key] = root.findtext(key)
    return out
