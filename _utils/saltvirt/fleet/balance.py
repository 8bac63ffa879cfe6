"""Continuous balancing (issue 38, opt-in): the decision core of a master-side loop that runs in rounds, after
Proxmox VE's automatic load balancer (threshold, hold time, margin). What runs the rounds (gathers the fleet, commits,
performs the moves with :func:`saltvirt.fleet.rebalance.apply`) is :mod:`saltvirt.fleet.balancer`.

:func:`decide` is one round, a pure function of the fleet's snapshot (``virt.full_info`` of every hypervisor,
what ``salt-run virt.rebalance`` reads), the policy (:func:`make_policy`), the state the previous rounds left
and ``now``. Loads and spread are :mod:`saltvirt.fleet.rebalance`'s (``metric: mem|vms``, hosts that answered
and are not in maintenance); where a VM may go is :func:`saltvirt.fleet.placement.rank`'s (room, anti-affinity,
soft affinity, maintenance), plus a tenant's own rules (its ``hypervisors``, and its hypervisor group quotas
through :func:`saltvirt.fleet.quota.move_refusals`). A round:

* a host is *over* when its load exceeds the least loaded host's by more than ``threshold``; the state keeps
  since when (``over_since``), and a host must stay over for ``hold_seconds`` before a VM leaves it, so a
  spike shorter than that moves nothing;
* off a held host (the most loaded first) it moves the biggest running VM that is not cooling down to the
  best-ranked host that takes it, if that makes the spread smaller by at least ``margin``: every move shrinks
  the spread, so with steady load the moves end, and a move cannot be undone by the reverse move (that
  would make the spread bigger again);
* at most ``max_moves_per_round`` moves; each is booked on the snapshot, so the next one sees it;
* a VM moved less than ``cooldown_seconds`` ago stays where it is (a failed move too: no retry storm), and
  one does not go back to the host it left for ``no_return_seconds``: when the load shifts back later, other
  VMs even it out, so no VM goes back and forth.

The answer explains every decision (``decisions``: a move, a host held back, a host nothing could leave, the
round's limit, a balanced fleet), fit to be fired as an event and kept in the bounded log of the shared store
(:func:`commit`, bank ``salt-virt/balance``).

Master config (``virt:balance``; every key optional; :data:`DEFAULTS`)::

    virt:
      balance:
        enabled: false             # opt-in: rounds run (and move VMs) only with true
        metric: mem                # or vms
        threshold: 0.10            # spread that makes a host over (mem: 0.10, vms: 2)
        hold_seconds: 300          # how long a host stays over before a VM leaves it
        margin: 0.02               # how much smaller a move must make the spread (mem: 0.02, vms: 1)
        max_moves_per_round: 1
        cooldown_seconds: 1800     # a moved VM stays where it went at least this long
        no_return_seconds: 86400   # ... and does not go back to the host it left for this long
"""

import copy
from dataclasses import dataclass, field
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import section
from saltvirt.base.salttypes import Data
from saltvirt.fleet import fleetstate, placement, quota, rebalance, tenants

BANK = "salt-virt/balance"
STATE = "state"  # the rounds' state: one entry, replaced under compare-and-set by the master that ran the round
JOURNAL = fleetstate.Journal(BANK)  # the decisions of the last rounds: salt-run virt.balance_log
TAG = "salt/virt/balance/round"  # one event per round (progress only: never a source of decisions)
DEFAULTS: Data = {
    "enabled": False,  # opt-in (saltvirt.fleet.balancer runs no round without it)
    "metric": "mem",
    "threshold": None,  # rebalance.METRICS[metric]
    "hold_seconds": 300.0,
    "margin": None,  # MARGINS[metric]
    "max_moves_per_round": 1,
    "cooldown_seconds": 1800.0,
    "no_return_seconds": 86400.0,
}
MARGINS = {"mem": 0.02, "vms": 1}
EXCLUDED_SHOWN = 3  # hosts a "no target" reason names (the fleet may have hundreds)

# what a decision is (its ``decision``); a VM that stays on a host says why in one of VM_REASONS
MOVE, HOLD, STAY, LIMIT, BALANCED = "move", "hold", "stay", "max_moves", "balanced"
COOLDOWN, NO_TARGET, MARGIN = "cooldown", "no_target", "margin"
VM_REASONS = (COOLDOWN, NO_TARGET, MARGIN)


@dataclass(frozen=True)
class Tenancy:
    """What binds a tenant's VMs in a move: ``tenants`` (``{name: checked config}``, the ``tenants`` of
    :func:`saltvirt.fleet.tenants.config`), ``ledgers`` (``{name: quota ledger}``, the store's
    :data:`saltvirt.fleet.quota.QUOTAS` entries) and ``since`` (when the snapshot was taken)."""

    tenants: dict[str, Data] = field(default_factory=dict)
    ledgers: dict[str, Data] = field(default_factory=dict)
    since: float = 0.0


# the policy -------------------------------------------------------------------------------------------
def make_policy(config: Data | None = None, placement_policy: Data | None = None, **overrides: Any) -> Data:
    """The effective policy: :data:`DEFAULTS` < ``config`` (master ``virt:balance``) < ``overrides`` (None:
    not given), checked; ``placement`` is ``placement_policy`` (:func:`saltvirt.fleet.placement.make_policy`:
    maintenance, weights, reserves), its defaults without one."""
    merged = dict(DEFAULTS)
    for source in (config or {}, {k: v for k, v in overrides.items() if v is not None}):
        merged.update(section(source, "virt:balance", sorted(DEFAULTS)))
    metric = merged["metric"]
    try:
        threshold = rebalance.threshold_for(metric, merged["threshold"])
    except SaltInvocationError as exc:
        raise SaltInvocationError(f"virt:balance:{exc}") from None
    margin = MARGINS[metric] if merged["margin"] is None else merged["margin"]
    try:
        margin = float(margin)
    except (TypeError, ValueError):
        margin = float("nan")
    if not margin > 0:  # 0 would let moves that change nothing go on for ever
        raise SaltInvocationError(f"virt:balance:margin must be a number above 0, not {merged['margin']!r}")
    return {
        "enabled": validate.to_bool(merged["enabled"]),
        "metric": metric,
        "threshold": threshold,
        "hold_seconds": validate.seconds(merged["hold_seconds"], "virt:balance:hold_seconds"),
        "margin": margin,
        "max_moves_per_round": validate.positive_int(merged["max_moves_per_round"], "virt:balance:max_moves_per_round"),
        "cooldown_seconds": validate.seconds(merged["cooldown_seconds"], "virt:balance:cooldown_seconds"),
        "no_return_seconds": validate.seconds(merged["no_return_seconds"], "virt:balance:no_return_seconds"),
        "placement": placement_policy or placement.make_policy(),
    }


# the one wording of each decision and reason ------------------------------------------------------------
def _g(value: Any) -> str:
    return f"{value:g}"


def _hold_reason(host, load, least, least_load, threshold, held, hold):
    return (
        f"{host}: load {_g(load)} is above {least}'s {_g(least_load)} by more than the threshold {_g(threshold)} "
        f"for {_g(held)} s of hold_seconds {_g(hold)}: waiting"
    )


def _cooldown_reason(name, rec, now, cooldown):
    return (
        f"{name} moved {_g(round(now - rec['at']))} s ago ({rec['from']} -> {rec['to']}), "
        f"within cooldown_seconds {_g(cooldown)}: it stays"
    )


def _no_target_reason(name, ranked):
    excluded = ranked["excluded"]
    shown = "; ".join(f"{h}: {', '.join(why)}" for h, why in list(excluded.items())[:EXCLUDED_SHOWN])
    more = f"; {len(excluded) - EXCLUDED_SHOWN} more" if len(excluded) > EXCLUDED_SHOWN else ""
    return f"{name}: no other host can take it ({shown}{more})"


def _margin_reason(name, gain, target, margin):
    return f"{name}: its best move (to {target}) makes the spread smaller by {_g(gain)}, below the margin {_g(margin)}"


def _stay_reason(host, why):
    counts = {kind: sum(1 for r in why.values() if r["why"] == kind) for kind in VM_REASONS}
    parts = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    return f"{host}: no running VM can leave it ({parts or 'it runs none'})"


def _limit_reason(hosts, limit, spread_now):
    return f"stopped after max_moves_per_round={limit}; spread still {_g(spread_now)} (over: {', '.join(hosts)})"


def _balanced_reason(spread_now, threshold):
    return f"spread {_g(spread_now)} is within the threshold {_g(threshold)}: nothing to do"


SOURCE = "the VM is here"
RETURN = "the VM left it {ago} s ago, within no_return_seconds {limit}"
OUTSIDE = "tenant {tenant} may not use this hypervisor (virt:tenants:{tenant}:hypervisors)"


# one round --------------------------------------------------------------------------------------------
def decide(
    hosts: dict[str, Data], policy: Data, state: Data | None, now: float, tenancy: Tenancy | None = None
) -> Data:
    """One round (see the module doc). Pure: ``hosts`` and ``state`` are not changed. Returns::

    {"round": n, "at": now, "metric", "threshold", "margin", "spread_before", "spread_after",
     "load_before": {host: load}, "load_after": {...}, "moves": [move], "decisions": [record],
     "state": {round, at, over_since: {host: since}, moved: {vm: {at, from, to}}}}

    A move has what :func:`saltvirt.fleet.rebalance.apply` runs (``vm``, ``from``, ``to``, ``score``,
    ``spread_after``) and why; each record has ``round``, ``at``, ``decision`` and a one-line ``reason``."""
    state = state or {}
    pol, metric, threshold = policy["placement"], policy["metric"], policy["threshold"]
    rnd = int(state.get("round") or 0) + 1
    hosts = copy.deepcopy(hosts)
    before = rebalance.loads(hosts, metric, pol)
    over = _over(before, threshold)
    since = {h: float((state.get("over_since") or {}).get(h, now)) for h in over}
    keep = max(policy["cooldown_seconds"], policy["no_return_seconds"])
    moved = {n: dict(r) for n, r in (state.get("moved") or {}).items() if now - r["at"] < keep}
    held = [h for h in over if now - since[h] >= policy["hold_seconds"]]
    decisions: list[Data] = []

    def record(decision: str, reason: str, **detail: Any) -> None:
        decisions.append({"round": rnd, "at": now, "decision": decision, "reason": reason, **detail})

    if not over:
        record(BALANCED, _balanced_reason(rebalance.spread(before), threshold))
    least = min(before, key=lambda h: (before[h], h)) if before else ""
    for host in sorted(set(over) - set(held)):
        held_for = now - since[host]
        reason = _hold_reason(host, before[host], least, before[least], threshold, held_for, policy["hold_seconds"])
        record(HOLD, reason, host=host, load=before[host], over_since=since[host])
    current = dict(before)
    moves: list[Data] = []
    while True:
        sources = sorted(_over(current, threshold).keys() & set(held), key=lambda h: (-current[h], h))
        if not sources:
            break
        if len(moves) >= policy["max_moves_per_round"]:
            spread_now = rebalance.spread(current)
            record(LIMIT, _limit_reason(sources, policy["max_moves_per_round"], spread_now), hosts=sources)
            break
        stays: dict[str, dict[str, Data]] = {}
        move = None
        for source in sources:
            move, stays[source] = _move_off(hosts, policy, current, source, moved, tenancy, now)
            if move:
                break
        if not move:
            for source in sources:
                record(STAY, _stay_reason(source, stays[source]), host=source, load=current[source], vms=stays[source])
            break
        rebalance.book_move(hosts, move["vm"], move["from"], move["to"])
        current = rebalance.loads(hosts, metric, pol)
        moved[move["vm"]] = {"at": now, "from": move["from"], "to": move["to"]}
        moves.append(move)
        record(MOVE, move["reason"], host=move["from"], **{k: move[k] for k in ("vm", "to", "load", "spread", "gain")})
    return {
        "round": rnd,
        "at": now,
        "metric": metric,
        "threshold": threshold,
        "margin": policy["margin"],
        "spread_before": rebalance.spread(before),
        "spread_after": rebalance.spread(current),
        "load_before": before,
        "load_after": current,
        "moves": moves,
        "decisions": decisions,
        "state": {"round": rnd, "at": now, "over_since": since, "moved": moved},
    }


def _over(loads: dict[str, float | int], threshold: float) -> dict[str, float | int]:
    """The hosts whose load exceeds the least loaded host's by more than ``threshold``."""
    if len(loads) < 2:
        return {}
    least = min(loads.values())
    return {h: v for h, v in loads.items() if round(v - least, 4) > threshold}


def _move_off(hosts, policy, current, source, moved, tenancy, now):
    """``(move or None, {vm: {why, reason}} of the VMs of source that stay)``: the biggest running VM not
    cooling down whose move to the best-ranked host that takes it (not the one it left: ``moved``) shrinks the
    spread by ``margin``."""
    pol, margin = policy["placement"], policy["margin"]
    spread_now = rebalance.spread(current)
    stays: dict[str, Data] = {}
    for name, vm in rebalance.running_vms(hosts[source]):
        last = moved.get(name)
        if last and now - last["at"] < policy["cooldown_seconds"]:
            stays[name] = {"why": COOLDOWN, "reason": _cooldown_reason(name, last, now, policy["cooldown_seconds"])}
            continue
        exclude = {source: [SOURCE], **_tenant_exclusions(hosts, name, vm, source, tenancy, now)}
        if last and now - last["at"] < policy["no_return_seconds"] and last["from"] != source:
            ago, limit = _g(round(now - last["at"])), _g(policy["no_return_seconds"])
            exclude.setdefault(last["from"], []).append(RETURN.format(ago=ago, limit=limit))
        ranked = placement.rank(hosts, rebalance.vm_request(vm), pol, exclude=exclude)
        targets = [entry for entry in ranked["ranking"] if entry["host"] in current]
        if not targets:
            stays[name] = {"why": NO_TARGET, "reason": _no_target_reason(name, ranked)}
            continue
        gains = []
        for entry in targets:
            after = rebalance.loads_after(hosts, current, policy["metric"], pol, name, source, entry["host"])
            gain = round(spread_now - rebalance.spread(after), 4)
            if gain >= margin:
                return _move(name, source, entry, len(targets), current, after, spread_now, gain, stays, margin), stays
            gains.append((gain, entry["host"]))
        gain, to = max(gains, key=lambda g: g[0])  # the first best in placement's order
        stays[name] = {"why": MARGIN, "reason": _margin_reason(name, gain, to, margin)}
    return None, stays


def _tenant_exclusions(hosts, name, vm, source, tenancy, now):
    """``{host: [reason]}`` a tenant's VM may not move to: outside its ``hypervisors``, or into a hypervisor
    group whose quota has no room for it (read-only: the engine's :func:`saltvirt.fleet.quota.move` decides)."""
    tenant = ((vm or {}).get("owner") or {}).get("tenant")
    if not tenancy or not tenant or tenant not in tenancy.tenants:
        return {}  # an operator's VM (or a tenant no longer configured): placement's rules only
    conf = tenancy.tenants[tenant]
    targets = sorted(set(hosts) - {source})
    out = {host: [OUTSIDE.format(tenant=tenant)] for host in targets if not tenants.host_allowed(conf, host)}
    inside = [host for host in targets if host not in out]
    ledger = tenancy.ledgers.get(tenant)
    refused = quota.move_refusals(ledger, hosts, tenant, name, source, inside, tenancy.since, conf.get("groups"), now)
    out.update({host: [why] for host, why in refused.items()})
    return out


def _move(name, source, entry, fit, current, after, spread_now, gain, stays, margin):
    target = entry["host"]
    skipped = f"; bigger ones stay: {', '.join(stays)}" if stays else ""
    better = f"; the {entry['rank'] - 1} ranked above it shrink the spread less" if entry["rank"] > 1 else ""
    spread_after = rebalance.spread(after)
    load = {source: [current[source], after[source]], target: [current[target], after[target]]}
    return {
        "vm": name,
        "from": source,
        "to": target,
        "score": entry["score"],
        "spread_after": spread_after,
        "spread": [spread_now, spread_after],
        "gain": gain,
        "load": load,
        "why_vm": f"the biggest running VM of {source} not cooling down whose move helps{skipped}",
        "why_target": f"placement rank {entry['rank']} (score {entry['score']}) of {fit} host(s) that fit{better}",
        "reason": (
            f"move {name} from {source} ({_g(load[source][0])} -> {_g(load[source][1])}) to {target} "
            f"({_g(load[target][0])} -> {_g(load[target][1])}): spread {_g(spread_now)} -> {_g(spread_after)}, "
            f"smaller by {_g(gain)} (margin {_g(margin)})"
        ),
    }


# the shared state: several masters, one round at a time ---------------------------------------------------
def load_state(store: fleetstate.Store) -> Data:
    """The state the last committed round left (empty before the first)."""
    return store.fetch(BANK, STATE) or {}


def commit(store: fleetstate.Store, result: Data, keep: int | None = None) -> bool:
    """Store round ``result``'s state if no master committed a round since the state it was decided from
    (compare-and-set on the round number), then add its decisions to the log (the last ``keep``). False: another
    master ran this round first; this one's moves must not be made (decide again from the new state). ``keep``: None
    is the journal's size."""
    new = result["state"]

    def update(old: Data | None) -> Data:
        if int((old or {}).get("round") or 0) != new["round"] - 1:
            raise fleetstate.AbortUpdate
        return new

    try:
        store.transact(BANK, STATE, update)
    except fleetstate.AbortUpdate:
        return False
    JOURNAL.append(store, result["decisions"], keep)
    return True


def event_data(result: Data) -> Data:
    """What is fired for a round (tag :data:`TAG`): the result without its state."""
    return {k: v for k, v in result.items() if k != "state"}
