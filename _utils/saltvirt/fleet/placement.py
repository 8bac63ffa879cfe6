"""Where a new VM goes. Pure functions: host facts + a request + a policy -> hosts ranked by score with
the score's parts, and every host that cannot take the VM with the reasons why. No Salt, no libvirt.

Host facts are each hypervisor's ``virt.capacity`` (:meth:`saltvirt.fleet.publish.Fleet.capacities`; the
``host`` and ``vm_info`` of ``virt.full_info`` have the same shape, so its answers work too)::

    {"hyper1": {"status": "up", "host": {mem_total, mem_used_by_vms, vcpus_total, vcpus_used_by_vms,
                                          disk_free, images_dir, vms_defined, ...},
                "vm_info": {name: {"group": "web", ...}, ...}},
     "hyper2": {"status": "down", "error": "did not answer within 10 s"}}

A host takes the VM only if all of these hold:

* it answered (``status: up``) and is not in maintenance (``maintenance``: ids or globs);
* memory: ``mem_total - mem_used_by_vms (running VMs) - mem_reserve_mib >= mem``;
* vCPUs: ``vcpus_used_by_vms + cpu <= vcpus_total * cpu_overcommit``;
* disk: ``disk_free (in virt:images) - disk_reserve_mib >= disk_mib`` (a full copy of the image);
* anti-affinity: no VM of the request's ``group`` is defined there.

Capacity that in-flight ``virt.init`` calls reserved (``saltvirt.fleet.fleetstate``, shared by every master)
counts as used (memory, vCPUs, disk, VM count, group members).

Among those, the score (0..1) is the weighted mean of per-resource scores. ``strategy: spread`` (the
default) prefers headroom: the fraction of memory and of vCPU capacity left after placing the VM, the
disk left relative to the roomiest candidate, and few VMs. ``strategy: pack`` inverts them (fill hosts
before starting new ones). Ties go to the lower host id, so the choice is deterministic.

Soft affinity (the request's ``affinity``: ``[{group: web, weight: 0.5}, {group: db, weight: -1}]``)
adds one score term per group, weighted by ``abs(weight)`` beside the resource weights: a positive
weight prefers hosts with more VMs of that group (members by their ``group``, or their own soft
``affinity`` groups, and in-flight reservations), a negative one (soft anti-affinity) hosts with fewer.
The term is ``members / most members on any candidate`` (``1 -`` that for a negative weight); it is
shown as ``affinity:<group>`` among the score's parts. Unlike ``group`` it never excludes a host.

Policy (master config ``virt:placement``; every key optional)::

    virt:
      placement:
        mem_reserve_mib: 1024      # kept for the host itself
        cpu_overcommit: 4.0        # vCPUs per host CPU
        disk_reserve_mib: 1024     # kept free in virt:images
        strategy: spread           # or pack
        weights: {mem: 1.0, cpu: 1.0, disk: 0.5, vms: 0.25}
        maintenance: [hyper3, 'rack2-*']
"""

import copy
import fnmatch
import heapq
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import section
from saltvirt.base.salttypes import Data

DEFAULT_POLICY: Data = {
    "mem_reserve_mib": 1024,
    "cpu_overcommit": 4.0,
    "disk_reserve_mib": 1024,
    "strategy": "spread",
    "weights": {"mem": 1.0, "cpu": 1.0, "disk": 0.5, "vms": 0.25},
    "maintenance": [],
}
STRATEGIES = ("spread", "pack")
_BY_CALLER = "excluded by the caller (already tried)"
RANK_TOP = 50  # hosts the runner lists (and falls over to) in a big fleet; ``fit`` counts all that fit


def _number(value, what, minimum=0.0, integer=False):
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"virt:placement:{what} must be a number, not {value!r}") from None
    if math.isnan(num) or num < minimum:
        raise SaltInvocationError(f"virt:placement:{what} must be >= {minimum}, not {value!r}")
    return int(num) if integer else num


def _names(value, what):
    if value in (None, "", False):
        return []
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple, set)):
        raise SaltInvocationError(f"virt:placement:{what} must be a list of minion ids or globs, not {value!r}")
    return [str(v).strip() for v in value if str(v).strip()]


def make_policy(config: Data | None = None, **overrides: Any) -> Data:
    """The effective policy: defaults < ``config`` (master ``virt:placement``) < per-call overrides."""
    pol: Data = copy.deepcopy(DEFAULT_POLICY)
    for source in (config or {}, {k: v for k, v in overrides.items() if v is not None}):
        for key, value in section(source, "virt:placement", sorted(DEFAULT_POLICY)).items():
            if key == "weights":
                if not isinstance(value, dict):
                    raise SaltInvocationError(f"virt:placement:weights must be a mapping, not {value!r}")
                bad = sorted(set(value) - set(DEFAULT_POLICY["weights"]))
                if bad:
                    raise SaltInvocationError(
                        f"virt:placement:weights: unknown resource(s) {', '.join(bad)} (known: mem, cpu, disk, vms)"
                    )
                pol["weights"].update({k: _number(v, f"weights:{k}") for k, v in value.items()})
            elif key == "maintenance":
                pol["maintenance"] = _names(value, key)
            elif key == "strategy":
                if value not in STRATEGIES:
                    raise SaltInvocationError(
                        f"virt:placement:strategy must be one of {', '.join(STRATEGIES)}, not {value!r}"
                    )
                pol["strategy"] = value
            elif key == "cpu_overcommit":
                pol[key] = _number(value, key, minimum=0.01)
            else:
                pol[key] = _number(value, key, integer=True)
    if not any(pol["weights"].values()):
        raise SaltInvocationError("virt:placement:weights: at least one weight must be above 0")
    return pol


def make_affinity(value: Any) -> list[Data]:
    """Soft affinity terms ``[{group, weight}]`` from ``[{group, weight}, ...]``, ``{group: weight}``
    or one ``{group, weight}``; weights are non-zero numbers in -10..10 (negative: soft anti-affinity)."""
    if value in (None, "", [], {}):
        return []
    if isinstance(value, dict):
        value = [value] if "group" in value else [{"group": g, "weight": w} for g, w in value.items()]
    if not isinstance(value, (list, tuple)):
        raise SaltInvocationError(f"affinity must be a list of {{group, weight}}, not {value!r}")
    terms = {}
    for item in value:
        if not isinstance(item, dict) or set(item) - {"group", "weight"} or not item.get("group"):
            raise SaltInvocationError(
                f"affinity: each entry is {{group: <name>, weight: <-10..10, not 0>}}, not {item!r}"
            )
        group = str(item["group"])
        try:
            weight = float(item.get("weight", 1.0))
        except (TypeError, ValueError):
            raise SaltInvocationError(f"affinity: weight of group {group!r} must be a number") from None
        if math.isnan(weight) or not weight or abs(weight) > 10:
            raise SaltInvocationError(f"affinity: weight of group {group!r} must be in -10..10 and not 0")
        terms[group] = weight
    return [{"group": g, "weight": w} for g, w in sorted(terms.items())]


def make_request(cpu: Any, mem: Any, disk_mib: Any = 0, group: str | None = None, affinity: Any = None) -> Data:
    """What the VM needs: vCPUs, memory (MiB), disk (MiB for a full copy of its image), its group, its
    soft affinity terms (:func:`make_affinity`)."""
    req: Data = {
        "cpu": validate.positive_int(cpu, "cpu"),
        "mem": validate.positive_int(mem, "mem (MiB)"),
        "disk_mib": int(_number(disk_mib or 0, "disk_mib")),
        "group": str(group) if group else None,
    }
    terms = make_affinity(affinity)
    if terms:
        req["affinity"] = terms
    return req


def _members(answer, load, group):
    """How many VMs of soft-affinity ``group`` a host has (theirs and in-flight ones)."""
    count = 0
    for info in (answer.get("vm_info") or {}).values():
        vm = info or {}
        soft = [t.get("group") for t in vm.get("affinity") or [] if isinstance(t, dict)]
        count += vm.get("group") == group or group in soft
    return count + sum(1 for g in ((load or {}).get("groups") or {}).values() if g == group)


def in_maintenance(host: str, patterns: Iterable[str]) -> str | None:
    """The maintenance pattern that matches ``host``, or None."""
    return next((p for p in patterns if fnmatch.fnmatchcase(host, p)), None)


def mark_maintenance(hosts: dict[str, Any], pol: Data) -> dict[str, Any]:
    """``hosts`` (a fleet answer: ``{host: answer}``) with ``maintenance`` set in each answer that is a dict: the
    pattern of ``pol`` that puts the host in maintenance, or None (``salt-run virt.query``, the web console's
    fleet view)."""
    return {
        h: dict(a, maintenance=in_maintenance(h, pol["maintenance"])) if isinstance(a, dict) else a
        for h, a in hosts.items()
    }


def _check(host, answer, req, pol, load=None, maint_re=False):
    """(free-after dict, reasons list) for one host; reasons empty means it fits. ``load``: what
    in-flight creations reserved there (``saltvirt.fleet.fleetstate.tally``), counted as used.
    ``maint_re``: :func:`_maintenance_re` of the policy, when the caller has it."""
    status = answer.get("status", "up") if isinstance(answer, dict) else "down"
    if status != "up":
        return None, [f"{status}: {answer.get('error') or 'no answer'}" if isinstance(answer, dict) else "down"]
    maybe = maint_re is False or (maint_re is not None and maint_re.match(host))
    pattern = in_maintenance(host, pol["maintenance"]) if maybe else None
    if pattern:
        return None, [f"in maintenance (virt:placement:maintenance: {pattern!r})"]
    facts = answer.get("host", answer)
    mem_total, mem_used = (
        validate.int_or_none(facts.get("mem_total")),
        validate.int_or_none(facts.get("mem_used_by_vms")) or 0,
    )
    cpus, cpus_used = (
        validate.int_or_none(facts.get("vcpus_total")),
        validate.int_or_none(facts.get("vcpus_used_by_vms")) or 0,
    )
    if not mem_total or not cpus:
        return None, ["no capacity facts in its answer (is salt-virt on this minion up to date?)"]
    load = load or {}
    inflight = len(load.get("vms") or [])
    held = f" by {inflight} in-flight init(s)" if inflight else ""
    mem_res, cpu_res, disk_res = int(load.get("mem") or 0), int(load.get("cpu") or 0), int(load.get("disk_mib") or 0)
    reasons = []
    reserve = pol["mem_reserve_mib"]
    mem_left = mem_total - mem_used - mem_res - reserve - req["mem"]
    if mem_left < 0:
        reasons.append(
            f"memory: needs {req['mem']} MiB, {max(mem_total - mem_used - mem_res - reserve, 0)} MiB free "
            f"({mem_total} total - {mem_used} used by running VMs"
            + (f" - {mem_res} reserved{held}" if inflight else "")
            + f" - {reserve} reserve)"
        )
    cap = cpus * pol["cpu_overcommit"]
    cpu_left = cap - cpus_used - cpu_res - req["cpu"]
    if cpu_left < 0:
        reasons.append(
            f"vcpus: needs {req['cpu']}, {max(int(cap - cpus_used - cpu_res), 0)} left "
            f"({cpus} CPUs x {pol['cpu_overcommit']:g} overcommit = {cap:g}, {cpus_used} used by running VMs"
            + (f", {cpu_res} reserved{held}" if inflight else "")
            + ")"
        )
    disk_free = validate.int_or_none(facts.get("disk_free"))
    disk_left = None
    if disk_free is not None:
        disk_free -= disk_res
        disk_left = disk_free - pol["disk_reserve_mib"] - req["disk_mib"]
        if disk_left < 0:
            reasons.append(
                f"disk: needs {req['disk_mib']} MiB in {facts.get('images_dir') or 'virt:images'}, "
                f"{max(disk_free - pol['disk_reserve_mib'], 0)} MiB free "
                f"(after a {pol['disk_reserve_mib']} MiB reserve)"
            )
    elif req["disk_mib"]:
        reasons.append("disk: the host did not report free space in virt:images")
    group = req["group"]
    if group:
        members = _group_members(answer, facts, group)
        members += sorted(f"{n} (in flight)" for n, g in (load.get("groups") or {}).items() if g == group)
        if members:
            reasons.append(_anti_affinity(group, members))
    vms = validate.int_or_none(facts.get("vms_defined"))
    if vms is None:
        vms = len(answer.get("vm_info") or {})
    vms += inflight
    free = {
        "mem_mib": mem_left,
        "mem_frac": mem_left / mem_total,
        "vcpus": cpu_left,
        "cpu_frac": cpu_left / cap,
        "disk_mib": disk_left,
        "vms": vms,
    }
    return free, reasons


def _anti_affinity(group, members):
    """The reason a host with ``members`` of ``group`` cannot take the VM."""
    return f"anti-affinity: group {group!r} already has {', '.join(members)} here"


def fits(host: str, answer: Data, req: Data, pol: Data, load: Data | None = None) -> list[str]:
    """The reasons ``host`` cannot take ``req`` with ``load`` reserved there (empty: it fits)."""
    return _check(host, answer, req, pol, load)[1]


def _maintenance_re(patterns):
    """One compiled regex for every maintenance glob (None without any): a match per host, not per pattern."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None


def _fast_free(answer, host, need, maint_re):
    """The free-after tuple of a host that plainly fits (up, not in maintenance, nothing reserved there,
    room for everything, no member of the group); the sorted names of the group's members when they are
    all that is in the way; else None: :func:`_check` then says why (or handles what this does not).
    Plain arithmetic, no strings: most of a big fleet's hosts take this path.
    ``need``: (mem + reserve, cpu, overcommit, disk + reserve, disk asked, group) from :func:`rank`."""
    if answer.__class__ is not dict or answer.get("status", "up") != "up":
        return None
    if maint_re is not None and maint_re.match(host):
        return None
    facts = answer.get("host", answer)
    mem_need, cpu_need, overcommit, disk_need, disk_asked, group = need
    try:
        mem_total, cpus = int(facts["mem_total"]), int(facts["vcpus_total"])
        mem_left = mem_total - int(facts.get("mem_used_by_vms") or 0) - mem_need
        cap = cpus * overcommit
        cpu_left = cap - int(facts.get("vcpus_used_by_vms") or 0) - cpu_need
        disk_free = facts.get("disk_free")
        disk_left = None if disk_free is None else int(disk_free) - disk_need
        vms = int(facts["vms_defined"]) if "vms_defined" in facts else len(answer.get("vm_info") or {})
    except (KeyError, TypeError, ValueError):
        return None
    if mem_total <= 0 or cpus <= 0 or mem_left < 0 or cpu_left < 0:
        return None
    if (disk_left is None and disk_asked) or (disk_left is not None and disk_left < 0):
        return None
    if group:
        index = facts.get("groups")
        if not isinstance(index, dict) or index.get(group):  # a member may be here: name them
            members = _group_members(answer, facts, group)
            if members:
                return members
    return mem_left, mem_left / mem_total, cpu_left, cpu_left / cap, disk_left, vms


def _group_members(answer, facts, group):
    """Names of ``group``'s VMs on a host: its capacity answer's ``groups`` index, or a scan of ``vm_info``."""
    index = facts.get("groups")
    if isinstance(index, dict):
        return sorted(index.get(group) or ())
    return sorted(n for n, vm in (answer.get("vm_info") or {}).items() if (vm or {}).get("group") == group)


def _sift(hosts, req, pol, skip, reserved):
    """(hosts that fit as ``[(id, free-after tuple)]``, ``{id: reasons}`` of the others sorted by id)."""
    maint_re = _maintenance_re(pol["maintenance"])
    fits, excluded = [], {}
    need = (
        pol["mem_reserve_mib"] + req["mem"],
        req["cpu"],
        pol["cpu_overcommit"],
        pol["disk_reserve_mib"] + req["disk_mib"],
        req["disk_mib"],
        req["group"],
    )
    for host, answer in hosts.items():
        if host in skip:
            excluded[host] = skip[host]
            continue
        load = reserved.get(host)
        free = None if load else _fast_free(answer, host, need, maint_re)
        if free.__class__ is list:  # only the group's members are in the way
            excluded[host] = [_anti_affinity(req["group"], free)]
            continue
        if free is None:
            checked, reasons = _check(host, answer, req, pol, load, maint_re)
            if reasons:
                excluded[host] = reasons
                continue
            free = tuple(checked[k] for k in ("mem_mib", "mem_frac", "vcpus", "cpu_frac", "disk_mib", "vms"))
        fits.append((host, free))
    return fits, dict(sorted(excluded.items()))


def rank(
    hosts: dict[str, Data],
    req: Data,
    pol: Data | None = None,
    exclude: Iterable[str] | Mapping[str, list[str]] = (),
    reserved: dict[str, Data] | None = None,
    top: int | None = None,
) -> Data:
    """Rank ``hosts`` (``{id: facts}``) for ``req``; see the module doc. ``exclude``: hosts to pass over,
    ``{id: [reasons]}`` or ids (the reason: the caller already tried them). ``reserved``: ``{id: load}``
    of in-flight creations (``saltvirt.fleet.fleetstate.reserved``), counted as used capacity. ``top``:
    list only the best ``top`` hosts in ``ranking`` (all of them by default; ``fit`` counts them all).
    Returns::

    {"host": best id or None, "reason": one line, "fit": how many hosts fit,
     "ranking": [{"host", "score", "scores": {mem, cpu, disk, vms}, "free_after": {...}}, ...],
     "excluded": {id: [reasons]}, "request": req, "policy": pol}
    """
    pol = pol or make_policy()
    reserved = reserved or {}
    skip = dict(exclude) if isinstance(exclude, Mapping) else dict.fromkeys(exclude, [_BY_CALLER])
    fits, excluded = _sift(hosts, req, pol, skip, reserved)
    weights = pol["weights"]
    w_mem, w_cpu, w_disk, w_vms = (weights[k] for k in ("mem", "cpu", "disk", "vms"))
    terms = req.get("affinity") or ()
    total_w = sum(weights.values()) + sum(abs(t["weight"]) for t in terms)
    max_disk = max((f[4] or 0 for _h, f in fits), default=0)
    max_vms = max((f[5] for _h, f in fits), default=0)
    pack = pol["strategy"] == "pack"
    members = (
        {h: {t["group"]: _members(hosts[h], reserved.get(h), t["group"]) for t in terms} for h, _f in fits}
        if terms
        else {}
    )
    most_members = {t["group"]: max((m[t["group"]] for m in members.values()), default=0) for t in terms}

    def parts(host, free):
        raw = {
            "mem": free[1],
            "cpu": free[3],
            "disk": (free[4] or 0) / max_disk if max_disk > 0 else 1.0,
            "vms": 1.0 - free[5] / (max_vms + 1),
        }
        if pack:
            raw = {k: 1.0 - v for k, v in raw.items()}
        for term in terms:
            mine, most = members[host][term["group"]], most_members[term["group"]]
            frac = mine / most if most else 0.0
            raw[f"affinity:{term['group']}"] = frac if term["weight"] > 0 else 1.0 - frac
        return raw

    scored = []
    for host, free in fits:
        if terms:
            raw = parts(host, free)
            score = sum(weights[k] * raw[k] for k in ("mem", "cpu", "disk", "vms"))
            score += sum(abs(t["weight"]) * raw[f"affinity:{t['group']}"] for t in terms)
        else:  # the same sum, inline: no dict per host
            disk = (free[4] or 0) / max_disk if max_disk > 0 else 1.0
            vms = 1.0 - free[5] / (max_vms + 1)
            if pack:
                score = w_mem * (1 - free[1]) + w_cpu * (1 - free[3]) + w_disk * (1 - disk) + w_vms * (1 - vms)
            else:
                score = w_mem * free[1] + w_cpu * free[3] + w_disk * disk + w_vms * vms
        scored.append((-score / total_w, host, free))
    best_first = heapq.nsmallest(top, scored) if top is not None and top < len(scored) else sorted(scored)
    ranking = []
    for pos, (neg, host, free) in enumerate(best_first, 1):
        ranking.append(
            {
                "host": host,
                "score": round(-neg, 4),
                "scores": {k: round(v, 4) for k, v in parts(host, free).items()},
                "free_after": {
                    "mem_mib": free[0],
                    "vcpus": round(free[2], 2),
                    "disk_mib": free[4],
                    "vms": free[5],
                },
                "rank": pos,
            }
        )
    best = ranking[0]["host"] if ranking else None
    if best:
        reason = f"{best}: best {pol['strategy']} score {ranking[0]['score']} of {len(fits)} host(s) that fit" + (
            f"; {len(excluded)} excluded" if excluded else ""
        )
    elif hosts:
        reason = (
            f"no host can take a VM with {req['cpu']} vCPU(s), {req['mem']} MiB"
            + (f", {req['disk_mib']} MiB disk" if req["disk_mib"] else "")
            + (f" in group {req['group']!r}" if req["group"] else "")
            + ": see excluded"
        )
    else:
        reason = "no hypervisors found (see virt:hypervisors in the master config)"
    return {
        "host": best,
        "reason": reason,
        "fit": len(fits),
        "ranking": ranking,
        "excluded": excluded,
        "request": req,
        "policy": pol,
    }
