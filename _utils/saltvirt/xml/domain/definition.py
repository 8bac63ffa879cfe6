"""A whole domain definition, composed of its element groups: :func:`build` writes a new VM from its spec with the
groups' builders, :func:`parse` reads what salt-virt reports with their readers, :func:`feature_facts` and
:func:`replace_features` read and replace the elements ``virt.update`` compares (``saltvirt.vm.converge``)."""

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from saltvirt.base.salttypes import Data
from saltvirt.model.vmspec import VMSpec
from saltvirt.xml.domain import boot, devices, metadata, tuning
from saltvirt.xml.etree import read, sub

# the top-level elements in the order salt-virt writes them (libvirt's schema takes any order; a definition read
# back diffs cleanly), every one libvirt 9.0 knows, so a new element of its own (elements.of) needs no line here
ORDER: tuple[str, ...] = ("name", "uuid", "genid", "title", "description", "maxMemory", "memory", "currentMemory")
ORDER += ("blkiotune", "vcpu", "vcpus", "iothreads", "iothreadids", "defaultiothread", "metadata", "resource")
ORDER += ("sysinfo", "bootloader", "bootloader_args", "os", "idmap", "features", "cpu", "cputune", "memtune")
ORDER += ("memoryBacking", "numatune", "clock", "on_poweroff", "on_reboot", "on_crash", "on_lockfailure", "pm")
ORDER += ("perf", "devices", "seclabel", "keywrap", "launchSecurity")
# the elements virt.update compares and replaces beside cpu, mem, nics, disks, graphics (feature_facts' keys):
# the groups' own, then each group's elements of their own (elements.of)
FEATURES: tuple[str, ...] = ("firmware", "kernel_boot", "boot_dev", "stop_on_reboot", "serials", "consoles")
FEATURES += ("hypervisor_features", "cpu_model", "memtune", "numatune", "vcpu", "cputune", "max_mem")
FEATURES += ("memory_backing", "host_devices")
FEATURES += tuple(e.key for e in (*boot.ELEMENTS, *tuning.ELEMENTS, *devices.ELEMENTS))


def build(spec: VMSpec) -> str:
    """Domain XML (str) for a :class:`saltvirt.model.vmspec.VMSpec`."""
    dom = ET.Element("domain", type=spec.vtype)
    sub(dom, "name", spec.name)
    if spec.uuid:
        sub(dom, "uuid", spec.uuid)
    groups = [*tuning.build_tuning(spec), *metadata.build_metadata(spec), *boot.build_boot(spec)]
    groups += devices.build_devices(spec)
    dom.extend(sorted(groups, key=lambda el: ORDER.index(el.tag)))
    return ET.tostring(dom, encoding="unicode")


def parse(xml: str | ET.Element) -> Data:
    """The facts salt-virt reports about a domain, from its XML (no further libvirt calls)."""
    return _facts(read(xml), compare=False)


def parse_for_compare(xml: str | ET.Element) -> Data:
    """:func:`parse` plus what comparing with a spec needs (``saltvirt.vm.converge``): the current vCPU
    count, each NIC's source by its type (a running VM's network NIC also names its bridge), the graphics
    passwords and the :func:`feature_facts`. Never report these facts as they are: they hold the passwords."""
    root = read(xml)
    return {**_facts(root, compare=True), "features": feature_facts(root)}


def _facts(root, compare):
    return {
        "name": root.findtext("name"),
        "uuid": root.findtext("uuid"),
        "type": root.get("type"),
        **tuning.facts(root, compare),
        **devices.facts(root, compare),
        **boot.facts(root),
        **metadata.facts(root),
    }


def feature_facts(xml: str | ET.Element) -> Data:
    """The :data:`FEATURES` of domain XML (firmware, boot order, chardevs, vTPM, tuning, NUMA, clock, host
    devices), normalized so what libvirt reads back equals what :func:`build` wrote."""
    root = read(xml)
    found = {**boot.feature_facts(root), **devices.feature_facts(root), **tuning.feature_facts(root)}
    return {key: found[key] for key in FEATURES}


def replace_features(xml: str, new_xml: str, fields: Iterable[str]) -> str:
    """Domain XML ``xml`` with the elements of ``fields`` (of :data:`FEATURES`) taken from ``new_xml``
    (what :func:`build` writes for the desired spec); everything else is kept as it is."""
    root, new = ET.fromstring(xml), ET.fromstring(new_xml)
    boot.replace(root, new, fields)
    tuning.replace(root, new, fields)
    devices.replace(root, new, fields)
    return ET.tostring(root, encoding="unicode")


def domain_name(xml: str) -> str | None:
    """The ``<name>`` of domain XML given by a user; ValueError when it does not parse."""
    try:
        return ET.fromstring(xml).findtext("name")
    except ET.ParseError as exc:
        raise ValueError(f"the domain XML does not parse: {exc}") from None
