"""Host and domain capabilities, CPU baseline and node devices as dicts, in the shapes of Salt's virt
module (``virt.capabilities``, ``virt.domain_capabilities``, ``virt.all_capabilities``,
``virt.cpu_baseline``, ``virt.node_devices``). libvirt's XML is read with ElementTree only."""

import xml.etree.ElementTree as ET
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import libvirt, lv_errors
from saltvirt.xml.etree import attr


def _text(node, path):
    el = node.find(path)
    return el.text if el is not None else None


def _unit(value, unit):
    return f"{value} {unit}"


# host capabilities ------------------------------------------------------------------------------
def _add_machine(machines, node):
    name = node.text
    if node.get("canonical"):
        name, alias = node.get("canonical"), node.text
    else:
        alias = None
    machine = machines.setdefault(name, {"alternate_names": []})
    if node.get("maxCpus") and "maxcpus" not in machine:
        machine["maxcpus"] = int(node.get("maxCpus"))
    if alias:
        machine["alternate_names"].append(alias)


def _guest(guest):
    arch = guest.find("arch")
    out = {"os_type": _text(guest, "os_type"), "arch": {"name": arch.get("name"), "machines": {}, "domains": {}}}
    for child in arch:
        if child.tag == "wordsize":
            out["arch"]["wordsize"] = int(child.text)
        elif child.tag == "emulator":
            out["arch"]["emulator"] = child.text
        elif child.tag == "machine":
            _add_machine(out["arch"]["machines"], child)
        elif child.tag == "domain":
            dom = {"emulator": _text(child, "emulator"), "machines": {}}
            for machine in child.findall("machine"):
                _add_machine(dom["machines"], machine)
            out["arch"]["domains"][child.get("type")] = dom
    features = guest.find("features")
    if features is not None:
        out["features"] = {
            f.tag: {"toggle": f.get("toggle", "no") == "yes", "default": f.get("default", "on") == "on"}
            for f in features
        }
    return out


def _cell(cell):
    out: Data = {"id": int(cell.get("id"))}
    mem = cell.find("memory")
    if mem is not None:
        out["memory"] = _unit(mem.text, mem.get("unit", "KiB"))
    pages = [
        {"size": _unit(p.get("size"), p.get("unit", "KiB")), "available": int(p.text)} for p in cell.findall("pages")
    ]
    if pages:
        out["pages"] = pages
    distances = {int(s.get("id")): int(s.get("value")) for s in cell.findall("distances/sibling")}
    if distances:
        out["distances"] = distances
    cpus = []
    for node in cell.findall("cpus/cpu"):
        cpu: Data = {"id": int(node.get("id"))}
        for key in ("socket_id", "core_id"):
            if node.get(key):
                cpu[key] = int(node.get(key))
        if node.get("siblings"):
            cpu["siblings"] = node.get("siblings")
        cpus.append(cpu)
    if cpus:
        out["cpus"] = cpus
    return out


def _bank(bank):
    out = {
        "id": validate.int_or_none(bank.get("id")),
        "level": validate.int_or_none(bank.get("level")),
        "type": bank.get("type"),
        "size": _unit(bank.get("size"), bank.get("unit")),
        "cpus": bank.get("cpus"),
    }
    controls = []
    for ctl in bank.findall("control"):
        entry = {
            "granularity": _unit(ctl.get("granularity"), ctl.get("unit")),
            "type": ctl.get("type"),
            "maxAllocs": validate.int_or_none(ctl.get("maxAllocs")),
        }
        if ctl.get("min"):
            entry["min"] = _unit(ctl.get("min"), ctl.get("unit"))
        controls.append(entry)
    if controls:
        out["controls"] = controls
    return out


def _host(host):
    out = {}
    for child in host:
        if child.tag == "uuid":
            out["uuid"] = child.text
        elif child.tag == "cpu":
            cpu = {
                "arch": _text(child, "arch"),
                "model": _text(child, "model"),
                "vendor": _text(child, "vendor"),
                "features": [f.get("name") for f in child.findall("feature")],
                "pages": [{"size": _unit(p.get("size"), p.get("unit", "KiB"))} for p in child.findall("pages")],
            }
            if child.find("microcode") is not None:
                cpu["microcode"] = child.find("microcode").get("version")
            topo = child.find("topology")
            if topo is not None:
                cpu.update({k: validate.int_or_none(topo.get(k)) for k in ("sockets", "cores", "threads")})
            out["cpu"] = cpu
        elif child.tag == "power_management":
            out["power_management"] = [n.tag for n in child]
        elif child.tag == "migration_features":
            out["migration"] = {
                "live": child.find("live") is not None,
                "transports": [n.text for n in child.findall("uri_transports/uri_transport")],
            }
        elif child.tag == "topology":
            out["topology"] = {"cells": [_cell(c) for c in child.findall("cells/cell")]}
        elif child.tag == "cache":
            out["cache"] = {"banks": [_bank(b) for b in child.findall("bank")]}
    out["security"] = [
        {
            "model": _text(sec, "model"),
            "doi": _text(sec, "doi"),
            "baselabels": [{"type": b.get("type"), "label": b.text} for b in sec.findall("baselabel")],
        }
        for sec in host.findall("secmodel")
    ]
    return out


def parse_capabilities(xml: str) -> Data:
    root = ET.fromstring(xml)
    return {"host": _host(root.find("host")), "guests": [_guest(g) for g in root.findall("guest")]}


def capabilities(conn: Conn) -> Data:
    with lv_errors("read the host capabilities"):
        return parse_capabilities(conn.getCapabilities())


# domain capabilities ----------------------------------------------------------------------------
def _enum(node):
    return {e.get("name"): [v.text for v in e.findall("value")] for e in node.findall("enum")}


def _supported(node):
    return node is not None and node.get("supported") == "yes"


def _cpu_modes(node):
    out: Data = {}
    for mode in node.findall("mode"):
        name = mode.get("name")
        if not _supported(mode):
            out[name] = False
            continue
        if name == "host-passthrough":
            out[name] = True
        elif name == "host-model":
            model = mode.find("model")
            entry: Data = {"name": model.text if model is not None else None}
            if model is not None and model.get("fallback"):
                entry["fallback"] = model.get("fallback")
            if mode.find("vendor") is not None:
                entry["vendor"] = mode.find("vendor").text
            entry["features"] = {f.get("name"): f.get("policy") for f in mode.findall("feature")}
            out[name] = entry
        else:
            out[name] = {"models": {m.text: m.get("usable") for m in mode.findall("model")}}
            out[name].update(_enum(mode))
    return out


def parse_domain_capabilities(xml: str) -> Data:
    root = ET.fromstring(xml)
    out = {
        "emulator": _text(root, "path"),
        "domain": _text(root, "domain"),
        "machine": _text(root, "machine"),
        "arch": _text(root, "arch"),
    }
    vcpu = root.find("vcpu")
    if vcpu is not None:
        out["max_vcpus"] = validate.int_or_none(vcpu.get("max"))
    iothreads = root.find("iothreads")
    if iothreads is not None:
        out["iothreads"] = _supported(iothreads)
    os_el = root.find("os")
    if os_el is not None:
        loader = os_el.find("loader")
        entry = {}
        if loader is not None and _supported(loader):
            entry = {"loader": {"values": [v.text for v in loader.findall("value")]}}
            entry["loader"].update(_enum(loader))
        entry.update(_enum(os_el))
        out["os"] = entry
    if root.find("cpu") is not None:
        out["cpu"] = _cpu_modes(root.find("cpu"))
    devices = root.find("devices")
    if devices is not None:
        out["devices"] = {d.tag: _enum(d) for d in devices if _supported(d)}
    features = root.find("features")
    if features is not None:
        out["features"] = {}
        for feat in features:
            if not _supported(feat):
                continue
            enums = _enum(feat)
            out["features"][feat.tag] = enums or True
    return out


def domain_capabilities(
    conn: Conn,
    emulator: str | None = None,
    arch: str | None = None,
    machine: str | None = None,
    domain: str | None = None,
) -> Data:
    with lv_errors("read the domain capabilities"):
        return parse_domain_capabilities(conn.getDomainCapabilities(emulator, arch, machine, domain, 0))


def all_capabilities(conn: Conn) -> Data:
    """Host capabilities plus the domain capabilities of every (arch, domain type) the host offers."""
    host = capabilities(conn)
    domains = []
    for guest in host["guests"]:
        for dtype, dom in guest["arch"]["domains"].items():
            emulator = dom.get("emulator") or guest["arch"].get("emulator")
            try:
                domains.append(domain_capabilities(conn, emulator, guest["arch"]["name"], None, dtype))
            except Exception as exc:  # noqa: BLE001 - a domain type libvirt cannot describe is reported, not fatal
                domains.append({"arch": guest["arch"]["name"], "domain": dtype, "error": str(exc)})
    return {"host": host, "domains": domains}


# cpu baseline ------------------------------------------------------------------------------------
def cpu_baseline(conn: Conn, full: bool = False, migratable: bool = False, out: str = "libvirt") -> Data | str:
    """The CPU model every guest can use on this host (Salt's ``virt.cpu_baseline``): libvirt's XML
    (``out=libvirt``) or ``{model, vendor, features: [{name, policy}]}`` (``out=salt``)."""
    if out not in ("libvirt", "salt"):
        raise SaltInvocationError(f"virt.cpu_baseline: out must be libvirt or salt, got {out!r}")
    caps = ET.fromstring(conn.getCapabilities())
    cpu = caps.find("host/cpu")
    if cpu is None:
        raise SaltInvocationError("this host's capabilities describe no CPU")
    flags = 0
    if full:
        flags |= getattr(libvirt, "VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES", 0)
    if migratable:
        flags |= getattr(libvirt, "VIR_CONNECT_BASELINE_CPU_MIGRATABLE", 0)
    with lv_errors("compute the CPU baseline"):
        xml = conn.baselineCPU([ET.tostring(cpu, encoding="unicode")], flags)
    if out == "libvirt":
        return xml
    root = ET.fromstring(xml)
    return {
        "model": _text(root, "model"),
        "vendor": _text(root, "vendor"),
        "features": [{"name": f.get("name"), "policy": f.get("policy")} for f in root.findall("feature")],
    }


# node devices -------------------------------------------------------------------------------------
def _pci_address(cap):
    parts = [validate.int_or_none(cap.findtext(k)) or 0 for k in ("domain", "bus", "slot", "function")]
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*parts)


def parse_node_device(xml: str) -> Data:
    """One node device in Salt's shape: ``{name, caps, ...}`` with the PCI/USB/net/mdev specifics."""
    root = ET.fromstring(xml)
    cap = root.find("capability")
    ctype = cap.get("type") if cap is not None else None
    out = {"name": _text(root, "name"), "caps": ctype}
    if root.find("parent") is not None:
        out["parent"] = root.findtext("parent")
    if cap is None:
        return out
    if ctype == "pci":
        out["address"] = _pci_address(cap)
        vendor, product = cap.find("vendor"), cap.find("product")
        if vendor is not None:
            out.update(vendor_id=vendor.get("id"), vendor=vendor.text)
        if product is not None:
            out.update(product_id=product.get("id"), product=product.text)
        pf = cap.find("capability[@type='phys_function']/address")
        if pf is not None:
            out["physical_function"] = "{:04x}:{:02x}:{:02x}.{:x}".format(
                *[int(pf.get(k) or "0", 16) for k in ("domain", "bus", "slot", "function")]
            )
        vfs = cap.findall("capability[@type='virt_functions']/address")
        if vfs:
            out["virtual_functions"] = [
                {
                    "address": "{:04x}:{:02x}:{:02x}.{:x}".format(
                        *[int(v.get(k) or "0", 16) for k in ("domain", "bus", "slot", "function")]
                    )
                }
                for v in vfs
            ]
    elif ctype == "usb_device":
        out["caps"] = "usb"
        out["bus"] = cap.findtext("bus")
        out["device"] = cap.findtext("device")
        for key in ("vendor", "product"):
            el = cap.find(key)
            if el is not None:
                out[f"{key}_id"], out[key] = el.get("id"), el.text
    elif ctype == "net":
        out["interface"] = cap.findtext("interface")
        out["address"] = cap.findtext("address")
        link = cap.find("link")
        if link is not None:
            out["state"] = link.get("state")
            if link.get("speed"):
                out["speed"] = validate.int_or_none(link.get("speed"))
    elif ctype == "mdev":
        out["type"] = attr(cap, "type", "id")
        out["uuid"] = cap.findtext("uuid")
    return out


def node_devices(conn: Conn) -> list[Data]:
    """The host's PCI, USB, network and mdev devices (what ``host_devices`` can name)."""
    flags = 0
    for flag in ("PCI_DEV", "USB_DEV", "NET", "MDEV"):
        flags |= getattr(libvirt, f"VIR_CONNECT_LIST_NODE_DEVICES_CAP_{flag}", 0)
    with lv_errors("list the host's devices"):
        devices = conn.listAllDevices(flags)
        return [parse_node_device(d.XMLDesc(0)) for d in devices]


def _host_device(conn, name):
    """One node device as the source of a ``<hostdev>`` (saltvirt.xml.domain.devices.hostdev)."""
    with lv_errors(f"read host device {name!r}"):
        root = ET.fromstring(conn.nodeDeviceLookupByName(name).XMLDesc(0))
    cap = root.find("capability")
    ctype = cap.get("type") if cap is not None else None
    if cap is not None and ctype == "pci":
        return {"name": name, "type": "pci", "address": _pci_address(cap)}
    if cap is not None and ctype == "usb_device" and cap.find("vendor") is not None and cap.find("product") is not None:
        return {
            "name": name,
            "type": "usb",
            "vendor": attr(cap, "vendor", "id"),
            "product": attr(cap, "product", "id"),
            "bus": validate.int_or_none(cap.findtext("bus")),
            "device": validate.int_or_none(cap.findtext("device")),
        }
    raise SaltInvocationError(
        f"host_devices: {name} is a {ctype or 'unknown'} device; only PCI and USB devices can be passed through "
        "(mdev devices are not supported by salt-virt yet)"
    )


def host_devices(conn: Conn, names: Any) -> list[Data]:
    """Salt's ``host_devices`` (node device names) -> what ``<hostdev>`` needs of each (PCI address, USB
    vendor/product/bus/device); an unknown name is refused with the names this hypervisor has."""
    if not names:
        return []
    with lv_errors("list the host's devices"):
        known = {d.name() for d in conn.listAllDevices(0)}
    out = []
    for name in names:
        if name not in known:
            available = sorted(d["name"] for d in node_devices(conn) if d["caps"] in ("pci", "usb"))
            raise SaltInvocationError(
                f"host_devices: no device {name!r} on this hypervisor (virt.node_devices lists them; PCI and USB "
                f"here: {', '.join(available) or 'none'})"
            )
        out.append(_host_device(conn, name))
    return out
