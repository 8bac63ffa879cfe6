"""Tenant quotas (``virt:tenants:<t>:quota``), taken atomically with placement reservations.

What a tenant uses is counted from two sources, by VM name (a VM is counted once):

* the fleet snapshot (``virt.full_info`` of every hypervisor): every VM whose <metadata> owner is the tenant,
  with the bigger of its running and its persistent definition's vCPUs and memory (:func:`size`: a growth
  that waits for a restart counts at once), its disk as its quota entry recorded it (``virt.init``'s disks, and
  what updates added, an operator's too: :func:`record`), else its disks' sizes;
* the tenant's ledger (bank ``salt-virt/quotas``, one entry per tenant, in the same store and under the same
  compare-and-set as :mod:`saltvirt.fleet.fleetstate` reservations): ``{entries: {vm: {cpu, mem, disk_mib,
  token, state: active|settled, expires, settled_at}}}``. An ``active`` entry (a ``virt.init`` at work)
  counts until it expires (renewed with its lease); a ``settled`` one (the VM was created) counts for
  snapshots taken before it settled, and while a hypervisor did not answer (its VMs may be there). Settled
  entries stay while their VM exists: ``virt.purge`` drops them, and a snapshot in which every hypervisor
  answered and the VM is gone prunes them. A snapshot in which a hypervisor did not answer prunes nothing
  (an expired creation's entry neither: its VM may be there); the snapshot is always every hypervisor's,
  whatever ``tgt`` a call passes.
* growth entries (``<vm>/update``, ``grows: <vm>``): what a ``salt-run virt.update`` adds to an existing VM
  (the positive part of its vCPU, memory and disk change; no VM). Active while the update runs; once it is
  done the VM's own entry takes the new sizes and the growth entry, settled, counts only for snapshots
  taken before it settled (those still show the VM's old sizes).
* move entries (``<vm>/migrate``, ``moves: <vm>``): a tenant's ``salt-run virt.migrate`` to a hypervisor of one
  of its hypervisor groups (:func:`move`). The VM counts in the tenant's total already: the entry counts only
  in those groups, until the snapshot shows the VM there.

:func:`reserve` re-counts and checks the quota inside the transaction, so two masters or twenty concurrent
``virt.init``/``virt.update`` calls of one tenant never take more than its quota together.
"""

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import Data
from saltvirt.fleet import fleetstate
from saltvirt.fleet.tenants import QUOTA_KEYS, host_allowed, in_groups

QUOTAS = "salt-virt/quotas"
MIB = 1048576
GROWS = "/update"  # a growth entry's key: <vm>/update ('/' is in no VM name)
MOVES = "/migrate"  # a move entry's key: <vm>/migrate


class QuotaError(SaltInvocationError):
    """The request would take the tenant over its quota; ``usage`` has the figures."""

    def __init__(self, message, usage):
        super().__init__(message)
        self.usage = usage


def _down(hosts):
    return any((ans or {}).get("status") != "up" for ans in hosts.values())


def size(vm: Data, key: str) -> int:
    """What the quota counts of a VM's ``cpu`` or ``mem`` (``vm``: its ``virt.full_info`` entry): the bigger of
    the running VM's and its persistent definition's (``defined``), which it gets at its next start."""
    return max(int(vm.get(key) or 0), int((vm.get("defined") or {}).get(key) or 0))


def _vm_disk_mib(vm):
    sizes = [(d or {}).get("virtual_size") for d in ((vm or {}).get("disks") or {}).values()]
    return sum(math.ceil(int(s) / MIB) for s in sizes if s)


def counted(vm: Data, store: fleetstate.Store | None = None, tenant: str | None = None) -> Data:
    """``{cpu, mem, disk_mib}`` that :func:`count` counts of a VM (``vm``: its ``virt.full_info`` entry): :func:`size`
    of its vCPUs and memory, and the disk of its entry in ``tenant``'s ledger (in ``store``), else its disks' sizes."""
    rec = ((store.fetch(QUOTAS, tenant) or {}).get("entries") or {}).get(vm.get("name")) if store and tenant else None
    disk = int(rec.get("disk_mib") or 0) if rec else _vm_disk_mib(vm)
    return {"cpu": size(vm, "cpu"), "mem": size(vm, "mem"), "disk_mib": disk}


def tenant_vms(hosts: dict[str, Data], tenant: str) -> dict[str, tuple[str, Data]]:
    """``{vm: (host, vm_info)}`` of every VM the snapshot shows with ``tenant`` in its <metadata>."""
    out = {}
    for host, ans in sorted(hosts.items()):
        if (ans or {}).get("status") != "up":
            continue
        for name, vm in ((ans.get("vm_info") or {}) if "vm_info" in ans else {}).items():
            if ((vm or {}).get("owner") or {}).get("tenant") == tenant:
                out[name] = (host, vm)
    return out


def count(
    ledger: Data | None,
    hosts: dict[str, Data],
    tenant: str,
    since: float,
    now: float | None = None,
    skew: float = fleetstate.DEFAULTS["clock_skew"],
    on: Callable[[str | None], bool] | None = None,
) -> Data:
    """``{vcpus, mem, disk, vms, names: [...]}`` the tenant uses (see the module doc); ``on(host)``: only
    on these hypervisors (a hypervisor group: the VMs the snapshot shows there, and the ledger entries
    placed there)."""
    now = now or time.time()
    entries = (ledger or {}).get("entries") or {}
    used: Data = {"vcpus": 0, "mem": 0, "disk": 0, "vms": 0, "names": []}
    seen = tenant_vms(hosts, tenant)
    down = _down(hosts)
    if on is not None:
        entries = {n: r for n, r in entries.items() if n in seen or on(r.get("host"))}
    for name, (host, vm) in seen.items():
        if on is not None and not on(host):
            continue
        rec = entries.get(name) or {}
        used["vcpus"] += size(vm, "cpu")
        used["mem"] += size(vm, "mem")
        used["disk"] += int(rec.get("disk_mib") or 0) if rec else _vm_disk_mib(vm)
        used["names"].append(name)
    for name, rec in sorted(entries.items()):
        if name in seen or not _counts(rec, down, since, now, skew):
            continue
        if rec.get("moves"):
            _moved(used, rec, seen, on)
            continue
        grown = _grown(rec, seen, entries) if rec.get("grows") else rec
        used["vcpus"] += int(grown.get("cpu") or 0)
        used["mem"] += int(grown.get("mem") or 0)
        used["disk"] += int(grown.get("disk_mib") or 0)
        if not rec.get("grows"):  # a growth entry is no VM of its own
            used["names"].append(name)
    used["vms"] = len(used["names"])
    return used


def _moved(used, rec, seen, on):
    """Count a move entry (that counts) in a hypervisor group's view (``on``) until the snapshot shows its VM
    in the group: never in the tenant's total, where the VM counts wherever it is."""
    vm_name = rec["moves"]
    if on is None or vm_name in used["names"] or (vm_name in seen and on(seen[vm_name][0])):
        return
    used["vcpus"] += int(rec.get("cpu") or 0)
    used["mem"] += int(rec.get("mem") or 0)
    used["disk"] += int(rec.get("disk_mib") or 0)
    used["names"].append(vm_name)


def _grown(rec, seen, entries):
    """What a growth entry (that counts) adds to the snapshot: of its vCPUs and memory what the VM the
    snapshot shows lacks of the update's target sizes (``to``: none once it shows them); its disk while
    the update runs, or until the VM's own entry has it (once settled)."""
    settled = rec.get("state") == "settled"
    vm_name = rec["grows"]
    out = {"disk_mib": 0 if settled and vm_name in entries else rec.get("disk_mib")}
    for key in ("cpu", "mem"):
        delta = int(rec.get(key) or 0)
        if vm_name in seen:
            target = int((rec.get("to") or {}).get(key) or 0)
            delta = min(delta, max(0, target - size(seen[vm_name][1], key)))
        elif settled:
            delta = 0  # the VM's own entry has its new sizes
        out[key] = delta
    return out


def _counts(rec, down, since, now, skew):
    """Whether a ledger entry whose VM the snapshot does not show counts (see the module doc)."""
    if rec.get("state") != "settled":
        return rec.get("expires", 0) > now
    # a settled growth (move) entry: only snapshots taken before it settled show the VM's old sizes (host)
    return (down and not rec.get("grows") and not rec.get("moves")) or rec.get("settled_at", 0) >= since - skew


def _prune(entries, hosts, tenant, since, now, skew):
    """Drop expired active entries, settled ones whose VM a complete snapshot no longer shows, and settled
    growth entries every later snapshot has (the VM's new sizes); nothing while a hypervisor did not answer."""
    seen, down = tenant_vms(hosts, tenant), _down(hosts)
    if down:  # any entry's VM may be on the silent host: an expired creation's too (it may have finished there)
        return entries
    return {
        n: r
        for n, r in entries.items()
        if _counts(r, down, since, now, skew) or (n in seen and r.get("state") == "settled" and not r.get("grows"))
    }


def refusal(tenant: str, used: Data, quota: Data, asked: Data, group: str | None = None) -> str | None:
    """Why a request ``asked`` ({vcpus, mem, disk, vms}) does not fit: "tenant acme: 15 of 16 vCPUs used,
    asked 2" (every exceeded limit, "; "-joined; on hypervisor group ``group``: "tenant acme on hypervisor
    group gpu: ..."), or None when it fits."""
    reasons = [
        f"{used[key]} of {quota[key]} {unit} used, asked {asked[key]}"
        for key, unit in QUOTA_KEYS.items()
        if key in quota and used[key] + asked[key] > quota[key]
    ]
    where = f" on hypervisor group {group}" if group else ""
    return f"tenant {tenant}{where}: {'; '.join(reasons)}" if reasons else None


def _on(group: Data) -> Callable[[str | None], bool]:
    """Whether a hypervisor is one of hypervisor group ``group``'s (a tenant's checked ``groups`` entry)."""
    return lambda host: host_allowed(group, host) if host else False


def _group_refusal(entries, hosts, tenant, since, now, skew, host, groups, asked):
    """:func:`refusal` for every hypervisor group (a tenant's ``groups``) ``host`` is in, or None."""
    for group in in_groups(groups or {}, host):
        conf = groups[group]
        used = count({"entries": entries}, hosts, tenant, since, now, skew, on=_on(conf))
        reasons = refusal(tenant, used, conf["quota"], asked, group)
        if reasons:
            return reasons, used
    return None


def reserve(
    store: fleetstate.Store,
    lease: fleetstate.Lease,
    tenant: str,
    name: str,
    req: Data,
    hosts: dict[str, Data],
    since: float,
    quota: Data,
    cfg: Data | None = None,
    grow: Data | None = None,
    host: str | None = None,
    groups: Data | None = None,
) -> Any:
    """Take ``req`` ({cpu, mem, disk_mib}) for VM ``name`` from ``tenant``'s quota, atomically (the usage is
    re-counted inside the compare-and-set). ``grow``: the sizes ``virt.update`` gives the existing VM ``name``
    ({cpu, mem}, each optional) and ``req`` what that adds (a growth entry: no VM counted). ``host``: where
    it is (a growth) and then ``groups`` (the tenant's per hypervisor group quotas) are checked too;
    without it :func:`place` checks them once placement chose one. Raises :class:`QuotaError` with every
    exceeded limit. The entry is renewed with ``lease`` and ended by :func:`finish`."""
    cfg = cfg or lease.cfg
    now = time.time()
    key = name + GROWS if grow else name
    asked = {
        "vcpus": int(req["cpu"]),
        "mem": int(req["mem"]),
        "disk": int(req.get("disk_mib") or 0),
        "vms": int(not grow),
    }
    refused: list[tuple[str, Data]] = []

    def update(old):
        refused.clear()
        entries = _prune(dict((old or {}).get("entries") or {}), hosts, tenant, since, now, cfg["clock_skew"])
        entries.pop(key, None)  # a stale one of ours (retry after a dead master) is replaced
        used = count({"entries": entries}, hosts, tenant, since, now, cfg["clock_skew"])
        reasons = refusal(tenant, used, quota, asked)
        if reasons:
            refused.append((reasons, used))
            raise fleetstate.AbortUpdate
        group = _group_refusal(entries, hosts, tenant, since, now, cfg["clock_skew"], host, groups, asked)
        if group:
            refused.append(group)
            raise fleetstate.AbortUpdate
        sizes = {"cpu": asked["vcpus"], "mem": asked["mem"], "disk_mib": asked["disk"]}
        extra = dict({"grows": name, "to": grow} if grow else {}, **({"host": host} if host else {}))
        entries[key] = fleetstate.active_entry(lease, now, **sizes, **extra)
        return {"entries": entries}

    try:
        store.transact(QUOTAS, tenant, update)
    except fleetstate.AbortUpdate:
        reasons, used = refused[0]
        what = f"to grow {name} (shrink or purge one of its VMs" if grow else f"for {name} (purge one of its VMs"
        raise QuotaError(
            f"{reasons}: no room {what}, or ask the operator for a larger quota)", dict(used, quota=quota)
        ) from None
    where = (tenant, key)
    lease.on_renew.append(lambda expires: fleetstate.renew_reservation(store, where, lease.token, expires, QUOTAS))
    lease.quota = where


def place(
    store: fleetstate.Store,
    lease: fleetstate.Lease,
    host: str,
    hosts: dict[str, Data],
    since: float,
    groups: Data,
    cfg: Data | None = None,
) -> None:
    """Put ``lease``'s quota entry (taken by :func:`reserve` before placement) on hypervisor ``host``: refused
    with :class:`QuotaError` when the tenant's quota of a hypervisor group ``host`` is in (``groups``) has no
    room for it, counted under the compare-and-set of the tenant's ledger as :func:`reserve` counts."""
    where = getattr(lease, "quota", None)
    if not where or not groups:
        return
    tenant, key = where
    cfg = cfg or lease.cfg
    now = time.time()
    refused: list[tuple[str, Data]] = []

    def update(old):
        refused.clear()
        entries = _prune(dict((old or {}).get("entries") or {}), hosts, tenant, since, now, cfg["clock_skew"])
        rec = entries.pop(key, None)
        if not rec or rec.get("token") != lease.token:
            raise fleetstate.AbortUpdate
        group = _group_refusal(entries, hosts, tenant, since, now, cfg["clock_skew"], host, groups, _asked(rec))
        if group:
            refused.append(group)
            raise fleetstate.AbortUpdate
        entries[key] = dict(rec, host=host)
        return {"entries": entries}

    try:
        store.transact(QUOTAS, tenant, update)
    except fleetstate.AbortUpdate:
        if refused:
            reasons, used = refused[0]
            raise QuotaError(f"{reasons}: no room for {key} on {host}", used) from None


def full(
    store: fleetstate.Store,
    lease: fleetstate.Lease,
    candidates: Iterable[str],
    hosts: dict[str, Data],
    since: float,
    groups: Data,
    cfg: Data | None = None,
) -> dict[str, list[str]]:
    """``{host: [reason]}`` of the ``candidates`` where :func:`place` would refuse ``lease``'s entry now (the
    tenant's quota of a hypervisor group the host is in is used up): read once, before ranking, so placement
    passes them over with the reason. Only a hint: :func:`place` decides, under the compare-and-set."""
    where = getattr(lease, "quota", None)
    if not where or not groups:
        return {}
    tenant, key = where
    cfg = cfg or lease.cfg
    now = time.time()
    ledger = store.fetch(QUOTAS, tenant) or {}
    entries = _prune(dict(ledger.get("entries") or {}), hosts, tenant, since, now, cfg["clock_skew"])
    asked = _asked(entries.pop(key, None) or {})
    refusals: dict[str, Any] = {}  # per group: its use does not depend on the host (counted once, not per host)
    out = {}
    for host in candidates:
        for group in in_groups(groups, host):
            if group not in refusals:
                one = {group: groups[group]}
                refusals[group] = _group_refusal(
                    entries, hosts, tenant, since, now, cfg["clock_skew"], host, one, asked
                )
            if refusals[group]:
                out[host] = [refusals[group][0]]
                break
    return out


def _asked(rec):
    """What a ledger entry ``rec`` asks of a hypervisor group's quota ({vcpus, mem, disk, vms})."""
    asked = {"vcpus": rec.get("cpu") or 0, "mem": rec.get("mem") or 0, "disk": rec.get("disk_mib") or 0}
    asked["vms"] = int(not rec.get("grows"))
    return asked


def _joined(groups: Data | None, source: str) -> Data:
    """The hypervisor groups (a tenant's ``groups``) a VM on ``source`` is not in: a move may join them."""
    return {g: conf for g, conf in (groups or {}).items() if not host_allowed(conf, source)}


def _move_asks(old, hosts, tenant, name, source, since, now, skew):
    """``(pruned entries without the move entry, its sizes, what it asks of a group's quota)`` of moving VM
    ``name`` off ``source``, counted in ``old`` (the tenant's ledger) as :func:`place` counts."""
    entries = _prune(dict((old or {}).get("entries") or {}), hosts, tenant, since, now, skew)
    entries.pop(name + MOVES, None)  # a stale one of ours (retry after a dead master) is replaced
    vm = hosts[source]["vm_info"][name]
    own = entries.get(name)
    sizes = {"cpu": size(vm, "cpu"), "mem": size(vm, "mem")}
    sizes["disk_mib"] = int(own.get("disk_mib") or 0) if own else _vm_disk_mib(vm)
    return entries, sizes, {"vcpus": sizes["cpu"], "mem": sizes["mem"], "disk": sizes["disk_mib"], "vms": 1}


def _move_check(old, hosts, tenant, name, source, target, since, now, skew, joined):
    """``(pruned entries without the move entry, its sizes, refusal (reasons, used) or None)`` of moving VM
    ``name`` from ``source`` to ``target`` (:func:`_move_asks`)."""
    entries, sizes, asked = _move_asks(old, hosts, tenant, name, source, since, now, skew)
    return entries, sizes, _group_refusal(entries, hosts, tenant, since, now, skew, target, joined, asked)


def move_refusals(
    ledger: Data | None,
    hosts: dict[str, Data],
    tenant: str,
    name: str,
    source: str,
    targets: Iterable[str],
    since: float,
    groups: Data | None,
    now: float | None = None,
    skew: float = fleetstate.DEFAULTS["clock_skew"],
) -> dict[str, str]:
    """``{target: why}`` of the ``targets`` where :func:`move` would refuse VM ``name``'s move from ``source`` now
    (``ledger``: the tenant's, as read; ``groups``: its hypervisor group quotas): read-only, a hint for a planner
    (the rebalancing of :mod:`saltvirt.fleet.balance`); :func:`move` decides, under the compare-and-set. Each
    group's use is counted once, not once per target (a count scans every VM of the snapshot)."""
    joined = _joined(groups, source)
    targets = [t for t in targets if in_groups(joined, t)]
    if not targets:
        return {}
    now = now or time.time()
    entries, _sizes, asked = _move_asks(ledger, hosts, tenant, name, source, since, now, skew)
    refusals: dict[str, Any] = {}
    out = {}
    for target in targets:
        for group in in_groups(joined, target):
            if group not in refusals:
                one = {group: joined[group]}
                refusals[group] = _group_refusal(entries, hosts, tenant, since, now, skew, target, one, asked)
            if refusals[group]:
                out[target] = refusals[group][0]
                break
    return out


def move(
    store: fleetstate.Store,
    lease: fleetstate.Lease,
    tenant: str,
    name: str,
    source: str,
    target: str,
    hosts: dict[str, Data],
    since: float,
    groups: Data | None,
    cfg: Data | None = None,
) -> None:
    """Take VM ``name`` (on ``source`` in the fleet snapshot ``hosts``, taken at ``since``) from ``tenant``'s quotas of
    the hypervisor groups (``groups``) that ``target`` is in and ``source`` is not: a migration there, checked as
    :func:`place` checks a new VM, under the same compare-and-set (refused with :class:`QuotaError`). Its move entry
    is renewed with ``lease`` and ended by :func:`finish` (settled: the VM's own entry is on ``target``)."""
    joined = _joined(groups, source)
    if not in_groups(joined, target):
        return
    cfg = cfg or lease.cfg
    now = time.time()
    key = name + MOVES
    refused: list[tuple[str, Data]] = []

    def update(old):
        refused.clear()
        entries, sizes, group = _move_check(
            old, hosts, tenant, name, source, target, since, now, cfg["clock_skew"], joined
        )
        if group:
            refused.append(group)
            raise fleetstate.AbortUpdate
        entries[key] = fleetstate.active_entry(lease, now, **sizes, moves=name, host=target)
        return {"entries": entries}

    try:
        store.transact(QUOTAS, tenant, update)
    except fleetstate.AbortUpdate:
        reasons, used = refused[0]
        raise QuotaError(f"{reasons}: no room for {name} on {target}", used) from None
    where = (tenant, key)
    lease.on_renew.append(lambda expires: fleetstate.renew_reservation(store, where, lease.token, expires, QUOTAS))
    lease.quota = where


def finish(store: fleetstate.Store, lease: fleetstate.Lease, outcome: str, keep_for: float | None = None) -> None:
    """End ``lease``'s quota entry: ``settled`` (the VM exists: the entry stays until it is purged),
    ``failed`` (dropped), ``unknown`` (kept active ``keep_for`` more seconds: it may still appear). A growth
    entry settled gives its VM's own entry the update's sizes (and its disk), a move entry its new host, in the
    same transaction."""
    where = getattr(lease, "quota", None)
    lease.quota = None  # ended: a later "failed" must not drop what "unknown" kept
    if not where:
        return
    if outcome != "settled" or not where[1].endswith((GROWS, MOVES)):
        fleetstate.end_entry(store, QUOTAS, where, lease, outcome, keep_for)
        return
    tenant, key = where
    now = time.time()

    def update(old):
        entries = dict((old or {}).get("entries") or {})
        rec = entries.get(key)
        if not rec or rec.get("token") != lease.token:
            raise fleetstate.AbortUpdate
        entries[key] = dict(rec, state="settled", settled_at=now)
        vm_name = rec.get("grows") or rec.get("moves")
        vm = entries.get(vm_name)
        if vm and rec.get("grows"):
            entries[vm_name] = _resized(vm, rec.get("to"), rec.get("disk_mib"))
        elif vm:
            entries[vm_name] = dict(vm, host=rec["host"])
        return {"entries": entries}

    with contextlib.suppress(fleetstate.AbortUpdate):
        store.transact(QUOTAS, tenant, update)


def _resized(vm: Data, to: Data | None, disk_mib: Any) -> Data:
    """VM ledger entry ``vm`` with an update's new sizes (``to``: {cpu, mem}, each optional) and ``disk_mib`` more."""
    new = {k: int(v) for k, v in (to or {}).items() if v is not None}
    new["disk_mib"] = int(vm.get("disk_mib") or 0) + int(disk_mib or 0)
    return dict(vm, **new)


def record(store: fleetstate.Store, name: str, to: Data | None, disk_mib: int) -> str | None:
    """What an operator's ``virt.update`` (never refused by a quota) gave VM ``name``: its new sizes (``to``) and
    the ``disk_mib`` it added, written into its entry in the ledger of the tenant that has one (VM names are
    the fleet's: at most one), so that the tenant's usage counts them (its entry's disk stands for the VM's
    disks). That tenant, or None: no ledger has the VM, whose use is counted from what the hypervisors show."""
    found = holders(store, name)

    def update(old):
        entries = dict((old or {}).get("entries") or {})
        if name not in entries:
            raise fleetstate.AbortUpdate
        entries[name] = _resized(entries[name], to, disk_mib)
        return {"entries": entries}

    for tenant in found:
        with contextlib.suppress(fleetstate.AbortUpdate):
            store.transact(QUOTAS, tenant, update)
    return found[0] if found else None


def holders(store: fleetstate.Store, name: str) -> list[str]:
    """The tenants whose ledger has an entry for VM ``name`` (its VM may exist, or an init of it may have
    finished, where no hypervisor that answered shows it), sorted."""
    return [t for t, ledger in sorted(store.entries(QUOTAS).items()) if name in ((ledger or {}).get("entries") or {})]


def forget(store: fleetstate.Store, tenant: str, name: str) -> Any:
    """Drop VM ``name``'s entries (its own, a growth or move one) from ``tenant``'s ledger (it was purged)."""

    def update(old):
        entries = dict((old or {}).get("entries") or {})
        keys = (name, name + GROWS, name + MOVES)
        if not any(key in entries for key in keys):
            raise fleetstate.AbortUpdate
        for key in keys:
            entries.pop(key, None)
        return {"entries": entries} if entries else None

    with contextlib.suppress(fleetstate.AbortUpdate):
        store.transact(QUOTAS, tenant, update)


def bar(used: int, limit: int | None, width: int = 20) -> str:
    """``[########............] 8 of 16`` (no limit: ``8 (no quota)``)."""
    if limit is None:
        return f"{used} (no quota)"
    filled = width if limit <= 0 else min(width, round(width * used / limit))
    return f"[{'#' * filled}{'.' * (width - filled)}] {used} of {limit}"


def _rows(used: Data, quota: Data) -> Data:
    return {
        key: {"used": used[key], "quota": quota.get(key), "bar": f"{unit}: {bar(used[key], quota.get(key))}"}
        for key, unit in QUOTA_KEYS.items()
    }


def usage(
    store: fleetstate.Store, hosts: dict[str, Data], tenants: dict[str, Data], since: float, cfg: Data | None = None
) -> Data:
    """``{tenant: {vcpus|mem|disk|vms: {used, quota, bar}, vm_names: [...], groups: {group: {vcpus|mem|disk|vms:
    {used, quota, bar}, vm_names: [...]}}}}`` for ``tenants`` ({name: checked tenant config}); ``groups``: its
    use on each hypervisor group of its ``group_quotas``, counted as :func:`place` counts it (only when it has
    any)."""
    cfg = cfg or fleetstate.DEFAULTS
    ledgers = store.entries(QUOTAS)
    out = {}
    for name, conf in sorted(tenants.items()):
        used = count(ledgers.get(name), hosts, name, since, skew=cfg["clock_skew"])
        row: Data = _rows(used, conf["quota"])
        row["vm_names"] = sorted(used["names"])
        groups = {}
        for group, gconf in sorted((conf.get("groups") or {}).items()):
            in_group = count(ledgers.get(name), hosts, name, since, skew=cfg["clock_skew"], on=_on(gconf))
            groups[group] = dict(_rows(in_group, gconf["quota"]), vm_names=sorted(in_group["names"]))
        if groups:
            row["groups"] = groups
        out[name] = row
    return out
