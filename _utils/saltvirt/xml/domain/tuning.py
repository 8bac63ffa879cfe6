"""CPU, memory and NUMA of a domain: ``<maxMemory>``, ``<memory>``, ``<currentMemory>``, ``<vcpu>``, ``<cpu>``,
``<cputune>``, ``<memtune>``, ``<memoryBacking>``, ``<numatune>``; each element's builder beside its reader, the
reader normalized so what libvirt reads back equals what the builder wrote."""

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from saltvirt.base.salttypes import Data
from saltvirt.model.vmspec import VMSpec
from saltvirt.xml.domain import elements
from saltvirt.xml.etree import el, kib, mib, need, sub, to_int

CPUTUNE_SCALARS: tuple[str, ...] = ("shares", "global_period", "global_quota", "period", "quota")
CPUTUNE_SCALARS += ("emulator_period", "emulator_quota", "iothread_period", "iothread_quota")
# FEATURES field -> the element replace() takes whole from the desired definition
WHOLE = (
    ("cpu_model", "cpu"),
    ("memtune", "memtune"),
    ("numatune", "numatune"),
    ("cputune", "cputune"),
    ("max_mem", "maxMemory"),
    ("memory_backing", "memoryBacking"),
)
ELEMENTS: list[elements.Element] = []  # the domain's elements of their own here (elements.of below)


def build_tuning(spec: VMSpec) -> list[ET.Element]:
    """This group's elements of a new domain (``definition.build`` puts them in libvirt's order)."""
    out = [max_memory(spec.max_mem)] if spec.max_mem else []
    out += [el("memory", spec.mem, unit="MiB"), el("currentMemory", spec.mem_current or spec.mem, unit="MiB")]
    out.append(vcpu(spec))
    if spec.cpu_model:
        out.append(cpu(spec.cpu_model))
    if spec.cputune:
        out.append(cputune(spec.cputune))
    if spec.memtune:
        out.append(memtune(spec.memtune))
    if spec.memory_backing:
        out.append(memory_backing(spec.memory_backing))
    if spec.numatune:
        out.append(numatune(spec.numatune))
    return out + elements.build_all(ELEMENTS, spec.elements)


def facts(root: ET.Element, compare: bool = False) -> Data:
    """``cpu`` (the vCPU count), ``mem`` and ``current_mem`` (MiB) as ``parse`` reports them; with ``compare``
    also ``vcpu_current``, the current vCPU count (what comparing with a spec needs)."""
    vcpu_el = root.find("vcpu")
    count = to_int(vcpu_el.text if vcpu_el is not None else None, 1)
    out = {"cpu": count, "mem": mib(root.find("memory")), "current_mem": mib(root.find("currentMemory"))}
    if compare:
        out["vcpu_current"] = int(vcpu_el.get("current") or count) if vcpu_el is not None else count
    return out


def feature_facts(root: ET.Element) -> Data:
    """This group's part of ``definition.feature_facts``: CPU model, tuning, NUMA, maximum memory, backing."""
    return {
        "cpu_model": cpu_facts(root.find("cpu")),
        "memtune": memtune_facts(root.find("memtune")),
        "numatune": numatune_facts(root.find("numatune")),
        "vcpu": vcpu_facts(root.find("vcpu")),
        "cputune": cputune_facts(root.find("cputune")),
        "max_mem": max_memory_facts(root.find("maxMemory")),
        "memory_backing": memory_backing_facts(root.find("memoryBacking")),
        **elements.read_all(ELEMENTS, root),
    }


def replace(root: ET.Element, new: ET.Element, fields: Iterable[str]) -> None:
    """The elements of ``fields`` in ``root`` taken from ``new`` (the desired definition)."""
    if "vcpu" in fields:  # placement/cpuset (and the count, as the cpu setters left it)
        vcpu_el = need(root, "vcpu")
        vcpu_el.attrib.clear()
        vcpu_el.attrib.update(need(new, "vcpu").attrib)
    for key, tag in WHOLE:
        if key in fields:
            for old in root.findall(tag):
                root.remove(old)
            root.extend(new.findall(tag))
    elements.replace_all(ELEMENTS, root, new, fields)


def max_memory(m: Data) -> ET.Element:
    """``<maxMemory>``: the size (MiB) memory hotplug may reach, in ``slots`` DIMM slots."""
    return el("maxMemory", m["size"], slots=m["slots"], unit="MiB")


def max_memory_facts(node: ET.Element | None) -> Data | None:
    return {"size": mib(node), "slots": to_int(node.get("slots"))} if node is not None else None


def vcpu(spec: VMSpec) -> ET.Element:
    """``<vcpu>``: the count, with Salt's cpu dict's current/placement/cpuset."""
    return el("vcpu", spec.cpu, **(spec.vcpu or {}))


def vcpu_facts(node: ET.Element | None) -> Data:
    """``<vcpu>``'s placement and host cpuset (its count and current are the ``cpu`` field)."""
    if node is None:
        return {"placement": "static", "cpuset": None}
    return {"placement": node.get("placement", "static"), "cpuset": node.get("cpuset")}


def cpu(c: Data) -> ET.Element:
    """``<cpu>`` from Salt's cpu dict (cpumem.cpu_detail): mode, match, check, model, vendor, topology, features."""
    node = el("cpu", mode=c["mode"], match=c.get("match"), check=c.get("check"))
    if c.get("model"):
        m = c["model"]
        sub(node, "model", m["name"], fallback=m.get("fallback"), vendor_id=m.get("vendor_id"))
    if c.get("vendor"):
        sub(node, "vendor", c["vendor"])
    if c.get("topology"):
        sub(node, "topology", **c["topology"])
    for name, policy in sorted(c["features"].items()):
        sub(node, "feature", policy=policy, name=name)
    if c.get("numa"):
        numa = sub(node, "numa")
        for cell in c["numa"]:
            sub(numa, "cell", **{k: v for k, v in cell.items() if k != "memory"}, memory=cell["memory"], unit="MiB")
    return node


def cpu_facts(node: ET.Element | None) -> Data | None:
    """``<cpu>`` as cpumem.cpu_detail writes it, without what libvirt adds on define (check, match
    exact, fallback allow, dies)."""
    if node is None:
        return None
    out: Data = {"mode": node.get("mode", "custom")}
    if node.get("match") not in (None, "exact"):  # libvirt writes its default (exact) back
        out["match"] = node.get("match")
    model = node.find("model")
    name = (model.text or "").strip() if model is not None else ""
    if model is not None and name:
        out["model"] = {"name": name, **{k: v for k, v in model.attrib.items() if k != "fallback"}}
        if model.get("fallback") not in (None, "allow"):
            out["model"]["fallback"] = model.get("fallback")
    if node.findtext("vendor"):
        out["vendor"] = node.findtext("vendor")
    topo = node.find("topology")
    if topo is not None:
        out["topology"] = {k: to_int(topo.get(k), 1) for k in ("sockets", "cores", "threads")}
    out["features"] = {f.get("name"): f.get("policy", "require") for f in node.findall("feature")}
    cells = [
        {**{k: v for k, v in c.attrib.items() if k != "unit"}, "id": to_int(c.get("id")), "memory": mib(c, "memory")}
        for c in node.findall("numa/cell")
    ]
    if cells:
        out["numa"] = cells
    return None if out == {"mode": "custom", "features": {}} else out  # libvirt drops an empty <cpu>


def cputune(t: Data) -> ET.Element:
    """``<cputune>`` from Salt's cpu:tuning (cpumem.cpu_tuning), in libvirt's order."""
    node = el("cputune")
    for key in CPUTUNE_SCALARS:
        if key in t:
            sub(node, key, t[key])
    for vcpu_id, cpus in sorted(t.get("vcpupin", {}).items()):
        sub(node, "vcpupin", vcpu=vcpu_id, cpuset=cpus)
    if t.get("emulatorpin"):
        sub(node, "emulatorpin", cpuset=t["emulatorpin"])
    return node


def cputune_facts(node: ET.Element | None) -> Data | None:
    if node is None or not len(node):
        return None
    out: Data = {k: to_int(node.findtext(k)) for k in CPUTUNE_SCALARS if node.find(k) is not None}
    pins = {to_int(p.get("vcpu")): p.get("cpuset") for p in node.findall("vcpupin")}
    if pins:
        out["vcpupin"] = pins
    emulatorpin = node.find("emulatorpin")
    if emulatorpin is not None:
        out["emulatorpin"] = emulatorpin.get("cpuset")
    return out


MEMTUNE_LIMITS = ("hard_limit", "soft_limit", "swap_hard_limit", "min_guarantee")


def memtune(limits: Data) -> ET.Element:
    """``<memtune>`` with the limits (MiB) of Salt's mem dict."""
    node = el("memtune")
    for key in MEMTUNE_LIMITS:
        if key in limits:
            sub(node, key, limits[key], unit="MiB")
    return node


def memtune_facts(node: ET.Element | None) -> Data | None:
    """``<memtune>``'s limits in MiB, None without any."""
    return {child.tag: mib(child) for child in ([] if node is None else node)} or None


def memory_backing(b: Data) -> ET.Element:
    """``<memoryBacking>`` from Salt's mem dict (cpumem.memory_backing): hugepages (page sizes in KiB,
    per guest NUMA cells), nosharepages, locked, source, access, allocation, discard."""
    node = el("memoryBacking")
    if "hugepages" in b:
        pages = sub(node, "hugepages")
        for page in b["hugepages"]:
            sub(pages, "page", size=page["size"], unit="KiB", nodeset=page.get("nodeset"))
    for key in ("nosharepages", "locked"):
        if b.get(key):
            sub(node, key)
    if b.get("source"):
        sub(node, "source", type=b["source"])
    if b.get("access"):
        sub(node, "access", mode=b["access"])
    if b.get("allocation"):
        sub(node, "allocation", mode=b["allocation"])
    if b.get("discard"):
        sub(node, "discard")
    return node


def memory_backing_facts(node: ET.Element | None) -> Data | None:
    """``<memoryBacking>`` as cpumem.memory_backing writes it (page sizes in KiB)."""
    if node is None or not len(node):
        return None
    out: Data = {}
    if node.find("hugepages") is not None:
        out["hugepages"] = [
            {"size": kib(p, "size"), **({"nodeset": p.get("nodeset")} if p.get("nodeset") else {})}
            for p in node.findall("hugepages/page")
        ]
    for key in ("nosharepages", "locked", "discard"):
        if node.find(key) is not None:
            out[key] = True
    for key, attr in (("source", "type"), ("access", "mode"), ("allocation", "mode")):
        child = node.find(key)
        if child is not None:
            out[key] = child.get(attr)
    return out


def numatune(n: Data) -> ET.Element:
    """``<numatune>``: the host NUMA nodes the guest's memory comes from, and per guest cell (``<memnode>``)."""
    node = el("numatune")
    if n.get("mode"):
        sub(node, "memory", mode=n["mode"], nodeset=n["nodeset"])
    for cell in n.get("memnodes", []):
        sub(node, "memnode", cellid=cell["cellid"], mode=cell["mode"], nodeset=cell["nodeset"])
    return node


def numatune_facts(node: ET.Element | None) -> Data | None:
    """``<numatune>``: its memory's mode and nodeset, and ``memnodes`` when there are some."""
    if node is None or not len(node):
        return None
    memory = node.find("memory")
    out = dict(memory.attrib) if memory is not None else {}
    cells = [{**m.attrib, "cellid": to_int(m.get("cellid"))} for m in node.findall("memnode")]
    return {**out, "memnodes": cells} if cells else out
