"""A domain's ``<devices>``: disks, interfaces, the serial console and extra chardevs, the guest agent channel,
the vTPM, host devices, graphics; each device's builder beside its reader. The builders write a new VM's
devices and change an existing one's (``saltvirt.xml.domain.edit``, ``saltvirt.vm.converge``)."""

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.model.vmspec import Disk, Graphics, Nic, VMSpec, console_password
from saltvirt.xml.domain import elements
from saltvirt.xml.etree import el, every, first, need, read, sub, to_int

GUEST_AGENT = "org.qemu.guest_agent.0"  # the virtio-serial port name the QEMU guest agent listens on
# Salt's graphics keys, "None" (a string, as Salt's) when the VM has no console or the attribute is unset
SALT_GRAPHICS_KEYS = ("autoport", "keymap", "listen", "port", "type")
SECRET_ATTRS = ("passwd",)  # never reported
ELEMENTS: list[elements.Element] = []  # the devices of their own (elements.of below), in the order they are written


def build_devices(spec: VMSpec) -> list[ET.Element]:
    """``<devices>`` of a new domain, every device from its builder below."""
    devices = el("devices")
    for d in spec.disks:
        devices.append(disk(d))
    for n in spec.nics:
        devices.append(interface(n))
    devices.extend([serial(spec.serial_log), console()])
    if spec.guest_agent:
        devices.append(guest_agent_channel())
    devices.extend(chardev("serial", c, port) for port, c in enumerate(spec.serials, start=1))
    devices.extend(chardev("console", c, port) for port, c in enumerate(spec.consoles, start=1))
    devices.extend(elements.build_all(ELEMENTS, spec.elements))
    devices.extend(hostdev(h) for h in spec.hostdevs)
    if spec.graphics:
        devices.extend([graphics(spec.graphics), video(), tablet()])
    return [devices]


def facts(root: ET.Element, compare: bool = False) -> Data:
    """``disks``, ``nics``, ``graphics``, ``serial_log`` and ``guest_agent`` as ``parse`` reports them; with
    ``compare`` each NIC's source by its type and the graphics passwords (never report those)."""
    devices = root.find("devices")
    if devices is None:
        devices = ET.Element("devices")
    log = first(devices, "serial", "log")
    return {
        "disks": [disk_facts(d) for d in devices.findall("disk")],
        "nics": [interface_facts(i, compare) for i in devices.findall("interface")],
        "graphics": [graphics_facts(g, compare) for g in devices.findall("graphics")],
        "serial_log": log.get("file") if log is not None else None,
        "guest_agent": guest_agent_state(devices),
    }


def feature_facts(root: ET.Element) -> Data:
    """This group's part of ``definition.feature_facts``: extra serial ports, virtio consoles, vTPM, watchdog, host
    devices."""
    devices = root.find("devices")
    if devices is None:
        devices = ET.Element("devices")
    return {
        "serials": [chardev_facts(c) for c in extra_serials(devices)],
        "consoles": [chardev_facts(c) for c in virtio_consoles(devices)],
        **elements.read_all(ELEMENTS, devices),
        "host_devices": [hostdev_facts(h) for h in devices.findall("hostdev")],
    }


def replace(root: ET.Element, new: ET.Element, fields: Iterable[str]) -> None:
    """The devices of ``fields`` in ``root`` taken from ``new`` (the desired definition)."""
    devices, new_devices = need(root, "devices"), need(new, "devices")
    pick = {"serials": extra_serials, "consoles": virtio_consoles, "host_devices": lambda d: d.findall("hostdev")}
    for key, find in pick.items():
        if key in fields:
            for old in find(devices):
                devices.remove(old)
            devices.extend(find(new_devices))
    elements.replace_all(ELEMENTS, devices, new_devices, fields)


# disks -------------------------------------------------------------------------------------------------
def disk(d: Disk) -> ET.Element:
    """``<disk>`` for a :class:`saltvirt.model.vmspec.Disk`: a file, or a volume of a storage pool."""
    if d.pool:
        return _volume_disk(d)
    node = el("disk", type="file", device=d.device)
    sub(node, "driver", name="qemu", type=d.format, cache="none" if d.device == "disk" else None)
    if d.path:
        sub(node, "source", file=d.path)
    sub(node, "target", dev=d.target, bus=d.bus)
    if d.device == "cdrom":
        sub(node, "readonly")
    return node


def _volume_disk(d):
    """A disk on a storage pool volume: libvirt resolves pool + volume to the file or block device."""
    node = el("disk", type="volume", device="disk")
    sub(node, "driver", name="qemu", type=d.format, cache="none")
    sub(node, "source", pool=d.pool, volume=d.volume)
    sub(node, "target", dev=d.target, bus=d.bus)
    return node


def disk_facts(node: ET.Element) -> Data:
    """A ``<disk>``: target, bus, device, type, its file (or block device, or volume), format, backing file,
    cache, readonly, shareable, pool and volume."""
    src, tgt, drv = node.find("source"), node.find("target"), node.find("driver")
    backing = first(node, "backingStore", "source")
    return {
        "target": tgt.get("dev") if tgt is not None else None,
        "bus": tgt.get("bus") if tgt is not None else None,
        "device": node.get("device", "disk"),
        "type": node.get("type"),
        "file": (src.get("file") or src.get("dev") or src.get("volume")) if src is not None else None,
        "format": drv.get("type") if drv is not None else None,
        "backing_file": backing.get("file") if backing is not None else None,
        "cache": drv.get("cache") if drv is not None else None,
        "readonly": node.find("readonly") is not None,
        "shareable": node.find("shareable") is not None,
        "pool": src.get("pool") if src is not None else None,
        "volume": src.get("volume") if src is not None else None,
    }


# interfaces --------------------------------------------------------------------------------------------
def interface(nic: Nic) -> ET.Element:
    """``<interface>`` for a :class:`saltvirt.model.vmspec.Nic`."""
    node = el("interface", type=nic.type)
    if nic.mac:
        sub(node, "mac", address=nic.mac)
    if nic.type == "direct":
        sub(node, "source", dev=nic.source, mode="bridge")
    else:
        sub(node, "source", **{nic.type: nic.source})
    sub(node, "model", type=nic.model)
    return node


def interface_facts(node: ET.Element, compare: bool = False) -> Data:
    """An ``<interface>``: type, MAC, source name, model, target device. With ``compare`` the source is the one
    of its type (a running VM's network NIC also names its bridge)."""
    mac, src, model, tgt = node.find("mac"), node.find("source"), node.find("model"), node.find("target")
    source = None
    if src is not None:
        source = src.get("bridge") or src.get("network") or src.get("dev")
        if compare and node.get("type") in ("bridge", "network"):
            source = src.get(node.get("type") or "") or source
    return {
        "type": node.get("type"),
        "mac": mac.get("address") if mac is not None else None,
        "source": source,
        "model": model.get("type") if model is not None else None,
        "target": tgt.get("dev") if tgt is not None else None,
    }


# the serial console, extra chardevs, the guest agent channel -------------------------------------------
def serial(log_file: str | None = None) -> ET.Element:
    """The serial port (pty), logged to ``log_file`` when given (``facts``' ``serial_log``)."""
    node = el("serial", type="pty")
    if log_file:
        sub(node, "log", file=log_file, append="on")
    sub(node, "target", port=0)
    return node


def console() -> ET.Element:
    node = el("console", type="pty")
    sub(node, "target", type="serial", port=0)
    return node


def chardev(kind: str, c: Data, port: int) -> ET.Element:
    """An extra ``<serial>`` / ``<console>`` (Salt's serials/consoles entry, checked by checks.chardevs)
    at ``port`` (the serial console is port 0); a TCP one listens on its host (telnet or raw)."""
    node = el(kind, type=c["type"])
    if c["type"] == "tcp":
        sub(node, "source", mode="bind", host=c["host"], service=c["port"])
        sub(node, "protocol", type=c["protocol"])
    if kind == "serial":
        sub(node, "target", port=port)
    else:
        sub(node, "target", type=c["target_type"], port=port)
    return node


def chardev_facts(node: ET.Element) -> Data:
    """An extra chardev as Salt's serials/consoles entry: its type, and a TCP one's host, port and protocol."""
    src, proto = node.find("source"), node.find("protocol")
    out: Data = {"type": node.get("type")}
    if node.get("type") == "tcp" and src is not None:
        out.update(
            host=src.get("host"),
            port=validate.int_or_none(src.get("service")),
            protocol=proto.get("type") if proto is not None else "raw",
        )
    return out


def _port(node):
    target = node.find("target")
    return to_int(target.get("port"), 0) if target is not None else 0


def extra_serials(devices: ET.Element) -> list[ET.Element]:
    """The ``<serial>`` ports :func:`chardev` adds (port >= 1: port 0 is the serial console)."""
    return [node for node in devices.findall("serial") if _port(node) >= 1]


def virtio_consoles(devices: ET.Element) -> list[ET.Element]:
    """The ``<console>`` elements :func:`chardev` adds (virtio; the serial console's is type serial)."""
    return [node for node in devices.findall("console") if node.find("target[@type='virtio']") is not None]


def guest_agent_channel() -> ET.Element:
    """The QEMU guest agent's virtio-serial channel (libvirt picks the socket and adds the controller).
    A guest without the agent just leaves it unused; libvirt reports ``state='connected'`` once it runs."""
    node = el("channel", type="unix")
    sub(node, "target", type="virtio", name=GUEST_AGENT)
    return node


def guest_agent_state(devices: ET.Element) -> str | None:
    """The guest agent channel's state: ``connected``/``disconnected`` (a running VM, as libvirt reports
    it), ``unknown`` (no state reported: not running, or a driver that does not say), None (no channel)."""
    for node in every(devices, "channel", "target"):
        if node.get("name") == GUEST_AGENT:
            return node.get("state") or "unknown"
    return None


# devices of their own (elements.of: one argument, one device), host devices ----------------------------
def tpm_facts(node: ET.Element) -> Data:
    backend = node.find("backend")
    return {"model": node.get("model"), "version": backend.get("version") if backend is not None else None}


@elements.of(ELEMENTS, "tpm", "tpm", read=tpm_facts)
def tpm(t: Data) -> ET.Element:
    """A vTPM emulated by swtpm (libvirt starts it, its state lives below /var/lib/libvirt/swtpm)."""
    node = el("tpm", model=t["model"])
    sub(node, "backend", type="emulator", version=t["version"])
    return node


def watchdog_facts(node: ET.Element) -> Data:
    return {"model": node.get("model"), "action": node.get("action") or "reset"}  # libvirt's default action


@elements.of(ELEMENTS, "watchdog", "watchdog", read=watchdog_facts)
def watchdog(w: Data) -> ET.Element:
    """A watchdog the guest must keep feeding; QEMU takes ``action`` when it stops (a hung guest)."""
    return el("watchdog", model=w["model"], action=w["action"])


def rng_facts(node: ET.Element) -> bool:
    return node.get("model") == "virtio"


@elements.of(ELEMENTS, "rng", "rng", read=rng_facts)
def rng(on: bool) -> ET.Element:
    """A virtio RNG fed by the host's /dev/urandom (never a path a call names: the device is the host's)."""
    node = el("rng", model="virtio")
    sub(node, "backend", "/dev/urandom", model="random")
    return node


def hostdev(h: Data) -> ET.Element:
    """A host PCI or USB device passed through (saltvirt.host.caps.host_devices); libvirt detaches a PCI
    device from its host driver (managed) while the VM runs."""
    node = el("hostdev", mode="subsystem", type=h["type"], managed="yes" if h["type"] == "pci" else None)
    src = sub(node, "source")
    if h["type"] == "pci":
        dom, bus, rest = h["address"].split(":")
        slot, func = rest.split(".")
        sub(src, "address", domain=f"0x{dom}", bus=f"0x{bus}", slot=f"0x{slot}", function=f"0x{func}")
    else:
        sub(src, "vendor", id=h["vendor"])
        sub(src, "product", id=h["product"])
        sub(src, "address", bus=h["bus"], device=h["device"])
    return node


def hostdev_facts(node: ET.Element) -> Data:
    """A ``<hostdev>``'s source: ``{type: pci, address}`` or ``{type: usb, vendor, product}``."""
    src = node.find("source")
    if src is None:
        return {"type": node.get("type")}
    address = src.find("address")
    if node.get("type") == "pci" and address is not None:
        nums = [int(address.get(k) or "0", 16) for k in ("domain", "bus", "slot", "function")]
        return {"type": "pci", "address": "{:04x}:{:02x}:{:02x}.{:x}".format(*nums)}
    ids = {k: i.get("id") for k in ("vendor", "product") if (i := src.find(k)) is not None}
    return {"type": node.get("type"), **ids}


# graphics ----------------------------------------------------------------------------------------------
def graphics(g: Graphics) -> ET.Element:
    """``<graphics>`` for a :class:`saltvirt.model.vmspec.Graphics` (its password goes into the XML only)."""
    node = el(
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
    sub(node, "listen", type="address", address=g.listen)
    return node


def graphics_facts(node: ET.Element, compare: bool = False) -> Data:
    """A ``<graphics>``: type, port (-1: autoport), autoport, listen address, whether it has a password, the
    websocket port; with ``compare`` also the password itself (``passwd``)."""
    listen = node.get("listen")
    lel = node.find("listen")
    if lel is not None and lel.get("address"):
        listen = lel.get("address")
    out = {
        "type": node.get("type"),
        "port": to_int(node.get("port"), -1),
        "autoport": node.get("autoport") == "yes",
        "listen": listen,
        "password": bool(node.get("passwd")),
        "websocket": to_int(node.get("websocket"), 0) or None,  # -1: a free port when it starts
    }
    if compare:
        out["passwd"] = node.get("passwd")
    return out


def video() -> ET.Element:
    node = el("video")
    sub(node, "model", type="vga")
    return node


def tablet() -> ET.Element:
    """The USB tablet that keeps the pointer in sync on a graphical console."""
    return el("input", type="tablet", bus="usb")


# the web console's VNC over websocket (saltvirt.host.vncticket): the reader of the live element, the builder
# of its password change
def vnc_websocket(root: ET.Element) -> ET.Element | None:
    """The running VM's first ``<graphics type='vnc'>`` with a websocket port libvirt gave it, or None."""
    for g in root.findall("devices/graphics"):
        if g.get("type") == "vnc" and to_int(g.get("websocket"), -1) > 0:
            return g
    return None


def graphics_password(live: ET.Element, password: str, valid_to: str) -> str:
    """``<graphics>`` for ``updateDeviceFlags``: ``live`` (as :func:`vnc_websocket` found it: libvirt refuses
    any other change of a live console) with a new ``passwd`` valid until ``valid_to`` (UTC,
    ``YYYY-MM-DDThh:mm:ss``)."""
    node = ET.fromstring(ET.tostring(live))
    node.set("passwd", password)
    node.set("passwdValidTo", valid_to)
    node.attrib.pop("connected", None)
    return ET.tostring(node, encoding="unicode")


# Salt's shapes (virt.vm_info) ---------------------------------------------------------------------------
def salt_devices(xml: str | ET.Element) -> Data:
    """NICs and graphics as Salt's ``virt.vm_info`` shapes them: ``nics``, one per ``<interface>`` with a
    MAC, ``{type, mac, model?, target?, source: {attr: value}, driver?/address?/virtualport?: {...}}``
    (the attributes of those elements, as Salt), and ``graphics``: the attributes of the first
    ``<graphics>`` as strings over Salt's defaults (``"None"``), the password left out."""
    root = read(xml)
    nics: list[Data] = []
    for iface in every(root, "devices", "interface"):
        nic: Data = {"type": iface.get("type")}
        for child in iface:
            if child.tag == "mac":
                nic["mac"] = child.get("address")
            elif child.tag == "model":
                nic["model"] = child.get("type")
            elif child.tag == "target":
                nic["target"] = child.get("dev")
            elif child.tag in ("source", "driver", "address", "virtualport"):
                nic[child.tag] = dict(child.attrib)
        nic.setdefault("source", {})
        if nic.get("mac"):
            nics.append(nic)
    out = dict.fromkeys(SALT_GRAPHICS_KEYS, "None")
    for g in every(root, "devices", "graphics")[:1]:
        out.update({k: v for k, v in g.attrib.items() if k not in SECRET_ATTRS})
    return {"nics": nics, "graphics": out}
