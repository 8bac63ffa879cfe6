"""Moving VMs between hypervisors, the master side of ``salt-run virt.migrate`` and ``virt.evacuate``.

One migration is four steps on two hypervisors, each a ``virt.migrate_*`` call (:mod:`saltvirt.vm.migrate`):

1. source ``virt.migrate_source_info``: the VM's disks (size, format, backing image) and probe files;
2. target ``virt.migrate_prepare``: storage the target sees (probe) is used in place; for the rest it
   checks room and creates disk files of the right size and format (qcow2 overlays onto its copy of
   the backing image); then the probe files are removed again;
3. source ``virt.migrate``: one peer-to-peer libvirt migration, live if the VM runs, over the libvirtd TLS
   connection (plaintext TCP only with ``transport=tcp``, reported in ``warnings``); tunnelled through it
   when ``virt:tunnel`` is set in the master config (libvirt cannot tunnel a disk copy: then the data goes
   over a direct stream);
4. target ``virt.migrate_finish`` (the VM is there: report it) or, on failure, ``virt.migrate_abort_cleanup``
   (remove what step 2 created) and a check that the VM still runs on the source.

Before step 1, ``salt-run virt.migrate`` makes ``virt.init``'s placement checks on the target
(:func:`placement_checks`, :func:`_place`): room for the VM with every in-flight creation and migration counted
(reserved there until the move ends), not in maintenance, no member of its anti-affinity group there, and
for a tenant's VM its quotas of the target's hypervisor groups. Disk room is the target's own check (step
2): only it knows which disks are shared.

Evacuation migrates every VM off one host, one at a time, each to the host ``saltvirt.fleet.placement``
ranks best (the evacuated host excluded); a target that fails is excluded and the next one tried.
"""

import logging
import time
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.fleet import fleetstate, placement, publish, quota, tenants

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 3600  # seconds one libvirt migration may take (master config virt:migration_timeout)


def settings(conf: Data, tunnel: Any = None) -> tuple[bool, float]:
    """``(tunnel, timeout)`` of a migration from the master's ``virt`` config: ``tunnel`` (a call's own, else
    ``virt:tunnel``, default off) and ``virt:migration_timeout`` (seconds, default :data:`DEFAULT_TIMEOUT`)."""
    timeout = validate.seconds(conf.get("migration_timeout", DEFAULT_TIMEOUT), "virt:migration_timeout")
    return validate.to_bool(conf.get("tunnel", False) if tunnel is None else tunnel), timeout


def _quiet(remote, minion, fun, *args):
    """Best-effort call (cleanup): its answer, or the reason it failed."""
    try:
        return remote.ret(minion, fun, *args)
    except CommandExecutionError as exc:
        return {"error": str(exc)}


def _still_on_source(remote, source, name):
    try:
        return remote.ret(source, "virt.vm_state", name).get(name)
    except CommandExecutionError as exc:
        return f"unknown ({exc})"


def migrate(
    remote: publish.Fleet,
    name: str,
    target: str,
    source: str | None = None,
    hosts: dict[str, Data] | None = None,
    live: bool = True,
    tunnel: bool = False,
    copy_storage: str | None = None,
    max_downtime: Any = None,
    max_bandwidth: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
    transport: str | None = None,
    checks: Data | None = None,
) -> Data:
    """Move VM ``name`` to hypervisor minion ``target``; see the runner's ``virt.migrate``.

    ``hosts``: ``remote.gather('virt.vm_state')`` if the caller has it already (evacuate). ``checks``:
    :func:`placement_checks` to make on ``target`` first (None: none, as for evacuate and rebalance, which
    placed the VM already). Holds the runner's per-VM lock (the one ``virt.init`` takes): two migrations of
    one VM never overlap."""
    validate.vm_name(name)
    with fleetstate.lock(remote.opts, [name], kind="virt.migrate") as lease:
        try:
            ret = _migrate(
                remote,
                lease,
                name,
                target,
                source,
                hosts,
                live=live,
                tunnel=tunnel,
                copy_storage=copy_storage,
                max_downtime=max_downtime,
                max_bandwidth=max_bandwidth,
                timeout=timeout,
                transport=transport,
                checks=checks,
            )
        except Exception as exc:  # the room taken on the target: given back, or kept while it may still move
            running = getattr(exc, "details", {}).get("status") == "timeout"
            _end_room(lease, "unknown" if running else "failed", timeout if running else None)
            raise
        unsettled = _end_room(lease, "settled")
        unreleased = lease.release()  # a store that stopped answering meanwhile: said, the VM moved anyway
        for warning in (None if unreleased else unsettled, unreleased):  # one store gone: said once
            if warning:
                ret.setdefault("warnings", []).append(warning)
        return ret


def placement_checks(
    policy: Data, tenant: Data | None = None, fleet_vms: dict[str, Data] | None = None, since: float = 0.0
) -> Data:
    """The checks ``salt-run virt.migrate`` makes on its target (see the module doc): ``policy``
    (``virt:placement``), and for a tenant caller's VM ``tenant`` (``{name, groups}``: its quotas per hypervisor
    group) with ``fleet_vms``, every hypervisor's ``virt.full_info`` (what the quota counts) taken at ``since``."""
    return {"policy": policy, "tenant": tenant, "fleet": fleet_vms or {}, "since": since}


def tenant_checks(
    remote: publish.Fleet,
    caller: tenants.Caller,
    conf: Data,
    name: str,
    target: str,
    host: str | None,
    policy: Data,
) -> tuple[str, Data]:
    """A tenant member's migration of VM ``name`` to ``target`` (``conf``: :func:`saltvirt.fleet.tenants.config`):
    its own VM only, to one of its hypervisors. ``(the VM's hypervisor, its placement_checks)``."""
    since = time.time()  # quota entries settled after this are not in the snapshot yet
    fleet_vms = remote.gather("virt.full_info")
    host = tenants.locate(tenants.visible(fleet_vms, caller, conf), name, caller, host)
    tconf = conf["tenants"][caller.tenant]
    if not tenants.host_allowed(tconf, target):
        tenants.refuse("hypervisor", target, str(caller.tenant), tconf["hypervisors"])
    return host, placement_checks(policy, {"name": caller.tenant, "groups": tconf["groups"]}, fleet_vms, since)


def refuse_migrate_args(
    caller: tenants.Caller,
    name: str | None,
    host: str | None,
    target: str | None,
    select: Any,
    forced: bool,
    test: Any,
) -> None:
    """What ``salt-run virt.migrate`` refuses before anything is asked (``forced``: ``ignore_placement=True``; the
    VM's name is checked before the caller is known)."""
    if forced:
        tenants.operator_only(caller, "virt.migrate ignore_placement=True")
    if not target:
        raise SaltInvocationError(
            "virt.migrate needs target=<hypervisor> (virt.evacuate select= lets placement choose)"
        )
    if select is None and validate.to_bool(test):  # never ignored: a named call has no dry run
        raise SaltInvocationError("virt.migrate: test=True lists what select= picks; a call naming a VM has no dry run")
    if select is not None and (name is not None or host is not None):
        raise SaltInvocationError("virt.migrate: select= picks the VMs: drop the VM name and host=")


def move_one(
    remote: publish.Fleet,
    caller: tenants.Caller,
    name: str,
    target: str,
    host: str | None,
    policy: Data,
    forced: bool,
    tunnel: bool,
    timeout: float,
    how: Data,
) -> Data:
    """One VM's move as ``salt-run virt.migrate`` makes it: a tenant's own VM to one of its hypervisors, the
    placement checks unless ``forced`` (then said in ``warnings``). ``how``: :func:`migrate`'s ``live``,
    ``copy_storage``, ``max_downtime``, ``max_bandwidth`` and ``transport``."""
    checks = None if forced else placement_checks(policy)
    if not caller.operator:  # its own VM, to one of its hypervisors
        host, checks = tenant_checks(remote, caller, tenants.config(remote.opts), name, target, host, policy)
    ret = migrate(remote, name, target, source=host, tunnel=tunnel, timeout=timeout, checks=checks, **how)
    if forced:
        ret.setdefault("warnings", []).append(
            f"ignore_placement=True: {name} was moved to {target} without placement's checks (room, maintenance, "
            "anti-affinity)"
        )
    return ret


def _place(lease, name, source, target, hosts, since, checks):
    """``virt.init``'s placement checks of VM ``name`` (on ``source``) on ``target``, with ``hosts`` every
    hypervisor's ``virt.capacity`` taken at ``since`` (see the module doc). Nothing was asked of the
    hypervisors yet: a refusal moves nothing."""
    tenant = checks.get("tenant")
    if tenant:
        fleet_vms, taken = checks["fleet"], checks["since"]
        quota.move(lease.store, lease, tenant["name"], name, source, target, fleet_vms, taken, tenant["groups"])
    req = _request(hosts[source]["vm_info"][name])
    pol = checks["policy"]
    try:
        fleetstate.reserve(
            lease.store,
            lease,
            target,
            name,
            req,
            hosts[target],
            since,
            fits=lambda answer, load: placement.fits(target, answer, req, pol, load),
        )
    except fleetstate.NoRoomError as exc:
        anyway = "" if tenant else ", or pass ignore_placement=True to move it anyway"
        raise publish.Failed(
            f"{target} cannot take VM {name!r}: {exc}. Nothing was migrated, the VM stays on {source}: choose "
            f"another target{anyway}",
            stage="placement",
            source=source,
            target=target,
        ) from None


def _end_room(lease, outcome, keep_for=None):
    """End what :func:`_place` took (the target's reservation, a tenant's move entry; nothing without): as
    :func:`saltvirt.fleet.fleetstate.finish` says. A store that cannot be written is returned as a sentence (the
    entries expire by themselves), never raised: the VM moved, or did not, either way."""
    errors = []
    for end in (fleetstate.finish, quota.finish):
        try:
            end(lease.store, lease, outcome, keep_for=keep_for)
        except CommandExecutionError as exc:
            log.warning("virt.migrate: %s", exc)
            errors.append(str(exc))
    if not errors:
        return None
    return (
        f"its room on the target could not be marked {outcome} in the shared runner state: {errors[0]} "
        f"(it expires by itself within virt:shared:lock_ttl, {lease.ttl:g} s)"
    )


def _migrate(
    remote, lease, name, target, source, hosts, *, live, tunnel, copy_storage, max_downtime, max_bandwidth, timeout,
    transport, checks,
):  # fmt: skip
    """:func:`migrate` under its lock ``lease``; the options by name, as the caller passed them."""
    if copy_storage not in (None, "all", "inc"):
        raise SaltInvocationError(f"copy_storage must be all, inc or empty (decided per disk), not {copy_storage!r}")
    started = time.monotonic()
    since = time.time()  # reservations settled after this are not in the snapshot yet
    if hosts is None:  # placement reads virt.capacity (its answers locate the VM too)
        hosts = remote.capacities() if checks else remote.gather("virt.vm_state")
    source = _source_and_target(hosts, name, source, target)
    if checks:
        _place(lease, name, source, target, hosts, since, checks)
    info, prep = _prepare(remote, name, source, target, copy_storage)
    copying = prep["copy_storage"]
    note = None
    if tunnel and copying:
        note = (
            "virt:tunnel: libvirt cannot tunnel a disk copy; the libvirtd connection was TLS, the data a direct stream"
        )
    kwargs = {
        "live": live,
        "tunnel": bool(tunnel) and not copying,
        "transport": transport,  # None: the hypervisor's setting, TLS unless tcp is named there
        "copy_storage": copying,
        "unsafe": prep["unsafe"],
        "disk_map": prep["disk_map"] or None,
        "migrate_disks": prep["migrate_disks"] or None,
        "verify_backing": prep["verify_backing"] or None,
        "max_downtime": max_downtime,
        "max_bandwidth": max_bandwidth,
    }
    _still_ours(remote, lease, name, source, target, prep)
    moved = _move(remote, name, source, target, info, prep, kwargs, timeout)
    try:
        done = remote.ret(target, "virt.migrate_finish", name)
    except CommandExecutionError as exc:  # migrated (the source's libvirt said so): only the report is missing
        done = {"host": None, "state": "unknown", "persistent": None, "disks": None}
        moved = dict(moved, warnings=[*(moved.get("warnings") or []), _unconfirmed(name, target, exc)])
    return _migrated(name, source, target, prep, moved, done, note, started)


def _still_ours(remote, lease, name, source, target, prep):
    """Right before the migration starts: the VM's lock is still held, and the shared store answers (one
    write: what the lock holder does now). Otherwise nothing is migrated: what the target prepared goes."""
    try:
        lease.check()
        lease.note(stage="migrating", source=source, target=target)
    except CommandExecutionError as exc:
        cleanup = (
            _quiet(remote, target, "virt.migrate_abort_cleanup", name, prep["created"]) if prep["created"] else None
        )
        raise publish.Failed(
            f"VM {name!r} was not migrated, it stays on {source}: {exc}",
            stage="lock",
            source=source,
            target=target,
            target_cleanup=cleanup,
        ) from None


def _unconfirmed(name, target, exc):
    return (
        f"the migration of VM {name!r} finished (the source's libvirt reported it done), but {target} could "
        f"not be asked how the VM runs there: {exc}. Check with salt-run virt.query; `salt {target} "
        f"virt.migrate_finish {name}` completes it there (drops its migration record)"
    )


def _source_and_target(hosts, name, source, target):
    """Where the VM is (``source``) after checking that ``target`` is another hypervisor that answered."""
    if target not in hosts:  # first: a minion that is not a hypervisor is never a target, whatever else
        raise publish.Failed(f"{target} is not a known hypervisor (known: {', '.join(sorted(hosts))})")
    source = publish.locate(hosts, name, source)
    if target == source:
        raise SaltInvocationError(f"VM {name!r} is already on {target}")
    if hosts[target]["status"] != "up":
        status, error = hosts[target]["status"], str(hosts[target].get("error")).rstrip(".")
        why = {"down": "is down", "timeout": "did not answer in time"}.get(status, "answered with an error")
        raise publish.Failed(f"target hypervisor {target} {why}: {error}. VM {name!r} stays on {source}", host=target)
    return source


def _prepare(remote, name, source, target, copy_storage):
    """The source's facts and the target's preparation (disks shared, copied or refused); the source's
    shared-storage probe files are removed whatever happens."""
    info = remote.ret(source, "virt.migrate_source_info", name)
    probes = [p["path"] for p in (info.get("probes") or {}).values()]
    try:
        prep = remote.ret(target, "virt.migrate_prepare", name, info, copy_storage=copy_storage)
    except CommandExecutionError as exc:
        raise publish.Failed(
            f"preparing {target} for VM {name!r} failed: {exc}. Nothing was migrated, the VM stays on {source}",
            stage="prepare",
            source=source,
            target=target,
        ) from None
    finally:
        if probes:
            _quiet(remote, source, "virt.migrate_abort_cleanup", name, probes)
    return info, prep


def _move(remote, name, source, target, info, prep, kwargs, timeout):
    """``virt.migrate`` on the source; on failure the target's prepared files are removed (not after a
    timeout: the migration may still be running) and the error says where the VM is."""
    try:
        if prep["copy_storage"] and not info["active"]:
            raise publish.Failed(
                f"VM {name!r} is stopped and its disks are not on storage {target} sees: libvirt moves a stopped VM's "
                "definition only. Start it to migrate it live with its disks, or put its disks on shared storage",
                retry=False,
            )
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return remote.ret(source, "virt.migrate", name, prep["address"], max_wait=timeout, report=True, **kwargs)
    except CommandExecutionError as exc:
        status = getattr(exc, "details", {}).get("status")
        if status == "timeout":  # it may still be migrating: removing its target disks now would break it
            raise publish.Failed(
                f"migrating VM {name!r} from {source} to {target} did not finish within {timeout} s and may still be "
                f"running: check with salt-run virt.list, then salt {target} virt.migrate_abort_cleanup {name} "
                "'<created files>' if it failed",
                created=prep["created"],
                retry=False,
                status="timeout",
            ) from None
        cleanup = (
            _quiet(remote, target, "virt.migrate_abort_cleanup", name, prep["created"]) if prep["created"] else None
        )
        raise publish.Failed(
            str(exc),
            **{**getattr(exc, "details", {}), "source": source, "target": target},
            source_state=_still_on_source(remote, source, name),
            target_cleanup=cleanup,
        ) from None


def _migrated(name, source, target, prep, moved, done, note, started):
    """The runner's answer for a finished migration."""
    copying = prep["copy_storage"]
    left = [d["source"] for d in prep["disks"] if d["mode"] != "shared"]
    ret = {
        "name": name,
        "source": source,
        "target": target,
        "target_host": done["host"],
        "state": done["state"],
        "persistent": done["persistent"],
        "undefined_on_source": moved["undefined_on_source"],
        "live": moved["live"],
        "tunnelled": moved["tunnelled"],
        "target_uri": moved["target_uri"],
        "copy_storage": copying,
        "disks": done["disks"],
        "migration_seconds": moved["seconds"],
        "seconds": round(time.monotonic() - started, 3),
    }
    ret["transport"], ret["qemu_tls"] = moved.get("transport"), moved.get("qemu_tls")  # what went encrypted
    if moved.get("warnings"):
        ret["warnings"] = moved["warnings"]
    if left:
        ret["source_files_left"] = left
    if note:
        ret["note"] = note
    return ret


def _request(vm):
    return placement.make_request(vm.get("cpu") or 1, max(int(vm.get("mem") or 1), 1), 0, vm.get("group"))


def _book(facts, vm, name):
    """Count a VM placed on ``facts`` (one host's full_info) so the next placement sees it."""
    host = facts.setdefault("host", {})
    if vm.get("state") in ("running", "paused", "blocked"):
        host["mem_used_by_vms"] = int(host.get("mem_used_by_vms") or 0) + int(vm.get("mem") or 0)
        host["vcpus_used_by_vms"] = int(host.get("vcpus_used_by_vms") or 0) + int(vm.get("cpu") or 0)
    host["vms_defined"] = int(host.get("vms_defined") or 0) + 1
    facts.setdefault("vm_info", {})[name] = vm


def evacuate(
    remote: publish.Fleet,
    host: str,
    policy: Data | None = None,
    live: bool = True,
    tunnel: bool = False,
    dry_run: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    transport: str | None = None,
) -> Data:
    """Migrate every VM off ``host`` (a hypervisor minion); see the runner's ``virt.evacuate``."""
    facts = remote.gather("virt.full_info")
    if host not in facts:
        raise publish.Failed(f"{host} is not a known hypervisor (known: {', '.join(sorted(facts))})")
    if facts[host]["status"] != "up":
        raise publish.Failed(f"{host} is {facts[host]['status']}: {facts[host].get('error')}: cannot evacuate it")
    vms = facts[host]["vm_info"]
    # biggest first: the hardest to place get the most choice; running before stopped
    order = sorted(vms, key=lambda n: (vms[n].get("state") != "running", -int(vms[n].get("mem") or 0), n))
    out = move_off(remote, facts, [(host, n) for n in order], policy, live, tunnel, dry_run, timeout, transport)
    return {"host": host, **out}


def move_off(
    remote: publish.Fleet,
    facts: dict[str, Data],
    picks: list[tuple[str, str]],
    policy: Data | None = None,
    live: bool = True,
    tunnel: bool = False,
    dry_run: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    transport: str | None = None,
) -> Data:
    """Migrate each VM of ``picks`` (``(its hypervisor, name)``, in this order) off its hypervisor to the host
    placement ranks best among ``facts`` (every hypervisor's ``virt.full_info``; each move is booked in it so
    the next placement sees it); a target that fails is skipped and the next one tried while the VM is still
    where it was. ``virt.evacuate`` (one host's VMs) and ``virt.evacuate select=`` (a selection's)."""
    pol = policy or placement.make_policy()
    moved, failed, plan = {}, {}, {}
    for host, name in picks:
        vm = dict(facts[host]["vm_info"][name])
        tried = {host}
        errors: list[str] = []
        while True:
            ranked = placement.rank(facts, _request(vm), pol, exclude=tried)
            if not ranked["host"]:
                failed[name] = {"error": "; ".join(errors) or ranked["reason"], "excluded": ranked["excluded"]}
                break
            choice = ranked["host"]
            if dry_run:
                plan[name] = {"target": choice, "score": ranked["ranking"][0]["score"], "reason": ranked["reason"]}
                _book(facts[choice], vm, name)
                break
            try:
                moved[name] = migrate(
                    remote,
                    name,
                    choice,
                    source=host,
                    hosts=facts,
                    live=live,
                    tunnel=tunnel,
                    timeout=timeout,
                    transport=transport,
                )
            except CommandExecutionError as exc:
                errors.append(str(exc))
                details = getattr(exc, "details", {})
                # retry elsewhere only while the VM is verifiably where it was (never after a timeout)
                if not details.get("retry", True) or details.get("source_state") not in (None, vm.get("state")):
                    failed[name] = {"error": "; ".join(errors), **details}
                    break
                tried.add(choice)
                continue
            if errors:
                moved[name]["failed_first"] = errors
            _book(facts[choice], vm, name)
            break
    if dry_run:
        return {"dry_run": True, "plan": plan, "cannot_place": failed}
    return {"evacuated": not failed, "moved": moved, "failed": failed, "left": sorted(failed)}
