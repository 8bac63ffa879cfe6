"""How a domain boots and runs: ``<os>`` (firmware, direct kernel boot, boot order), ``<features>``,
``<clock>`` and the lifecycle actions (``<on_poweroff>``, ``<on_reboot>``, ``<on_crash>``); each element's builder
beside its reader, the reader normalized so what libvirt reads back equals what the builder wrote."""

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from saltvirt.base.salttypes import Data
from saltvirt.model.vmspec import VMSpec
from saltvirt.xml.domain import elements
from saltvirt.xml.etree import el, first, need, read, sub

KERNEL_TAGS = ("kernel", "initrd", "cmdline")  # direct kernel boot (Salt's boot:kernel/initrd/cmdline)
ACTIONS = ("on_poweroff", "on_reboot", "on_crash")
ELEMENTS: list[elements.Element] = []  # the domain's elements of their own here (elements.of below)


def build_boot(spec: VMSpec) -> list[ET.Element]:
    """This group's elements of a new domain (``definition.build`` puts them in libvirt's order)."""
    return [os_config(spec), features(spec), *elements.build_all(ELEMENTS, spec.elements), *actions(spec)]


def facts(root: ET.Element) -> Data:
    """``boot``: the direct kernel boot's kernel, initrd and cmdline that are there, as ``parse`` reports it."""
    boot = {}
    os_el = root.find("os")
    if os_el is not None:
        for key in KERNEL_TAGS:
            node = os_el.find(key)
            if node is not None:
                boot[key] = node.text
    return {"boot": boot}


def feature_facts(root: ET.Element) -> Data:
    """This group's part of ``definition.feature_facts``: firmware, kernel boot, boot order, on_reboot, clock,
    KVM hints."""
    os_el = root.find("os")
    if os_el is None:
        os_el = ET.Element("os")
    return {
        "firmware": firmware_facts(os_el),
        "kernel_boot": {tag: os_el.findtext(tag) or None for tag in KERNEL_TAGS},
        "boot_dev": [b.get("dev") for b in os_el.findall("boot")],
        "stop_on_reboot": root.findtext("on_reboot") == "destroy",
        "hypervisor_features": features_facts(root.find("features")),
        **elements.read_all(ELEMENTS, root),
    }


def replace(root: ET.Element, new: ET.Element, fields: Iterable[str]) -> None:
    """The elements of ``fields`` in ``root`` taken from ``new`` (the desired definition); ValueError when the
    firmware asked for needs another machine type."""
    _replace_os(root, new, fields)
    elements.replace_all(ELEMENTS, root, new, fields)
    feats = root.find("features")
    if "hypervisor_features" in fields and feats is not None:
        for node in feats.findall("kvm"):
            feats.remove(node)
        feats.extend(new.findall("features/kvm"))
    if "stop_on_reboot" in fields:
        on_reboot = root.find("on_reboot")
        if on_reboot is None:
            on_reboot = sub(root, "on_reboot")
        on_reboot.text = new.findtext("on_reboot")


def os_config(spec: VMSpec) -> ET.Element:
    """``<os>``: architecture, machine, firmware (BIOS, UEFI autoselected or a given OVMF), direct
    kernel boot or the boot order. Secure boot needs q35 (OVMF's SMM build)."""
    b = spec.boot
    secure = bool(b and b.secure_boot)
    node = el("os", firmware="efi" if b and b.efi else None)
    sub(node, "type", "hvm", arch=spec.arch, machine="q35" if secure else None)
    if b and b.efi and secure:
        fw = sub(node, "firmware")
        sub(fw, "feature", enabled="yes", name="enrolled-keys")
        sub(fw, "feature", enabled="yes", name="secure-boot")
    if b and b.loader:
        sub(node, "loader", b.loader, readonly="yes", secure="yes" if secure else None, type="pflash")
        if b.nvram:
            sub(node, "nvram", template=b.nvram)
    if b and b.kernel:
        sub(node, "kernel", b.kernel)
        if b.initrd:
            sub(node, "initrd", b.initrd)
        if b.cmdline:
            sub(node, "cmdline", b.cmdline)
    # with a direct kernel boot only the order given (as Salt: for after the kernel is taken away)
    for dev in spec.boot_dev or ([] if b and b.kernel else ["hd"]):
        sub(node, "boot", dev=dev)
    return node


def firmware_facts(os_el: ET.Element) -> Data:
    """The firmware of ``<os>``: UEFI (autoselected or a given loader), its loader and variables template when
    given, secure boot."""
    loader_el = os_el.find("loader")
    nvram = os_el.find("nvram")
    autoselected = os_el.get("firmware") == "efi"
    fw_secure = os_el.find("firmware/feature[@name='secure-boot']")
    secure = (fw_secure is not None and fw_secure.get("enabled") == "yes") or (
        loader_el is not None and loader_el.get("secure") == "yes"
    )
    own_loader = loader_el is not None and not autoselected and (loader_el.text or "").strip()
    return {
        "efi": autoselected or bool(own_loader),
        "loader": own_loader or None,
        "nvram": nvram.get("template") if own_loader and nvram is not None else None,
        "secure_boot": secure,
    }


def _replace_os(root, new, fields):
    """The ``<os>`` parts of ``fields``: firmware, direct kernel boot, boot order."""
    if "firmware" in fields:
        _replace_firmware(root, new)
    if "kernel_boot" in fields:
        os_el, new_os = need(root, "os"), need(new, "os")
        for node in [node for node in os_el if node.tag in KERNEL_TAGS]:
            os_el.remove(node)
        at = next((i for i, node in enumerate(os_el) if node.tag == "boot"), len(os_el))
        for i, node in enumerate(node for node in new_os if node.tag in KERNEL_TAGS):
            os_el.insert(at + i, node)
    if "boot_dev" in fields:
        os_el, new_os = need(root, "os"), need(new, "os")
        for node in os_el.findall("boot"):
            os_el.remove(node)
        os_el.extend(new_os.findall("boot"))


def _replace_firmware(root, new):
    """``<os>``'s firmware attribute, ``<firmware>``, ``<loader>``, ``<nvram>`` and ``<features><smm>``
    from ``new``; ValueError when that needs another machine type (secure boot: q35)."""
    os_el, new_os = need(root, "os"), need(new, "os")
    old_machine = need(os_el, "type").get("machine") or ""
    if need(new_os, "type").get("machine") == "q35" and "q35" not in old_machine:
        raise ValueError(f"secure boot needs machine type q35 and this VM is {old_machine or 'i440fx'}")
    os_el.attrib.pop("firmware", None)
    if firmware := new_os.get("firmware"):
        os_el.set("firmware", firmware)
    for tag in ("firmware", "loader", "nvram"):
        for node in os_el.findall(tag):
            os_el.remove(node)
    for i, tag in enumerate(("firmware", "loader", "nvram")):
        for node in new_os.findall(tag):
            os_el.insert(1 + i, node)
    feats = root.find("features")
    if feats is None:
        feats = sub(root, "features")
    for node in feats.findall("smm"):
        feats.remove(node)
    feats.extend(new.findall("features/smm"))


def features(spec: VMSpec) -> ET.Element:
    """``<features>``: ACPI, APIC, SMM for secure boot, Salt's KVM hints, and TCG's translation cache."""
    node = el("features")
    sub(node, "acpi")
    sub(node, "apic")
    if spec.boot and spec.boot.secure_boot:
        sub(node, "smm", state="on")
    if spec.hypervisor_features:
        kvm = sub(node, "kvm")
        for name, on in sorted(spec.hypervisor_features.items()):
            sub(kvm, name.removeprefix("kvm-"), state="on" if on else "off")
    if spec.tb_cache_mib and spec.vtype == "qemu":  # libvirt >= 8.0: QEMU's -accel tcg,tb-size
        sub(sub(node, "tcg"), "tb-cache", spec.tb_cache_mib, unit="MiB")
    return node


def features_facts(node: ET.Element | None) -> Data:
    """The KVM hints of ``<features>`` as Salt names them (``{kvm-<hint>: on}``); the rest follows the firmware."""
    return {f"kvm-{hint.tag}": hint.get("state") == "on" for hint in ([] if node is None else node.findall("kvm/*"))}


def clock_facts(node: ET.Element | None) -> Data | None:
    """``<clock>``'s attributes and timers; None for libvirt's default (UTC, no timers: what it reads back)."""
    if node is None or (dict(node.attrib) == {"offset": "utc"} and not node.findall("timer")):
        return None
    return {**node.attrib, "timers": [dict(t.attrib) for t in node.findall("timer")]}


@elements.of(ELEMENTS, "clock", "clock", read=clock_facts)
def clock(c: Data) -> ET.Element:
    """``<clock>`` (checks.clock) with its ``<timer>`` elements."""
    node = el("clock", **{k: v for k, v in c.items() if k != "timers"})
    for t in c["timers"]:
        sub(node, "timer", **t)
    return node


def actions(spec: VMSpec) -> list[ET.Element]:
    """The lifecycle actions: a VM powered off or crashed is stopped, a reboot restarts it unless
    ``stop_on_reboot``."""
    on_reboot = "destroy" if spec.stop_on_reboot else "restart"
    return [el("on_poweroff", "destroy"), el("on_reboot", on_reboot), el("on_crash", "destroy")]


def loader(xml: str | ET.Element) -> Data:
    """``<os><loader>`` as Salt's ``virt.get_loader``: ``{path, <attributes>}``, ``{path: "None"}`` if none."""
    out = {"path": "None"}
    node = first(read(xml), "os", "loader")
    if node is not None:
        out["path"] = (node.text or "").strip() or "None"
        out.update(node.attrib)
    return out


def salt_facts(xml: str | ET.Element) -> Data:
    """The facts Salt's ``virt.vm_info`` adds: ``loader`` and the ``on_poweroff``/``on_reboot``/``on_crash`` actions."""
    root = read(xml)
    out: Data = {"loader": loader(root)}
    for key in ACTIONS:
        out[key] = root.findtext(key)
    return out
