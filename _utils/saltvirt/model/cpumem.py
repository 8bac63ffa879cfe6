"""Salt's ``cpu`` and ``mem`` dicts and ``numatune`` for ``virt.init`` / ``virt.update`` / the states,
checked key by key (the rest of the nested arguments: :mod:`saltvirt.model.checks`): CPU model, topology,
features, ``<vcpu>`` placement, ``<cputune>``, guest NUMA cells, memtune limits, memory hotplug,
``<memoryBacking>``. CPU sets come out in libvirt's own spelling so a definition read back compares
equal. :mod:`saltvirt.model.vmspec` calls these; nothing here touches libvirt.
"""

import re
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.model.checks import NOT_YET, check_keys, flag

# cpu / mem in Salt's detailed forms (the common keys; the rest refused key by key) --------------------
CPU_KEYS: tuple[str, ...] = ("maximum", "mode", "match", "check", "model", "vendor", "topology", "features")
CPU_KEYS += ("current", "placement", "cpuset", "tuning", "numa")
CPU_REFUSED = {
    "vcpus": f"cpu:vcpus (per-vCPU hotplug order) {NOT_YET}: use cpu:current for the vCPUs online at start",
    "cache": f"cpu:cache {NOT_YET}: leave it out (libvirt's default cache emulation is used)",
    "iothreads": f"cpu:iothreads {NOT_YET}: leave it out",
}
TUNING_PERIODS = ("period", "global_period", "emulator_period", "iothread_period")
TUNING_QUOTAS = ("quota", "global_quota", "emulator_quota", "iothread_quota")
TUNING_KEYS = ("vcpupin", "emulatorpin", "shares") + TUNING_PERIODS + TUNING_QUOTAS
TUNING_REFUSED = {
    "iothreadpin": f"cpu:tuning:iothreadpin needs cpu:iothreads, which {NOT_YET}: leave it out",
    **{
        k: f"cpu:tuning:{k} {NOT_YET}: leave it out (use vcpupin/emulatorpin, shares, period, quota)"
        for k in ("vcpusched", "iothreadsched", "emulatorsched", "cachetune", "memorytune")
    },
}
NUMA_CELL_KEYS = ("cpus", "memory", "memAccess", "discard")
NUMA_CELL_REFUSED = {"distances": f"cpu:numa:<cell>:distances {NOT_YET}: leave it out (libvirt's defaults apply)"}
_CPUSET_RE = re.compile(r"^\^?\d{1,4}(-\d{1,4})?(,\^?\d{1,4}(-\d{1,4})?)*$")
CPU_MODEL_KEYS = ("name", "fallback", "vendor_id")
TOPOLOGY_KEYS = ("sockets", "cores", "threads")
MEM_LIMITS = ("hard_limit", "soft_limit", "swap_hard_limit", "min_guarantee")  # <memtune>
MEM_BACKING = ("hugepages", "nosharepages", "locked", "source", "access", "allocation", "discard")  # <memoryBacking>
MEM_KEYS = ("boot", *MEM_LIMITS, "current", "max", "slots", *MEM_BACKING)
MEM_REFUSED: dict[str, str] = {}
HUGEPAGE_KEYS = ("size", "nodeset")
_CPU_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _name(value, what):
    if not isinstance(value, str) or not _CPU_NAME_RE.fullmatch(value):
        raise SaltInvocationError(f"{what} must be a name like Skylake-Client or vmx, got {value!r}")
    return value


def _choice(value, what, allowed):
    if value not in allowed:
        raise SaltInvocationError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def cpu_detail(value: Any) -> tuple[Any, Data | None]:
    """Salt's ``cpu`` dict -> ``(vCPUs, {<cpu> attributes/children})``; a number -> ``(number, None)``."""
    if not isinstance(value, dict):
        return value, None
    check_keys(value, "cpu", CPU_KEYS, CPU_REFUSED)
    if value.get("maximum") is None:
        raise SaltInvocationError("cpu as a mapping needs maximum (the number of vCPUs)")
    count = validate.positive_int(value["maximum"], "cpu:maximum", maximum=4096)
    out = {"mode": _choice(value.get("mode", "custom"), "cpu:mode", ("custom", "host-model", "host-passthrough"))}
    for key, allowed in (("match", ("minimum", "exact", "strict")), ("check", ("none", "partial", "full"))):
        if value.get(key) is not None:
            out[key] = _choice(value[key], f"cpu:{key}", allowed)
    _cpu_model(value.get("model"), out)
    if value.get("vendor") is not None:
        out["vendor"] = _name(value["vendor"], "cpu:vendor")
    if value.get("topology") is not None:
        check_keys(value["topology"], "cpu:topology", TOPOLOGY_KEYS)
        topo = {k: validate.positive_int(value["topology"].get(k, 1), f"cpu:topology:{k}") for k in TOPOLOGY_KEYS}
        if topo["sockets"] * topo["cores"] * topo["threads"] != count:
            raise SaltInvocationError(f"cpu:topology {topo} must multiply to cpu:maximum ({count})")
        out["topology"] = topo
    feats = value.get("features") or {}
    if not isinstance(feats, dict):
        raise SaltInvocationError(f"cpu:features must map feature names to a policy, got {feats!r}")
    policies = ("force", "require", "optional", "disable", "forbid")
    out["features"] = {
        _name(k, "cpu:features name"): _choice(p, f"cpu:features:{k}", policies) for k, p in feats.items()
    }
    if out["mode"] != "custom" and ("model" in out or "vendor" in out):
        raise SaltInvocationError(f"cpu:model and cpu:vendor go with mode custom, not {out['mode']}")
    _vcpu_detail(value, count, out)
    if value.get("tuning") is not None:
        out["tuning"] = cpu_tuning(value["tuning"], count)
    if value.get("numa") is not None:
        out["numa"] = numa_cells(value["numa"], count)
    return count, out


def _cpu_model(model, out):
    """cpu:model (a name, or {name, fallback, vendor_id}) -> ``out["model"]``."""
    if isinstance(model, str):
        model = {"name": model}
    if model is None:
        return
    check_keys(model, "cpu:model", CPU_MODEL_KEYS)
    out["model"] = {"name": _name(model.get("name"), "cpu:model:name")}
    if model.get("fallback") is not None:
        out["model"]["fallback"] = _choice(model["fallback"], "cpu:model:fallback", ("allow", "forbid"))
    if model.get("vendor_id") is not None:
        vid = model["vendor_id"]
        if not isinstance(vid, str) or not re.fullmatch(r"[A-Za-z0-9]{12}", vid):
            raise SaltInvocationError(f"cpu:model:vendor_id must be 12 letters or digits, got {vid!r}")
        out["model"]["vendor_id"] = vid


def cpuset(value: Any, what: str, maximum: int | None = None, of: str = "vCPUs") -> str:
    """A CPU set (``0-3,^2,6`` or one number) in libvirt's canonical spelling (``0-1,3,6``), as libvirt
    writes it back; every id below ``maximum`` when given (the guest's vCPUs)."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not _CPUSET_RE.fullmatch(text):
        raise SaltInvocationError(f"{what} must be a CPU set like 0-3,^2,6, got {value!r}")
    ids: set[int] = set()
    for part in text.split(","):
        neg = part.startswith("^")
        lo, _, hi = part.lstrip("^").partition("-")
        span = set(range(int(lo), int(hi or lo) + 1))
        if not span:
            raise SaltInvocationError(f"{what}: the range {part!r} is empty (write low-high)")
        ids = ids - span if neg else ids | span
    if not ids:
        raise SaltInvocationError(f"{what}: {value!r} names no CPU")
    if maximum is not None and max(ids) >= maximum:
        raise SaltInvocationError(f"{what}: {max(ids)} does not exist (the VM has {maximum} {of}: 0-{maximum - 1})")
    runs: list[list[int]] = []  # [first, last] of each run of consecutive ids
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _vcpu_detail(value, count, out):
    """cpu:current, placement, cpuset -> ``out["vcpu"]`` (the attributes of ``<vcpu>``)."""
    vcpu = {}
    if value.get("placement") is not None:
        vcpu["placement"] = _choice(value["placement"], "cpu:placement", ("static", "auto"))
    if value.get("cpuset") is not None:
        if vcpu.get("placement") == "auto":
            raise SaltInvocationError("cpu:cpuset goes with placement static (auto lets numad choose): drop one")
        vcpu["cpuset"] = cpuset(value["cpuset"], "cpu:cpuset")
    if value.get("current") is not None:
        current = validate.positive_int(value["current"], "cpu:current", maximum=4096)
        if current > count:
            raise SaltInvocationError(f"cpu:current ({current}) must not exceed cpu:maximum ({count})")
        vcpu["current"] = current
    if vcpu:
        out["vcpu"] = vcpu


def _vcpu_id(key, what, count):
    vcpu = validate.int_in(key, what, 0, 4095)
    if vcpu >= count:
        raise SaltInvocationError(f"{what}: vCPU {vcpu} does not exist (the VM has {count} vCPUs: 0-{count - 1})")
    return vcpu


def cpu_tuning(value: Any, count: int) -> Data:
    """Salt's ``cpu:tuning`` -> ``<cputune>``: vcpupin {vcpu: host cpuset}, emulatorpin, shares, the CFS
    periods (1000-1000000 us) and quotas (-1 or 1000-17592186044415 us)."""
    check_keys(value, "cpu:tuning", TUNING_KEYS, TUNING_REFUSED)
    out: Data = {}
    if value.get("shares") is not None:
        out["shares"] = validate.int_in(value["shares"], "cpu:tuning:shares", 2, 262144)
    for key in TUNING_PERIODS:
        if value.get(key) is not None:
            out[key] = validate.int_in(value[key], f"cpu:tuning:{key} (microseconds)", 1000, 1000000)
    for key in TUNING_QUOTAS:
        if value.get(key) is not None:
            out[key] = validate.int_in(value[key], f"cpu:tuning:{key} (microseconds, -1: none)", -1, 17592186044415)
            if 0 <= out[key] < 1000:
                raise SaltInvocationError(f"cpu:tuning:{key} must be -1 or at least 1000, got {value[key]!r}")
    pins = value.get("vcpupin") or {}
    if not isinstance(pins, dict):
        raise SaltInvocationError(f"cpu:tuning:vcpupin must map vCPU ids to host CPU sets, got {pins!r}")
    if pins:
        out["vcpupin"] = {
            _vcpu_id(k, "cpu:tuning:vcpupin", count): cpuset(v, f"cpu:tuning:vcpupin:{k}") for k, v in pins.items()
        }
    if value.get("emulatorpin") is not None:
        out["emulatorpin"] = cpuset(value["emulatorpin"], "cpu:tuning:emulatorpin")
    return out


def numa_cells(value: Any, count: int) -> list[Data]:
    """Salt's ``cpu:numa`` ({cell id: {cpus, memory, memAccess, discard}}) -> a list of guest NUMA cells
    (memory in MiB), ids 0..n-1, vCPUs of the VM, no vCPU in two cells."""
    if not isinstance(value, dict) or not value:
        raise SaltInvocationError(f"cpu:numa must map cell ids (0, 1, ...) to {{cpus, memory}}, got {value!r}")
    cells: list[Data] = []
    seen: set[int] = set()
    for key in sorted(value, key=lambda k: validate.int_in(k, "cpu:numa cell id", 0, 255)):
        cell_id = validate.int_in(key, "cpu:numa cell id", 0, 255)
        where = f"cpu:numa:{cell_id}"
        conf = value[key]
        check_keys(conf, where, NUMA_CELL_KEYS, NUMA_CELL_REFUSED)
        for need in ("cpus", "memory"):
            if conf.get(need) is None:
                raise SaltInvocationError(f"{where} needs {need}")
        cpus = cpuset(conf["cpus"], f"{where}:cpus", maximum=count)
        ids = _cpu_ids(cpus)
        if ids & seen:
            raise SaltInvocationError(f"{where}:cpus: vCPU {min(ids & seen)} is in another cell already")
        seen |= ids
        cell = {"id": cell_id, "cpus": cpus, "memory": mib(conf["memory"], f"{where}:memory")}
        if conf.get("memAccess") is not None:
            cell["memAccess"] = _choice(conf["memAccess"], f"{where}:memAccess", ("shared", "private"))
        if conf.get("discard") is not None:
            cell["discard"] = "yes" if flag(conf["discard"], f"{where}:discard") else "no"
        cells.append(cell)
    if [c["id"] for c in cells] != list(range(len(cells))):
        raise SaltInvocationError(f"cpu:numa cell ids must be 0, 1, ... without gaps, got {sorted(value)!r}")
    return cells


def _cpu_ids(canonical):
    ids = set()
    for part in canonical.split(","):
        lo, _, hi = part.partition("-")
        ids |= set(range(int(lo), int(hi or lo) + 1))
    return ids


def mib(value: Any, what: str) -> int:
    """A size in MiB: a number (MiB) or one with a unit (``512m``, ``2 GiB``, ``4GB``: ``validate.SIZE_UNITS``).
    A decimal unit rounds down to whole MiB (the spec keeps MiB; Salt rounds down to KiB); a binary size
    that is not whole MiB (``1k``) is refused as a slip."""
    size, decimal = validate.size_bytes(value, what, "MiB", "a size like 1024 (MiB), 512m or 2g")
    if size < 2**20 or (size % 2**20 and not decimal):
        raise SaltInvocationError(f"{what} must be a whole number of MiB, got {value!r}")
    return size // 2**20


def mem_detail(value: Any) -> tuple[Any, Data | None]:
    """Salt's ``mem`` dict -> ``(boot MiB, {memtune limits in MiB})``; a number -> ``(number, None)``."""
    if not isinstance(value, dict):
        return value, None
    check_keys(value, "mem", MEM_KEYS, MEM_REFUSED)
    if value.get("boot") is None:
        raise SaltInvocationError("mem as a mapping needs boot (the memory in MiB, or 1g ...)")
    boot_mib = mib(value["boot"], "mem:boot")
    limits = {k: mib(value[k], f"mem:{k}") for k in MEM_LIMITS if value.get(k) is not None}
    return boot_mib, limits or None


def mem_layout(value: Any, boot_mib: int, numa_cells: int = 0) -> tuple[int | None, Data | None, Data | None]:
    """Salt's ``mem:current`` / ``max`` + ``slots`` / backing keys -> ``(current MiB or None, {size, slots}
    or None, <memoryBacking> dict or None)``. ``numa_cells``: how many guest NUMA cells cpu:numa has."""
    if not isinstance(value, dict):
        return None, None, None
    current = None
    if value.get("current") is not None:
        current = mib(value["current"], "mem:current")
        if current > boot_mib:
            raise SaltInvocationError(f"mem:current ({current} MiB) must not exceed mem:boot ({boot_mib} MiB)")
    max_mem = None
    if value.get("max") is not None or value.get("slots") is not None:
        if value.get("max") is None or value.get("slots") is None:
            raise SaltInvocationError("mem:max (memory hotplug maximum) and mem:slots go together: give both")
        max_mem = {"size": mib(value["max"], "mem:max"), "slots": validate.int_in(value["slots"], "mem:slots", 1, 255)}
        if max_mem["size"] < boot_mib:
            raise SaltInvocationError(f"mem:max ({max_mem['size']} MiB) must be at least mem:boot ({boot_mib} MiB)")
        if not numa_cells:
            raise SaltInvocationError("mem:max (memory hotplug) needs guest NUMA cells: add cpu:numa (e.g. one cell)")
    return current, max_mem, memory_backing(value, numa_cells)


def _kib(value, what):
    """A page size in KiB: a number (MiB, as mem's sizes) or ``4k``/``2m``/``1g``."""
    size, _decimal = validate.size_bytes(value, what, "MiB", "a page size like 2m or 1g")
    if size < 1024 or size % 1024:
        raise SaltInvocationError(f"{what} must be a page size like 2m or 1g, got {value!r}")
    return size // 1024


def memory_backing(value: Any, numa_cells: int = 0) -> Data | None:
    """Salt's mem:hugepages (True, or [{size, nodeset}]), nosharepages, locked, source, access,
    allocation, discard -> the ``<memoryBacking>`` dict, or None."""
    out = {}
    pages = value.get("hugepages")
    if pages is not None and pages is not False:
        out["hugepages"] = [] if pages is True else _hugepages(pages, numa_cells)
    for key in ("nosharepages", "locked", "discard"):
        if value.get(key) is not None and flag(value[key], f"mem:{key}"):
            out[key] = True
    for key, allowed in (
        ("source", ("file", "anonymous", "memfd")),
        ("access", ("shared", "private")),
        ("allocation", ("immediate", "ondemand")),
    ):
        if value.get(key) is not None:
            out[key] = _choice(value[key], f"mem:{key}", allowed)
    return out or None


def _hugepages(pages, numa_cells):
    if isinstance(pages, dict):
        pages = [pages]
    if not isinstance(pages, list) or not pages:
        raise SaltInvocationError(f"mem:hugepages must be True or a list of {{size, nodeset}}, got {pages!r}")
    out = []
    for i, page in enumerate(pages):
        where = f"mem:hugepages[{i}]"
        check_keys(page, where, HUGEPAGE_KEYS)
        if page.get("size") is None:
            raise SaltInvocationError(f"{where} needs a size (e.g. 2m or 1g)")
        entry = {"size": _kib(page["size"], f"{where}:size")}
        if page.get("nodeset") is not None:
            if not numa_cells:
                raise SaltInvocationError(f"{where}:nodeset names guest NUMA cells: add cpu:numa, or drop nodeset")
            entry["nodeset"] = cpuset(page["nodeset"], f"{where}:nodeset", maximum=numa_cells, of="NUMA cells")
        out.append(entry)
    return out


NUMATUNE_KEYS = ("memory", "memnodes")
NUMATUNE_MODES = ("strict", "interleave", "preferred", "restrictive")
_NODESET_RE = re.compile(r"^\^?\d{1,4}(-\d{1,4})?(,\^?\d{1,4}(-\d{1,4})?)*$")


def _host_nodes(nodeset, what):
    """Host NUMA nodes (``0-1,^3``) in libvirt's spelling."""
    if not isinstance(nodeset, (str, int)) or isinstance(nodeset, bool) or not _NODESET_RE.fullmatch(str(nodeset)):
        raise SaltInvocationError(f"{what} must be host NUMA nodes like 0-1,^3, got {nodeset!r}")
    return cpuset(nodeset, what)


def numatune(value: Any, numa_cells: int = 0) -> Data | None:
    """Salt's ``numatune: {memory: {mode, nodeset}, memnodes: {<guest cell>: {mode, nodeset}}}`` ->
    ``{mode, nodeset, memnodes: [{cellid, mode, nodeset}]}`` (modes strict|interleave|preferred|restrictive;
    ``numa_cells``: how many guest NUMA cells cpu:numa has, which memnodes name)."""
    if value in (None, "", {}):
        return None
    check_keys(value, "numatune", NUMATUNE_KEYS)
    out = {}
    if value.get("memory") is not None or value.get("memnodes") is None:
        mem = value.get("memory") or {}
        check_keys(mem, "numatune:memory", ("mode", "nodeset"))
        out["mode"] = _choice(mem.get("mode", "strict"), "numatune:memory:mode", NUMATUNE_MODES)
        out["nodeset"] = _host_nodes(mem.get("nodeset"), "numatune:memory:nodeset")
    nodes = value.get("memnodes")
    if nodes is not None:
        if not isinstance(nodes, dict) or not nodes:
            raise SaltInvocationError(f"numatune:memnodes must map guest cell ids to {{mode, nodeset}}, got {nodes!r}")
        if not numa_cells:
            raise SaltInvocationError("numatune:memnodes tunes guest NUMA cells: add cpu:numa, or use numatune:memory")
        out["memnodes"] = []
        for key in sorted(nodes, key=lambda k: validate.int_in(k, "numatune:memnodes cell id", 0, 255)):
            cell = validate.int_in(key, "numatune:memnodes cell id", 0, 255)
            where = f"numatune:memnodes:{cell}"
            if cell >= numa_cells:
                raise SaltInvocationError(f"{where}: the VM has guest NUMA cells 0-{numa_cells - 1} (cpu:numa)")
            conf = nodes[key]
            check_keys(conf, where, ("mode", "nodeset"))
            out["memnodes"].append(
                {
                    "cellid": cell,
                    "mode": _choice(conf.get("mode", "strict"), f"{where}:mode", NUMATUNE_MODES),
                    "nodeset": _host_nodes(conf.get("nodeset"), f"{where}:nodeset"),
                }
            )
    return out
