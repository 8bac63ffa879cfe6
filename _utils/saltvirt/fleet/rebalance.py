"""Rebalancing the fleet: ``salt-run virt.rebalance`` proposes (dry run, the default) or performs
(``apply=True``) live migrations that bring the hypervisors' load within a spread threshold.

:func:`plan` is a pure function over the hosts' facts (``virt.full_info`` of every hypervisor, the
shape :mod:`saltvirt.fleet.placement` reads). A host's load:

* ``metric: mem`` (the default): memory of its running VMs / (``mem_total`` - ``mem_reserve_mib``), 0..1;
* ``metric: vms``: the number of its running VMs.

The spread is the most loaded host's load minus the least loaded one's, over the hosts that answered
and are not in ``maintenance``. While the spread is above ``threshold`` (mem: 0.10, vms: 2 by default)
and fewer than ``max_moves`` moves are planned, it takes the most loaded host's running VMs (biggest
first; then the next most loaded host's, if none of them helps) and moves the first one that placement
allows somewhere (memory, vCPUs, anti-affinity, soft affinity, maintenance:
:func:`saltvirt.fleet.placement.rank`, the source excluded) whose move makes the spread smaller, trying the
targets in placement's order. Each planned move is booked on the facts, so the next one sees it.
Only running VMs move (live), so their guests never stop.

:func:`apply` runs the planned moves one by one with :func:`saltvirt.fleet.relocate.migrate` (per-VM lock,
shared-storage probe, disk copy when not shared); a move that fails is reported and the rest go on.
"""

import copy
import math
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.fleet import placement, publish, relocate

METRICS = {"mem": 0.10, "vms": 2}
RUNNING = ("running", "blocked")


def _mem(vm):
    try:
        return int(vm.get("mem") or 0)
    except (TypeError, ValueError):
        return 0


def load(answer: Data, metric: str, pol: Data) -> float | int | None:
    """One host's load (see the module doc), or None when it has no usable facts."""
    vms = [vm for vm in (answer.get("vm_info") or {}).values() if (vm or {}).get("state") in RUNNING]
    if metric == "vms":
        return len(vms)
    facts = answer.get("host") or {}
    try:
        room = int(facts["mem_total"]) - pol["mem_reserve_mib"]
    except (KeyError, TypeError, ValueError):
        return None
    used = facts.get("mem_used_by_vms")
    used = int(used) if used is not None else sum(_mem(vm) for vm in vms)
    return round(used / room, 4) if room > 0 else None


def loads(hosts: dict[str, Data], metric: str, pol: Data) -> dict[str, float | int]:
    out = {}
    for host in sorted(hosts):
        ans = hosts[host]
        if ans.get("status") != "up" or placement.in_maintenance(host, pol["maintenance"]):
            continue
        value = load(ans, metric, pol)
        if value is not None:
            out[host] = value
    return out


def spread(values: dict[str, float | int]) -> float | int:
    return round(max(values.values()) - min(values.values()), 4) if len(values) > 1 else 0


def book_move(hosts: dict[str, Data], name: str, source: str, target: str) -> None:
    """Book VM ``name``'s move from ``source`` to ``target`` on the facts ``hosts`` (changed in place), so the
    next plan step sees it: its memory, vCPUs and VM count leave ``source`` and land on ``target``."""
    vm = hosts[source]["vm_info"][name]
    for host, sign in ((source, -1), (target, 1)):
        facts = hosts[host].setdefault("host", {})
        facts["mem_used_by_vms"] = int(facts.get("mem_used_by_vms") or 0) + sign * _mem(vm)
        facts["vcpus_used_by_vms"] = int(facts.get("vcpus_used_by_vms") or 0) + sign * int(vm.get("cpu") or 0)
        facts["vms_defined"] = int(facts.get("vms_defined") or 0) + sign
    hosts[target].setdefault("vm_info", {})[name] = hosts[source]["vm_info"].pop(name)


def loads_after(
    hosts: dict[str, Data], current: dict[str, float | int], metric: str, pol: Data, name: str, source: str, target: str
) -> dict[str, float | int]:
    """``current`` loads as they would be once VM ``name`` moved from ``source`` to ``target`` (``hosts`` kept)."""
    trial = copy.deepcopy({source: hosts[source], target: hosts[target]})
    book_move(trial, name, source, target)
    after = dict(current)
    for host in (source, target):
        value = load(trial[host], metric, pol)
        if value is not None:
            after[host] = value
    return after


def running_vms(answer: Data) -> list[tuple[str, Data]]:
    """A host's running VMs (the ones a live migration moves), biggest memory first, then by name."""
    vms = {n: vm for n, vm in (answer.get("vm_info") or {}).items() if (vm or {}).get("state") in RUNNING}
    return [(n, vms[n]) for n in sorted(vms, key=lambda n: (-_mem(vms[n]), n))]


def vm_request(vm: Data) -> Data:
    """The placement request of a running VM (``vm``: its ``vm_info`` entry) that is to move elsewhere."""
    return placement.make_request(vm.get("cpu") or 1, max(_mem(vm), 1), 0, vm.get("group"), affinity=vm.get("affinity"))


def threshold_for(metric: str, threshold: Any) -> float:
    """The checked spread threshold of ``metric`` (its default when ``threshold`` is None)."""
    if metric not in METRICS:
        raise SaltInvocationError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    try:
        value = float(METRICS[metric] if threshold is None else threshold)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"threshold must be a number, not {threshold!r}") from None
    if math.isnan(value) or value < 0:
        raise SaltInvocationError(f"threshold must be >= 0, not {threshold!r}")
    return value


def _check(metric, threshold, max_moves):
    return threshold_for(metric, threshold), validate.positive_int(max_moves, "max_moves")


def _next_move(hosts, pol, metric, current, now):
    """The first move that makes the spread smaller, off the most loaded host that has one, or None."""
    for source in sorted(current, key=lambda h: (-current[h], h)):
        move = _move_from(hosts, pol, metric, current, now, source)
        if move:
            return move
    return None


def _move_from(hosts, pol, metric, current, now, source):
    for name, vm in running_vms(hosts[source]):
        ranked = placement.rank(hosts, vm_request(vm), pol, exclude=[source])
        for entry in ranked["ranking"]:
            target = entry["host"]
            if target not in current:
                continue
            after = loads_after(hosts, current, metric, pol, name, source, target)
            if spread(after) < now:
                return {
                    "vm": name,
                    "from": source,
                    "to": target,
                    "score": entry["score"],
                    "spread_after": spread(after),
                }
    return None


def plan(
    hosts: dict[str, Data], pol: Data | None = None, metric: str = "mem", threshold: Any = None, max_moves: Any = 10
) -> Data:
    """The moves that bring ``hosts`` within ``threshold`` (see the module doc). Pure: ``hosts`` is
    not changed. ``{metric, threshold, spread_before, spread_after, load_before, load_after, moves,
    balanced, reason}``."""
    pol = pol or placement.make_policy()
    threshold, max_moves = _check(metric, threshold, max_moves)
    hosts = copy.deepcopy(hosts)
    before = loads(hosts, metric, pol)
    moves: list[Data] = []
    current = dict(before)
    reason = None
    while True:
        now = spread(current)
        if now <= threshold:
            reason = f"spread {now:g} is within the threshold {threshold:g}"
            break
        if len(moves) >= max_moves:
            reason = f"stopped after max_moves={max_moves}; spread still {now:g}"
            break
        move = _next_move(hosts, pol, metric, current, now)
        if not move:
            reason = f"no live migration makes the spread ({now:g}) smaller: placement allows none that helps"
            break
        book_move(hosts, move["vm"], move["from"], move["to"])
        current = loads(hosts, metric, pol)
        moves.append(move)
    return {
        "metric": metric,
        "threshold": threshold,
        "spread_before": spread(before),
        "spread_after": spread(current),
        "load_before": before,
        "load_after": current,
        "moves": moves,
        "balanced": spread(current) <= threshold,
        "reason": reason,
    }


def apply(
    remote: publish.Fleet,
    proposal: Data,
    checks: Callable[[Data], Data | None] | None = None,
    **migrate_kwargs: Any,
) -> Data:
    """Perform the planned moves one by one (:func:`saltvirt.fleet.relocate.migrate`): ``{moved, failed}``.
    ``checks(move)``: the placement checks ``virt.migrate`` makes on that move's target
    (:func:`saltvirt.fleet.relocate.placement_checks`: room reserved there, a tenant's quotas); None: none."""
    moved, failed = {}, {}
    for move in proposal["moves"]:
        name = move["vm"]
        try:
            todo = checks(move) if checks else None
            moved[name] = relocate.migrate(remote, name, move["to"], source=move["from"], checks=todo, **migrate_kwargs)
        except CommandExecutionError as exc:
            failed[name] = {"error": str(exc), **getattr(exc, "details", {})}
        except SaltInvocationError as exc:  # held by another call, or already moved meanwhile
            failed[name] = {"error": str(exc)}
    return {"moved": moved, "failed": failed}
