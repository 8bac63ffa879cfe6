"""Bring an existing VM to its desired :class:`saltvirt.spec.VMSpec`: the diff, and applying it.

Used by ``virt.update`` and so by the ``virt.running`` / ``virt.defined`` states. What can change live
(vCPUs up to the boot maximum, memory up to the maximum, NICs and blank disks by hotplug) is applied
live *and* to the persistent definition; the rest is written to the definition and reported as
needing a restart. Disks are never removed: a disk the spec no longer lists is reported, not touched.
"""
import os
import xml.etree.ElementTree as ET

from salt.exceptions import SaltInvocationError

from saltvirt import domxml, images, lifecycle
from saltvirt import spec as vmspec
from saltvirt.conn import get_domain, libvirt, lv_errors


def _nic_key(nic):
    return (nic["type"], nic["source"], nic["model"])


def diff(desired, facts):
    """{field: {'old', 'new'}} for everything that differs between ``desired`` and the domain."""
    changes = {}
    if desired.cpu != facts["cpu"]:
        changes["cpu"] = {"old": facts["cpu"], "new": desired.cpu}
    if desired.mem != facts["mem"]:
        changes["mem"] = {"old": facts["mem"], "new": desired.mem}
    want_gfx = desired.graphics.type if desired.graphics else None
    have_gfx = facts["graphics"][0]["type"] if facts["graphics"] else None
    if want_gfx != have_gfx:
        changes["graphics"] = {"old": have_gfx, "new": want_gfx}
    want = [(n.type, n.source, n.model) for n in desired.nics]
    have = [_nic_key(n) for n in facts["nics"]]
    added, removed = list(want), []
    for key in have:
        if key in added:
            added.remove(key)
        else:
            removed.append(key)
    if added or removed:
        changes["nics"] = {
            "added": [dict(zip(("type", "source", "model"), k)) for k in added],
            "removed": [dict(zip(("type", "source", "model"), k)) for k in removed],
        }
    have_targets = {d["target"]: d for d in facts["disks"]}
    new_disks = [d for d in desired.disks if d.target not in have_targets]
    unlisted = sorted(t for t in have_targets if t not in {d.target for d in desired.disks})
    if new_disks:
        for disk in new_disks:
            if disk.image:
                raise SaltInvocationError(
                    f"disk {disk.name} ({disk.target}) would be cloned from an image: that only happens when "
                    "the VM is created; add blank disks (size=) to an existing VM"
                )
        changes["disks"] = {"added": [{"name": d.name, "target": d.target, "size": d.size, "format": d.format, "path": d.path} for d in new_disks]}
    if unlisted:
        changes.setdefault("disks", {})["not_in_spec"] = unlisted  # reported, never removed
    return changes


def _nic_xml(nic):
    el = ET.Element("interface", type=nic["type"])
    if nic["type"] == "direct":
        ET.SubElement(el, "source", dev=nic["source"], mode="bridge")
    else:
        ET.SubElement(el, "source", {nic["type"]: nic["source"]})
    ET.SubElement(el, "model", type=nic["model"])
    return ET.tostring(el, encoding="unicode")


def _disk_xml(disk):
    el = ET.Element("disk", type="file", device="disk")
    ET.SubElement(el, "driver", name="qemu", type=disk["format"])
    ET.SubElement(el, "source", file=disk["path"])
    ET.SubElement(el, "target", dev=disk["target"], bus="virtio" if disk["target"].startswith("vd") else "scsi")
    return ET.tostring(el, encoding="unicode")


def _find_nic_xml(dom, key):
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    for iface in root.findall("devices/interface"):
        facts = domxml.parse(f"<domain><devices>{ET.tostring(iface, encoding='unicode')}</devices></domain>")["nics"][0]
        if _nic_key(facts) == key:
            return ET.tostring(iface, encoding="unicode")
    return None


def _device(dom, xml, attach, what, report):
    live = dom.isActive()
    flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    with lv_errors(what):
        (dom.attachDeviceFlags if attach else dom.detachDeviceFlags)(xml, flags)
    if live:
        try:
            (dom.attachDeviceFlags if attach else dom.detachDeviceFlags)(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            report["live"].append(what)
        except libvirt.libvirtError:
            report["restart"].append(what)


def _set_graphics(dom, graphics):
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    devices = root.find("devices")
    for tag in ("graphics", "video"):
        for el in devices.findall(tag):
            devices.remove(el)
    if graphics:
        g = ET.SubElement(devices, "graphics", type=graphics.type, port=str(graphics.port), autoport="yes" if graphics.port == -1 else "no", listen=graphics.listen)
        if graphics.password:
            g.set("passwd", graphics.password)
        ET.SubElement(g, "listen", type="address", address=graphics.listen)
        ET.SubElement(ET.SubElement(devices, "video"), "model", type="vga")
    with lv_errors(f"redefine {root.findtext('name')} with new graphics"):
        dom.connect().defineXML(ET.tostring(root, encoding="unicode"))


def apply(conn, dom, desired, changes):
    """Apply ``changes`` (from :func:`diff`); returns {'live': [...], 'restart': [...]} descriptions."""
    name = dom.name()
    report = {"live": [], "restart": []}
    running = bool(dom.isActive())
    if "cpu" in changes:
        ret = lifecycle.setvcpus(conn, name, desired.cpu)
        if running:
            report["restart" if ret["restart_needed"] else "live"].append(f"cpu {desired.cpu}")
    if "mem" in changes:
        ret = lifecycle.setmem(conn, name, desired.mem)
        if running:
            report["restart" if ret["restart_needed"] else "live"].append(f"mem {desired.mem} MiB")
    if "graphics" in changes:
        _set_graphics(dom, desired.graphics)
        dom = conn.lookupByName(name)
        if running:
            report["restart"].append(f"graphics {changes['graphics']['new']}")
    for nic in changes.get("nics", {}).get("removed", []):
        xml = _find_nic_xml(dom, _nic_key(nic))
        if xml:
            _device(dom, xml, False, f"remove NIC on {nic['source']}", report)
    for nic in changes.get("nics", {}).get("added", []):
        _device(dom, _nic_xml(nic), True, f"add NIC on {nic['source']}", report)
    for disk in changes.get("disks", {}).get("added", []):
        if not os.path.exists(disk["path"]):
            images.create_disk(disk["path"], disk["size"], fmt=disk["format"])
            images.record_owned(desired.vm_dir, name, [disk["path"]], dom.UUIDString())
        _device(dom, _disk_xml(disk), True, f"add disk {disk['target']}", report)
    return report


def update(conn, name, images_dir, profiles, test=False, cpu=None, mem=None, **spec_args):
    """``virt.update``: diff the VM against the spec built from ``spec_args`` and (unless ``test``)
    apply it. cpu/mem default to the VM's current values."""
    dom = get_domain(conn, name)
    facts = domxml.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    desired = vmspec.build(
        name,
        cpu or facts["cpu"],
        mem or facts["mem"],
        vtype=facts["type"],
        images_dir=images_dir,
        profiles=profiles,
        **spec_args,
    )
    changes = diff(desired, facts)
    ret = {"name": name, "changes": changes, "applied": {"live": [], "restart": []}}
    actionable = {k: v for k, v in changes.items() if k != "disks" or v.get("added")}
    if actionable and not test:
        ret["applied"] = apply(conn, dom, desired, actionable)
    return ret
