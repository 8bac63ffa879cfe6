"""salt-virt's own ``<metadata>`` of a domain: the anti-affinity group, the minion key ``virt.init`` seeded, the
owner, the image the VM came from, the HA flag. Built by :func:`build`, read by :func:`facts`."""

import copy
import xml.etree.ElementTree as ET

from saltvirt.base.salttypes import Data
from saltvirt.model.vmspec import VMSpec
from saltvirt.xml.etree import every, first, read, sub

METADATA_NS = "https://github.com/salt-virt/salt-virt/metadata/1"
VM = f"{{{METADATA_NS}}}vm"  # salt-virt's element in a domain's <metadata>
HA_ON = "true"  # the text of <saltvirt:ha> (no element: not HA)
ET.register_namespace("saltvirt", METADATA_NS)


def build_metadata(spec: VMSpec) -> list[ET.Element]:
    """``<metadata>`` with salt-virt's ``<vm>`` (none when the spec records nothing), read back by :func:`facts`."""
    if not (spec.group or spec.minion_key or spec.owner or spec.image_origin or spec.ha):
        return []
    metadata = ET.Element("metadata")
    meta = sub(metadata, VM)
    if spec.group:
        sub(meta, f"{{{METADATA_NS}}}group", spec.group)
    if spec.minion_key:
        key = spec.minion_key
        sub(meta, f"{{{METADATA_NS}}}minion", id=key["minion_id"], key_sha256=key["fingerprint"])
    if spec.owner:
        sub(meta, f"{{{METADATA_NS}}}owner", **spec.owner)
    if spec.image_origin:
        sub(meta, f"{{{METADATA_NS}}}image", spec.image_origin)
    if spec.ha:
        sub(meta, f"{{{METADATA_NS}}}ha", HA_ON)
    return [metadata]


def facts(root: ET.Element) -> Data:
    """What :func:`build` recorded: ``group``, ``minion``, ``owner``, ``image``, ``ha``."""
    return {
        "group": _text(root, "group"),
        "minion": minion(root),
        "owner": owner(root),
        "image": _text(root, "image") or None,  # what virt.init recorded (a catalog name or a source), or None
        "ha": _text(root, "ha") == HA_ON,  # automatic HA restarts it (saltvirt.fleet.ha)
    }


def _text(root, tag):
    """The text of salt-virt's ``<metadata><sv:vm><sv:{tag}>`` ("" when empty), None without one."""
    el = first(root, "metadata", VM, f"{{{METADATA_NS}}}{tag}")
    return None if el is None else el.text or ""


def owner(root: ET.Element) -> dict | None:
    """``{tenant, creator}`` salt-run virt.init recorded in the domain's <metadata>, or None."""
    el = first(root, "metadata", VM, f"{{{METADATA_NS}}}owner")
    if el is None:
        return None
    return {key: el.get(key) for key in ("tenant", "creator")}


def minion(root: ET.Element) -> dict | None:
    """``{id, key_sha256}`` of the minion key virt.init seeded into this VM (its <metadata>), or None."""
    el = first(root, "metadata", VM, f"{{{METADATA_NS}}}minion")
    if el is None or not el.get("id") or not el.get("key_sha256"):
        return None
    return {"id": el.get("id"), "key_sha256": el.get("key_sha256")}


def with_ha(xml: str, on: bool) -> str:
    """salt-virt's ``<vm>`` element of domain ``xml`` with the HA flag ``on`` (as :func:`build` writes it) or
    without it, for libvirt's ``setMetadata`` (which replaces that element, live or in the definition): without a
    namespace, libvirt gives it and its children ours."""
    old = first(read(xml), "metadata", VM)
    vm = ET.Element("vm")
    for child in [] if old is None else list(old):
        if child.tag != f"{{{METADATA_NS}}}ha":
            vm.append(copy.deepcopy(child))
    for el in vm.iter():
        el.tag, el.tail = el.tag.split("}")[-1], None
    if on:
        sub(vm, "ha", HA_ON)
    return ET.tostring(vm, encoding="unicode")


def forget_minion(root: ET.Element) -> None:
    """Drop the minion key record from ``root``'s metadata (a copy of a VM: purging it would delete the
    original's key)."""
    for vm in every(root, "metadata", VM):
        for el in vm.findall(f"{{{METADATA_NS}}}minion"):
            vm.remove(el)
