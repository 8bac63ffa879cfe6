"""libvirt domain XML, continued: reading and replacing the feature elements of a definition (firmware,
boot order, extra chardevs, vTPM, CPU and memory tuning, NUMA, clock, host devices) to compare them with
a spec and to change them (``saltvirt.vm.converge``).

Part of :mod:`saltvirt.xml.domxml` (import it from there: ``domxml.feature_facts``, ``domxml.FEATURES``,
``domxml.replace_features``), which builds these elements; ElementTree only.
"""

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.xml.etree import kib as _kib
from saltvirt.xml.etree import mib as _mib
from saltvirt.xml.etree import need, read
from saltvirt.xml.etree import sub as _sub
from saltvirt.xml.etree import to_int as _int

CPUTUNE_SCALARS: tuple[str, ...] = ("shares", "global_period", "global_quota", "period", "quota")
CPUTUNE_SCALARS += ("emulator_period", "emulator_quota", "iothread_period", "iothread_quota")
KERNEL_TAGS = ("kernel", "initrd", "cmdline")  # direct kernel boot (Salt's boot:kernel/initrd/cmdline)


# firmware, boot order, extra chardevs, vTPM: read to compare, replaced in a definition ------------------
FEATURES = (
    "firmware",
    "kernel_boot",
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
            port=validate.int_or_none(src.get("service")),
            protocol=proto.get("type") if proto is not None else "raw",
        )
    return out


def _port(el):
    target = el.find("target")
    return _int(target.get("port"), 0) if target is not None else 0


def feature_facts(xml: str | ET.Element) -> Data:
    """The firmware, boot order, on_reboot action, extra serial ports (port >= 1), virtio consoles and
    vTPM of domain XML, normalized so what libvirt reads back equals what :func:`build` wrote."""
    root = read(xml)
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
        "kernel_boot": {tag: os_el.findtext(tag) or None for tag in KERNEL_TAGS},
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
    out: Data = {}
    if el.find("hugepages") is not None:
        out["hugepages"] = [
            {"size": _kib(p, "size"), **({"nodeset": p.get("nodeset")} if p.get("nodeset") else {})}
            for p in el.findall("hugepages/page")
        ]
    for key in ("nosharepages", "locked", "discard"):
        if el.find(key) is not None:
            out[key] = True
    for key, attr in (("source", "type"), ("access", "mode"), ("allocation", "mode")):
        if el.find(key) is not None:
            out[key] = el.find(key).get(attr)
    return out


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
    out: Data = {k: _int(el.findtext(k)) for k in CPUTUNE_SCALARS if el.find(k) is not None}
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


def replace_features(xml: str, new_xml: str, fields: Iterable[str]) -> str:
    """Domain XML ``xml`` with the elements of ``fields`` (of :data:`FEATURES`) taken from ``new_xml``
    (what :func:`build` writes for the desired spec); everything else is kept as it is."""
    root, new = ET.fromstring(xml), ET.fromstring(new_xml)
    _replace_os(root, new, fields)
    if "vcpu" in fields:  # placement/cpuset (and the count, as the cpu setters left it)
        vcpu = need(root, "vcpu")
        vcpu.attrib.clear()
        vcpu.attrib.update(need(new, "vcpu").attrib)
    tags: tuple[tuple[str, str], ...] = (
        ("clock", "clock"),
        ("cpu_model", "cpu"),
        ("memtune", "memtune"),
        ("numatune", "numatune"),
    )
    tags += (("cputune", "cputune"), ("max_mem", "maxMemory"), ("memory_backing", "memoryBacking"))
    for key, tag in tags:
        if key in fields:
            for el in root.findall(tag):
                root.remove(el)
            root.extend(new.findall(tag))
    features = root.find("features")
    if "hypervisor_features" in fields and features is not None:
        for el in features.findall("kvm"):
            features.remove(el)
        features.extend(new.findall("features/kvm"))
    if "stop_on_reboot" in fields:
        on_reboot = root.find("on_reboot")
        if on_reboot is None:
            on_reboot = _sub(root, "on_reboot")
        on_reboot.text = new.findtext("on_reboot")
    devices, new_devices = need(root, "devices"), need(new, "devices")
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


def _replace_os(root, new, fields):
    """The ``<os>`` parts of ``fields``: firmware, direct kernel boot, boot order."""
    os_el, new_os = root.find("os"), new.find("os")
    if "firmware" in fields:
        _replace_firmware(root, new)
    if "kernel_boot" in fields:
        for el in [el for el in os_el if el.tag in KERNEL_TAGS]:
            os_el.remove(el)
        at = next((i for i, el in enumerate(os_el) if el.tag == "boot"), len(os_el))
        for i, el in enumerate(el for el in new_os if el.tag in KERNEL_TAGS):
            os_el.insert(at + i, el)
    if "boot_dev" in fields:
        for el in os_el.findall("boot"):
            os_el.remove(el)
        os_el.extend(new_os.findall("boot"))


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
