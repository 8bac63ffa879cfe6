"""Changing an existing domain definition with the element builders of ``saltvirt.xml.domain`` (the ones a new
VM's definition is built with): devices added, changed and removed (``saltvirt.vm.converge``), disks moved
(migration), CD-ROMs ejected and definitions restored from a backup."""

import os
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable, Mapping

from saltvirt.model.vmspec import Disk, Graphics, Nic
from saltvirt.xml.domain import metadata
from saltvirt.xml.domain.devices import disk, graphics, interface, tablet, video
from saltvirt.xml.etree import attr, need


def _mac_of(el):
    mac = el.find("mac")
    return (mac.get("address") or "").lower() if mac is not None else ""


def interface_by_mac(devices: str | ET.Element | None, mac: str) -> ET.Element | None:
    """The ``<interface>`` with ``mac`` (lower case) in a domain's XML (str) or its ``<devices>`` element."""
    if isinstance(devices, str):
        devices = need(ET.fromstring(devices), "devices")
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
    """Domain XML with devices changed by the builders of ``saltvirt.xml.domain.devices``. Returns ``(xml, kept)``:
    ``kept`` are the MACs (lower case) of the interfaces already there, so the ones libvirt completes can be told
    apart.

    ``graphics_spec``: False keeps graphics as they are, None removes them, a Graphics replaces them.
    ``change_nics``: Nics whose MAC names the interface to change in place (its PCI address kept)."""
    root = ET.fromstring(xml)
    devices = need(root, "devices")
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
        need(root, "name").text = new_name
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
    metadata.forget_minion(root)
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
    devices = need(ET.fromstring(xml), "devices")
    return [el for el in devices.findall("interface") if el.find("mac") is not None and _mac_of(el) not in kept_macs]


def disks_by_target(xml: str) -> dict[str, ET.Element]:
    """``{target dev: <disk> element}`` of a domain's XML."""
    devices = need(ET.fromstring(xml), "devices")
    return {dev: el for el in devices.findall("disk") if (dev := attr(el, "target", "dev")) is not None}
