"""The master side of ``salt-run virt.backup``: find each VM's hypervisor, back the VMs up there (at most
``per_host`` at a time on one hypervisor, the hypervisors in parallel), then apply the retention policy
to each VM just backed up; report what was made, pruned and what failed.

Master config (every key optional)::

    virt:
      backup:
        per_host: 1                 # concurrent backups on one hypervisor
        timeout: 21600              # seconds the runner waits for one VM's backup
        retention: {keep_daily: 7, keep_weekly: 4}   # or {keep: N}; none: keep everything

The backups themselves run on the hypervisors (:mod:`saltvirt.vm.backup`), into the directory each
hypervisor's minion config names (``virt:backup:dir``): the runner never passes a path.

Tenants (:mod:`saltvirt.fleet.tenants`): a tenant caller only ever backs up its own tenant's VMs (the owner
in their <metadata>); an operator backs up every VM, or one tenant's with ``tenant=`` (:func:`scope`).
"""

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.fleet import fleetstate, publish, quota, tenants, vmselect

RETENTION_KEYS = ("keep", "keep_daily", "keep_weekly")
DEFAULTS = {"per_host": 1, "timeout": 6 * 3600}
# what a tenant member may pass; the rest is the operator's: retention, per_host and timeout (the backup store
# and the hypervisors' IO), force (powers a running VM off), ignore_down (bets a silent hypervisor runs nothing)
TENANT_ARGS = {
    "virt.backup": frozenset({"name", "incremental", "tenant", "select", "test"}),
    "virt.restore": frozenset({"name", "id", "host", "as_name", "start"}),
}


def operator_args(caller: tenants.Caller, fun: str, given: Data) -> None:
    """Refuse to a tenant caller the arguments of ``fun`` (``salt-run virt.backup``/``virt.restore``) that are
    the operator's (:data:`TENANT_ARGS`); ``given``: the arguments, None/"" for one not passed."""
    if not caller.operator:
        passed = [k for k, v in given.items() if v not in (None, "") and not k.startswith("__")]
        tenants.refuse_kwargs(caller.tenant, passed, TENANT_ARGS[fun], fun)


def settings(conf: Data | None, per_host: Any = None, timeout: Any = None, **retention: Any) -> Data:
    """Effective ``{per_host, timeout, retention}``: per-call values over ``virt:backup`` of the master."""
    conf = conf or {}
    if not isinstance(conf, dict):
        raise SaltInvocationError(f"virt:backup in the master config must be a mapping, not {conf!r}")

    def pick(value, key):
        return value if value not in (None, "") else conf.get(key, DEFAULTS[key])

    per_host = validate.positive_int(pick(per_host, "per_host"), "per_host", 16)
    timeout = validate.positive_int(pick(timeout, "timeout"), "timeout")
    given = {k: v for k, v in retention.items() if k in RETENTION_KEYS and v not in (None, "")}
    unknown = sorted(k for k in retention if k not in RETENTION_KEYS and not k.startswith("__"))
    if unknown:
        raise SaltInvocationError(f"unknown argument(s) {', '.join(unknown)}: retention takes {RETENTION_KEYS}")
    policy = given or dict(conf.get("retention") or {})
    bad = sorted(set(policy) - set(RETENTION_KEYS))
    if bad:
        raise SaltInvocationError(f"virt:backup:retention: unknown key(s) {', '.join(bad)} (use {RETENTION_KEYS})")
    policy = {k: validate.positive_int(v, k) for k, v in policy.items()}
    return {"per_host": per_host, "timeout": timeout, "retention": policy}


def scope(caller: tenants.Caller, tenant: str | None, conf: Data) -> str | None:
    """The tenant whose VMs a run backs up, or None for every VM: a tenant caller's own tenant (another
    ``tenant=`` is refused); for an operator the ``tenant=`` it names, if any (``conf``: tenants.config)."""
    if not caller.operator:
        if tenant not in (None, "", caller.tenant):
            raise SaltInvocationError(f"user {caller.user} is in tenant {caller.tenant}: tenant={tenant} is refused")
        return caller.tenant
    if tenant in (None, ""):
        return None
    if tenant not in conf["tenants"]:
        known = ", ".join(sorted(conf["tenants"])) or "none: virt:tenants is not configured"
        raise SaltInvocationError(f"no tenant named {tenant!r} in virt:tenants (known: {known})")
    return tenant


def owned(hosts: dict[str, Data], tenant_name: str | None) -> dict[str, Data]:
    """``virt.full_info`` answers (``publish.Fleet.gather``) cut to ``virt.vm_state``'s shape for :func:`plan`,
    with only the VMs whose <metadata> owner is ``tenant_name``."""
    return vm_states(hosts, lambda vm: tenants.owned_by(vm, tenant_name))


def vm_states(hosts: dict[str, Data], keep: Callable[[Data], bool] | None = None) -> dict[str, Data]:
    """``virt.full_info`` answers in ``virt.vm_state``'s shape (``{status, vms: {name: state}}``), the VMs
    ``keep(vm_info)`` accepts (default: every one)."""
    out = {}
    for host, ans in hosts.items():
        if ans.get("status") != "up":
            out[host] = ans
            continue
        vms = ans.get("vm_info") or {}
        out[host] = {"status": "up", "vms": {n: vm.get("state") for n, vm in vms.items() if not keep or keep(vm)}}
    return out


def plan(
    hosts: dict[str, Data], name: str = "all", tenant: str | None = None
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """``({host: [vm, ...]}, problems)`` from ``virt.vm_state`` answers (``publish.Fleet.gather``, or
    :func:`owned`'s cut for ``tenant``): every VM for ``all``, else the one host defining ``name``; a
    name on two hypervisors is refused, never guessed."""
    where: dict[str, list[str]] = {}
    for host, ans in sorted(hosts.items()):
        if ans.get("status") == "up":
            for vm in sorted(ans.get("vms") or {}):
                where.setdefault(vm, []).append(host)
    down = sorted(h for h, a in hosts.items() if a.get("status") != "up")
    wanted = sorted(where) if name in (None, "", "all") else [validate.vm_name(name)]
    work: dict[str, list[str]] = {}
    problems: dict[str, str] = {}
    for vm in wanted:
        found = where.get(vm, [])
        if len(found) > 1:
            problems[vm] = f"defined on {', '.join(found)}: back it up with salt '<host>' virt.backup {vm}"
        elif not found:
            said = f"no VM named {vm} in tenant {tenant}" if tenant else "not defined on any hypervisor that answered"
            problems[vm] = said + (f" (down: {', '.join(down)})" if down else "")
        else:
            work.setdefault(found[0], []).append(vm)
    return work, problems


def only_selected(
    work: dict[str, list[str]], problems: dict[str, str], selection: Data
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """:func:`plan`'s ``(work, problems)`` cut to the VMs ``selection`` picked (``saltvirt.fleet.vmselect``): each
    on the hypervisor that signed for it; a picked name another hypervisor also defines stays a problem (backups
    are kept by VM name)."""
    keep = {(vm["host"], vm["name"]) for vm in selection["selected"]}
    names = {vm["name"] for vm in selection["selected"]}
    cut = {h: [vm for vm in vms if (h, vm) in keep] for h, vms in work.items()}
    return {h: vms for h, vms in cut.items() if vms}, {vm: why for vm, why in problems.items() if vm in names}


# the backup_mib quota ---------------------------------------------------------------------------------
def backup_quotas(conf: Data, tenant: str | None = None) -> dict[str, int]:
    """``{tenant: backup_mib}`` of the tenants with that quota (``conf``: tenants.config), or only ``tenant``'s."""
    return {
        t: c["quota"][tenants.BACKUP_QUOTA]
        for t, c in conf["tenants"].items()
        if tenants.BACKUP_QUOTA in c["quota"] and tenant in (None, t)
    }


def backup_use(answers: dict[str, Data]) -> dict[str, int]:
    """``{tenant: MiB}`` its backups take, from every hypervisor's ``virt.backup_usage`` (``publish.Fleet.gather``):
    a backup seen by several hypervisors (a shared directory) counts once."""
    seen: dict[str, Data] = {}
    for ans in answers.values():
        if ans.get("status") == "up" and isinstance(ans.get("ret"), dict):
            seen.update(ans["ret"])
    used: dict[str, int] = {}
    for entry in seen.values():
        if entry.get("tenant"):
            used[entry["tenant"]] = used.get(entry["tenant"], 0) + int(entry.get("size") or 0)
    return {t: -(-b // 1048576) for t, b in used.items()}


def owners(hosts: dict[str, Data]) -> dict[str, str]:
    """``{vm: tenant}`` from ``virt.full_info`` answers (the owner in each VM's <metadata>)."""
    return {
        name: vm["owner"]["tenant"]
        for ans in hosts.values()
        for name, vm in ((ans or {}).get("vm_info") or {}).items()
        if (vm.get("owner") or {}).get("tenant")
    }


def work(
    fleet: publish.Fleet,
    caller: tenants.Caller,
    name: str,
    tenant: str | None,
    select: Any,
    test: Any,
    with_owners: bool,
) -> tuple[Data | None, dict[str, Data], dict[str, str], dict[str, list[str]], dict[str, str]]:
    """What ``salt-run virt.backup`` backs up: ``(selection or None, hosts, owners, work, problems)``. With
    ``select``, the VMs a selection picks (:func:`saltvirt.fleet.vmselect.fleet_selection`; ``test``: the selection
    only, nothing else read); else VM ``name`` (or ``all``) of every hypervisor, or only ``tenant``'s. ``owners``:
    ``{vm: tenant}`` when ``tenant``, ``select`` or ``with_owners``; ``work``/``problems``: :func:`plan`'s."""
    if select is not None:
        if name not in (None, "", "all"):
            raise SaltInvocationError("virt.backup: select= picks the VMs: drop the VM name")
        seen, selection = vmselect.fleet_selection(fleet, caller, select, tenant=tenant)
        if validate.to_bool(test):
            return selection, {}, {}, {}, {}
        hosts = vm_states(seen)
        todo, problems = only_selected(*plan(hosts), selection)
        return selection, hosts, owners(seen), todo, problems
    if validate.to_bool(test):  # never ignored: without a selection there is no dry run
        raise SaltInvocationError("virt.backup: test=True lists what select= picks; it has no other dry run")
    if tenant is None and not with_owners:
        hosts, who_owns = fleet.gather("virt.vm_state"), {}
    else:
        seen = tenants.visible(fleet.gather("virt.full_info"), caller, tenants.config(fleet.opts))
        hosts, who_owns = (owned(seen, tenant) if tenant else vm_states(seen)), owners(seen)
    todo, problems = plan(hosts, name, tenant=tenant)
    return None, hosts, who_owns, todo, problems


def budget(fleet: publish.Fleet, quotas: dict[str, int], owned_by: dict[str, str]) -> "Budget":
    """The tenants' ``backup_mib`` quotas for this run: what their backups take now, from every hypervisor."""
    return Budget(quotas, backup_use(fleet.gather("virt.backup_usage")), owned_by)


class Budget:
    """The ``backup_mib`` quotas during one ``salt-run virt.backup``: a tenant's VM is backed up only while
    what its backups take (the run's start, plus what the run made since) is under the quota. A backup's
    size is known once made, so the last one started under the limit may end above it."""

    def __init__(self, quotas: dict[str, int], used: dict[str, int], owner: dict[str, str]) -> None:
        self.quotas, self.owner = quotas, owner
        self.used = {t: used.get(t, 0) for t in quotas}
        self.bytes = dict.fromkeys(quotas, 0)

    def refusal(self, vm: str) -> str | None:
        """Why VM ``vm`` is not backed up now, or None."""
        tenant = self.owner.get(vm)
        if tenant not in self.quotas:
            return None
        used, limit = self.used[tenant] + -(-self.bytes[tenant] // 1048576), self.quotas[tenant]
        if used < limit:
            return None
        return (
            f"tenant {tenant}: {used} of {limit} MiB of backups used: no room for a backup of {vm} (the operator "
            "deletes old backups or gives a larger backup_mib quota)"
        )

    def add(self, vm: str, size: Any) -> None:
        tenant = self.owner.get(vm)
        if tenant in self.bytes:
            self.bytes[tenant] += int(size or 0)

    def report(self) -> Data:
        """``{tenant: {used, quota}}`` in MiB, as the run leaves it."""
        return {t: {"used": self.used[t] + -(-self.bytes[t] // 1048576), "quota": q} for t, q in self.quotas.items()}


def run(
    call: Callable[..., Any],
    work: dict[str, list[str]],
    cfg: Data,
    incremental: bool = True,
    progress: Callable[[str], Any] | None = None,
    budget: Budget | None = None,
) -> Data:
    """Back up every VM of ``work`` ({host: [vms]}) through ``call(host, fun, args, kwargs, max_wait)``
    (one Salt job per VM, ``publish.Fleet.call`` shaped answers), ``cfg["per_host"]`` at a time per host, each
    while its tenant's ``budget`` allows. Returns ``{made, pruned, failed}`` keyed by VM."""
    made, pruned, failed = {}, {}, {}
    lock = threading.Lock()
    total, done = sum(len(v) for v in work.values()), [0]

    def one(host, vm):
        started = time.monotonic()
        with lock:
            refused = budget.refusal(vm) if budget else None
        if refused:
            ans = {"status": "refused", "error": refused}
        else:
            ans = call(host, "virt.backup", [vm], {"incremental": bool(incremental)}, cfg["timeout"])
        result, pruned_ids, error = None, None, None
        if ans.get("status") == "refused":
            error = ans["error"]
        elif ans.get("status") != "up":
            error = f"{host}: {ans.get('error') or ans.get('status')}"
        else:
            result = ans["ret"]
            if cfg["retention"]:
                kept = call(host, "virt.backup_prune", [vm], dict(cfg["retention"]), 600)
                if kept.get("status") == "up":
                    pruned_ids = kept["ret"]
                else:
                    error = f"{host}: backup made, retention failed: {kept.get('error') or kept.get('status')}"
        with lock:
            done[0] += 1
            if result is not None:
                made[vm] = {"host": host, **_brief(result)}
                if budget:
                    budget.add(vm, result.get("size") if isinstance(result, dict) else 0)
            if pruned_ids is not None:
                pruned[vm] = {"pruned": pruned_ids["pruned"], "kept": pruned_ids["kept"]}
                if pruned_ids.get("refused"):
                    pruned[vm]["refused"] = pruned_ids["refused"]
            if error:
                failed[vm] = error
            if progress:
                state = "failed" if error and result is None else "done"
                progress(f"[{done[0]}/{total}] {vm} on {host}: {state} in {time.monotonic() - started:.1f} s")

    def host_queue(host, vms):
        with concurrent.futures.ThreadPoolExecutor(max_workers=cfg["per_host"]) as pool:
            list(pool.map(lambda vm: one(host, vm), vms))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(work))) as hosts:
        list(hosts.map(lambda item: host_queue(*item), work.items()))
    return {"made": made, "pruned": pruned, "failed": failed}


def _brief(result):
    if not isinstance(result, dict):
        return {"result": result}
    keys = (
        "id",
        "type",
        "parent",
        "size",
        "duration",
        "consistency",
        "fs_freeze",
        "note",
        "live",
        "checkpoint_redefined",
        "skipped",
    )
    return {k: result.get(k) for k in keys if result.get(k) not in (None, {})}


# restore: one VM never runs twice --------------------------------------------------------------------
def restore_host(
    hosts: dict[str, Data], name: str, host: str | None = None, as_name: str | None = None, ignore_down: bool = False
) -> tuple[str, list[str]]:
    """The hypervisor ``salt-run virt.restore`` restores VM ``name`` on, from every hypervisor's
    ``virt.vm_state`` (``publish.Fleet.gather``), and ``down``: the hypervisors that did not answer. A backup
    directory that several hypervisors mount lets any of them restore the VM, so the fleet is asked first:

    * under the same name, refused while a VM of that name is defined on another hypervisor (running or
      not: the restored copy and the original would both run) and while a hypervisor does not answer
      (it may run it) unless ``ignore_down`` (the operator knows those run nothing: powered off);
    * ``as_name`` (a new name, uuid and MAC addresses) is refused while that name is defined anywhere.

    ``host`` defaults to the one hypervisor that defines ``name`` (a restore in place)."""
    up = {h: a.get("vms") or {} for h, a in hosts.items() if a.get("status") == "up"}
    down = sorted(h for h in hosts if h not in up)
    found = {h: vms[name] for h, vms in sorted(up.items()) if name in vms}
    if host in (None, ""):
        if as_name or len(found) != 1:
            raise SaltInvocationError(
                f"name the hypervisor to restore VM {as_name or name} on: host=<minion id> (one that mounts the "
                "backup directory)"
            )
        host = next(iter(found))
    if host not in up:
        answered = ", ".join(sorted(up)) or "none"
        raise CommandExecutionError(
            f"hypervisor {host} did not answer or is not in virt:hypervisors (answered: {answered})"
        )
    if as_name:
        taken = {h: vms[as_name] for h, vms in sorted(up.items()) if as_name in vms}
        if taken:
            h, state = next(iter(taken.items()))
            raise SaltInvocationError(f"a VM named {as_name} is defined on {h} ({state}): choose another as_name")
        return host, down
    elsewhere = {h: state for h, state in found.items() if h != host}
    if elsewhere:
        on = ", ".join(f"{h} ({state})" for h, state in elsewhere.items())
        raise CommandExecutionError(
            f"VM {name} is defined on {on}: restoring it on {host} under the same name could run it twice. "
            f"Restore it beside with as_name=<new name> (a new uuid and MAC addresses), or purge it there first"
        )
    if down and not ignore_down:
        raise CommandExecutionError(
            f"hypervisor(s) {', '.join(down)} did not answer: VM {name} may be defined or running there. Restore "
            "when they answer, with as_name=<new name>, or with ignore_down=True if you know they run nothing "
            "(powered off)"
        )
    return host, down


def tenant_restore(
    caller: tenants.Caller,
    conf: Data,
    full: dict[str, Data],
    listing: Data,
    name: str,
    bid: str,
    host: str,
    as_name: str | None = None,
    counted: Data | None = None,
) -> Data | None:
    """What tenant member ``caller`` may restore with ``salt-run virt.restore`` (``conf``: its tenant's checked
    config; ``full``: every hypervisor's ``virt.full_info``; ``listing``: ``host``'s ``virt.backup_list`` of
    ``name``). The owner is the one backup ``bid`` recorded in its domain XML: another tenant's backup (or
    no tenant's) is one the caller does not see; in place, the VM defined as ``name`` must be its tenant's
    too, and ``host`` one of its hypervisors. Returns ``{cpu, mem, disk_mib}`` to take from its quota: the
    VM the restore makes (a copy ``as_name``, or ``name`` defined nowhere), or in place what the backup's VM
    has beyond what the quota counts of the VM it replaces (``counted``: :func:`saltvirt.fleet.quota.counted`;
    default: the sizes ``full`` shows), with ``grow``: its ``{cpu, mem}`` (as ``virt.update``'s growth); None
    when it takes nothing."""
    entry = next((b for b in listing.get("backups") or [] if b.get("id") == bid), None)
    if not entry or not tenants.owned_by(entry, caller.tenant):
        raise SaltInvocationError(f"no backup {bid} of a VM named {name} in tenant {caller.tenant}")
    if not tenants.host_allowed(conf, host):
        tenants.refuse("hypervisor", host, str(caller.tenant), conf["hypervisors"])
    defined = _defined(full, name)
    if not as_name and defined and not all(tenants.owned_by(vm, caller.tenant) for vm in defined):
        raise SaltInvocationError(tenants.missing(name, caller))
    disk_mib = sum(-(-int(d.get("virtual_size") or 0) // 1048576) for d in entry.get("disks") or [])
    made = {"cpu": int(entry.get("cpu") or 1), "mem": int(entry.get("mem") or 0), "disk_mib": disk_mib}
    if as_name or not defined:
        return made
    # in place: the VM is counted already, a bigger backup grows it
    now = counted or quota.counted(defined[0])
    grown = {k: max(0, made[k] - int(now[k])) for k in made}
    return dict(grown, grow={"cpu": made["cpu"], "mem": made["mem"]}) if any(grown.values()) else None


def reserve_restore(
    lease: fleetstate.Lease,
    caller: tenants.Caller,
    conf: Data,
    full: dict[str, Data],
    listing: Data,
    name: str,
    bid: str,
    host: str,
    since: float,
    as_name: str | None = None,
) -> None:
    """Take what a tenant member's restore adds (:func:`tenant_restore`) from its quota and its quotas of
    ``host``'s hypervisor groups, under ``lease`` (ended by the caller with :func:`saltvirt.fleet.quota.finish`),
    in the compare-and-set ``virt.init`` and ``virt.update`` use. Raises :class:`saltvirt.fleet.quota.QuotaError`."""
    vm = ((full.get(host) or {}).get("vm_info") or {}).get(name)
    counted = quota.counted(vm, lease.store, caller.tenant) if vm and not as_name else None
    req = tenant_restore(caller, conf, full, listing, name, bid, host, as_name, counted)
    if req:
        grow = req.pop("grow", None)
        tenant, new, limits = str(caller.tenant), as_name or name, conf["quota"]
        groups = conf["groups"]
        quota.reserve(lease.store, lease, tenant, new, req, full, since, limits, grow=grow, host=host, groups=groups)


def _defined(full: dict[str, Data], name: str) -> list[Data]:
    return [a["vm_info"][name] for a in full.values() if name in ((a or {}).get("vm_info") or {})]


def tenant_names(caller: tenants.Caller, full: dict[str, Data], name: str, as_name: str | None = None) -> bool:
    """Before :func:`restore_host` for tenant member ``caller`` (its refusals name the hypervisor and state of
    any VM, another tenant's too): a copy's ``as_name`` defined anywhere is refused with
    :func:`~saltvirt.fleet.tenants.name_taken`, an in-place ``name`` defined as a VM not of its tenant with
    :func:`~saltvirt.fleet.tenants.missing` (``full``: every hypervisor's ``virt.full_info``). Returns whether
    the restore is in place over its tenant's own VM."""
    if as_name:
        if _defined(full, as_name):
            raise SaltInvocationError(tenants.name_taken(as_name))
        return False
    vms = _defined(full, name)
    if not all(tenants.owned_by(vm, caller.tenant) for vm in vms):
        raise SaltInvocationError(tenants.missing(name, caller))
    return bool(vms)


def tenant_held(caller: tenants.Caller, full: Callable[[], dict[str, Data]], name: str, as_name: str | None) -> None:
    """Tenant member ``caller``'s restore found the name it restores to locked by another call: refused as
    :func:`tenant_names` refuses (``full()``: every hypervisor's ``virt.full_info``), else as a taken name,
    unless it restores its own VM in place (then it may be told whose call holds it)."""
    if as_name or not tenant_names(caller, full(), name):
        raise SaltInvocationError(tenants.name_taken(as_name or name))
