"""The master side of ``virt.init`` (the ``virt`` runner's ``virt.init``).

Steps: take the per-VM lock (:mod:`saltvirt.fleet.fleetstate`), refuse a name that exists on a hypervisor (or
may exist on one that did not answer: :func:`check_name`), take the tenant's quota, place the VM
(:mod:`saltvirt.fleet.placement`, with the capacity in-flight creations reserved), pre-accept a
new key pair for the VM's minion (:mod:`saltvirt.fleet.minionkeys`) and seal its private key for the chosen
hypervisor only (:mod:`saltvirt.pki.envelope`), run ``virt.init`` there (:class:`saltvirt.fleet.publish.Fleet`), falling
over to the next candidate only when a hypervisor does not answer (with a fresh key pair), and check
that the hypervisor seeded our key. On failure the key it stored is taken back.

Names and quotas are checked in answers of every hypervisor; a per-call ``tgt`` (and a tenant's
``hypervisors``) narrows only the placement candidates.
"""

import contextlib
import logging
import math
import os
import time
from typing import Any

import salt.fileserver
import salt.utils.url
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, validate
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import (
    capacitypush,
    fleetstate,
    hypervisors,
    leftovers,
    minionkeys,
    placement,
    publish,
    quota,
    tenants,
)
from saltvirt.fleet.publish import Failed, down_hosts
from saltvirt.model import compat, vmargs
from saltvirt.pki import answers, envelope

log = logging.getLogger(__name__)


def image_mib(opts: SaltOpts, image: str | None, saltenv: str = "base") -> tuple[int, str]:
    """``(MiB, note)``: the disk a full copy of ``image`` needs, measured on the master when it can be."""
    if not image:
        return 0, "no image"
    if isinstance(image, str) and image.startswith("salt://"):
        path, env = salt.utils.url.parse(image)
        try:
            fnd = salt.fileserver.Fileserver(opts).find_file(path, env or saltenv)
        except Exception as exc:  # noqa: BLE001 - size is advisory; the hypervisor reports real errors
            return 0, f"size unknown ({exc})"
        if not fnd or not fnd.get("path"):
            raise SaltInvocationError(f"image {image} is not on the master's fileserver (saltenv {env or saltenv})")
        return math.ceil(os.path.getsize(fnd["path"]) / 1048576), f"{image}: measured in the master's file_roots"
    return 0, f"size of {validate.shown_url(image)} unknown on the master: not counted"


def forward(kwargs: Data, where: str = "salt-run virt.init") -> Data:
    """The keywords ``salt-run virt.init`` passes on to the hypervisor's ``virt.init``: ``kwargs`` (Salt's
    old spellings already mapped by :func:`saltvirt.model.compat.init_args`) minus the loader's ``__`` keys.
    Refuses what the runner sets itself (the table, :mod:`saltvirt.model.vmargs`, says what) and names it does
    not know (with the nearest one)."""
    kwargs = {k: v for k, v in kwargs.items() if not str(k).startswith("__")}
    refused = sorted(k for k in kwargs if k in vmargs.BY_NAME and vmargs.BY_NAME[k].runner == vmargs.REFUSE)
    if refused:  # the value is not echoed (a key, a URI)
        arg = refused[0]
        raise SaltInvocationError(
            f"{where}: {arg}= is not forwarded to the hypervisors: {vmargs.BY_NAME[arg].refusal}; drop {arg}="
        )
    # SALT_TAKEN (images=): checked by the hypervisor (compat.images_dir)
    compat.refuse_unknown(
        kwargs, [*(a.name for a in vmargs.ARGS if a.runner != vmargs.REFUSE), *vmargs.SALT_TAKEN], where
    )
    return kwargs


SALT_DEFAULT_PORTS = {"master_port": 4506, "publish_port": 4505}


def guest_master(opts: SaltOpts, conf: Data, module_kwargs: Data) -> Data:
    """Where the new VM's minion finds this master, unless the caller said so (``master=`` /
    ``minion_config=``): ``virt:guest_master`` from the master config (an address or a list, as the
    minion's ``master`` setting), and this master's ports when they are not Salt's defaults (a guest
    cannot guess them). Without ``virt:guest_master`` the minion keeps Salt's default (``salt``)."""
    kwargs = dict(module_kwargs)
    if kwargs.get("master") is None and conf.get("guest_master"):
        kwargs["master"] = conf["guest_master"]
    ports = {"master_port": opts.get("ret_port"), "publish_port": opts.get("publish_port")}
    extra = {k: int(v) for k, v in ports.items() if v and int(v) != SALT_DEFAULT_PORTS[k]}
    config = kwargs.get("minion_config")
    if extra and (config is None or isinstance(config, dict)):
        kwargs["minion_config"] = dict(extra, **(config or {}))
    return kwargs


def _entry(plan, host):
    return next((r for r in plan["ranking"] if r["host"] == host), {"host": host, "score": None, "asked_for": True})


def _brief(plan):
    return {
        "reason": plan["reason"],
        "ranking": [{"host": r["host"], "score": r["score"]} for r in plan["ranking"]],
        "excluded": plan["excluded"],
    }


class NameTaken(Failed):
    """A VM of that name is defined on a hypervisor."""


def create(
    opts: SaltOpts,
    name: str,
    req: Data,
    image: str | None,
    module_kwargs: Data,
    job: str | None = None,
    private: bool = False,
    *,
    policy: Data | None = None,
    fleet: publish.Fleet,
    host: str | None = None,
    fallback: bool = True,
    seed: bool = True,
    minion_id: str | None = None,
    progress: Any = None,
    tenant: Data | None = None,
    operator: bool = False,
) -> Data:
    """Place, pre-accept the new minion's key, run ``virt.init`` on the chosen hypervisor (falling over
    to the next candidate only when a hypervisor does not answer), return where it went and its info.
    Raises :class:`Failed` with ``tried``/``cleanup`` details; the key it stored is removed on failure.
    ``private`` (a tenant caller): a name a VM, a minion key or a call in flight has is refused with
    :func:`saltvirt.fleet.tenants.name_taken`, never with whose it is or where. ``policy``: placement's
    (:func:`saltvirt.fleet.placement.make_policy`); ``fleet``: the transport to the hypervisors; ``host``: the
    hypervisor asked for (``fallback``: others when it does not answer); ``seed``/``minion_id``: the new
    minion's key; ``tenant``: whose quota it takes (see :func:`_tenant_quota`); ``operator``: the caller is one.

    One ``virt.init`` per VM name / minion id at a time across every master sharing the cache
    (``saltvirt.fleet.fleetstate`` locks); the capacity it takes is reserved from placement until the VM runs."""
    try:
        with fleetstate.lock(opts, [name, minion_id or name], kind="virt.init", job=job) as lease:
            taken = [{"name": t["name"], "why": t["why"], "was": t["was"]} for t in lease.taken_over]
            try:
                result = _create(
                    opts,
                    name,
                    req,
                    image,
                    module_kwargs,
                    policy=policy,
                    fleet=fleet,
                    host=host,
                    fallback=fallback,
                    seed=seed,
                    minion_id=minion_id,
                    progress=progress,
                    lease=lease,
                    tenant=tenant,
                    operator=operator,
                )
            except Failed as exc:
                if taken:
                    exc.details["taken_over"] = taken
                raise
            finally:  # a quota taken before a refusal (placement, a taken name): given back (no-op once ended)
                _quietly(quota.finish, lease.store, lease, "failed")
            if taken:
                result["taken_over"] = taken
            return result
    except (NameTaken, minionkeys.KeyExistsError, fleetstate.HeldError):
        if private:
            raise SaltInvocationError(tenants.name_taken(name)) from None
        raise


def _relay(progress, name):
    """What to watch for the hypervisor's own progress events of ``name``, shown as they come: ``(tag prefix,
    handler)``, or None when ``progress`` does not relay them."""
    relay = getattr(progress, "relay", None)
    return (f"salt/virt/init/{name}/", lambda tag, data: relay(tag.rsplit("/", 1)[-1], data)) if relay else None


def _reserve(lease, hosts, order, start, name, req, policy, since, tried, keep_previous=None, place=None):
    """Reserve ``req`` on the first host of ``order[start:]`` that still has room with every in-flight
    creation counted (other masters' too); hosts without room go to ``tried``. Its position, or None.
    ``keep_previous`` (seconds): the previous candidate did not answer virt.init but may still run it, so
    its reservation stays for that long instead of being dropped. ``place(host)``: the tenant's quota of
    the host's hypervisor groups (:func:`saltvirt.fleet.quota.place`), checked first."""
    if keep_previous:
        fleetstate.finish(lease.store, lease, "unknown", keep_for=keep_previous)
    else:
        fleetstate.finish(lease.store, lease, "failed")  # the previous candidate's, if any
    for pos in range(start, len(order)):
        hv = order[pos]
        try:
            if place:
                place(hv)
        except quota.QuotaError as exc:
            tried.append({"host": hv, "outcome": "quota", "error": str(exc), "jid": None})
            continue
        try:
            fleetstate.reserve(
                lease.store,
                lease,
                hv,
                name,
                req,
                hosts.get(hv),
                since,
                fits=lambda answer, load, hv=hv: placement.fits(hv, answer, req, policy, load),
            )
            return pos
        except fleetstate.NoRoomError as exc:
            tried.append(
                {"host": hv, "outcome": "no room", "error": f"in-flight inits took the room: {exc}", "jid": None}
            )
    return None


def _create(
    opts,
    name,
    req,
    image,
    module_kwargs,
    *,
    policy,
    fleet,
    host=None,
    fallback=True,
    seed=True,
    minion_id=None,
    progress=None,
    lease=None,
    tenant=None,  # the tenant the VM is for (see _tenant_quota)
    operator=False,  # the caller is an operator (see check_name)
):
    progress = progress or (lambda step, **data: None)
    started = time.monotonic()
    key_id = minion_id or name
    seed = bool(seed and image)  # seeding writes into the image's filesystem: no image, no key to hand out
    if seed:
        minionkeys.refuse_existing_key(opts, key_id)
    with _before_placing(name):
        # since: the snapshot's oldest figure (a pushed record's time); reservations settled after it count
        every, warnings, since = _snapshot(fleet.wide(), name, progress, lease, operator)
        hosts = fleet.within_target(every)  # tgt: where the VM may go, not which VMs count
        hosts, place, full = _tenant_quota(fleet.wide(), lease, tenant, name, req, hosts, since)
        load = fleetstate.reserved(lease.store, hosts, since, lease.cfg)
        plan = placement.rank(hosts, req, policy, exclude=full, reserved=load, top=placement.RANK_TOP)
        order = _order(plan, hosts, name, host, fallback, every)
        tried: list[Data] = []  # {host, outcome, error, jid} of every host tried, in order
        first = _reserve(lease, hosts, order, 0, name, req, policy, since, tried, place=place)
    if first is None:
        raise _no_room(name, plan, tried)
    order = order[first:]
    _placed(plan, hosts, order[0], progress)
    keys = _NewKey(opts, key_id, progress, vm=name)
    if seed:
        keys.fresh()
    watch = _relay(progress, name)
    base_kwarg = dict(module_kwargs, image=image, seed=seed, **({"group": req["group"]} if req.get("group") else {}))
    need = host_need(req, policy)
    try:
        pos, attempt, hv = 0, 0, order[0]  # hv: the host at work (also for the report if the master stops)
        while pos < len(order):
            hv = order[pos]
            attempt += 1
            if seed and attempt > 1:  # a fresh key per host: a late VM on a host that did not answer cannot log in
                keys.fresh()
            pub_jid, kwarg = _sealed_kwarg(fleet, hv, base_kwarg, name, keys if seed else None)
            ans, jid = _publish_init(
                fleet,
                hv,
                [name, req["cpu"], req["mem"]],
                kwarg,
                need,
                watch,
                progress,
                pub_jid,
                lease,
                keys if seed else None,
                tried,
            )
            if ans["status"] == "up":
                unsettled = _end(lease, "settled")
                result = _created(fleet, name, hv, ans, jid, plan, tried, keys if seed else None, started, progress)
                return _warn(result, [*warnings, unsettled])
            _note_attempt(opts, lease, tried, name, hv, ans, jid)
            _unless_master_gone(opts, ans["status"] == "down", name, hv, jid, key_id, tried, keys, lease, fleet.cfg)
            unsure = ans["status"] == "down" and _still_may_create(fleet, hv, hosts, ans, name)
            # no room there: the host's own check refused before virt.init ran (its figures were newer than ours)
            if (_no_room_there(ans) or (ans["status"] == "down" and not unsure)) and fallback and pos + 1 < len(order):
                # an unanswered one's room stays reserved for as long as the init could have run there
                nxt = _reserve(
                    lease,
                    hosts,
                    order,
                    pos + 1,
                    name,
                    req,
                    policy,
                    since,
                    tried,
                    keep_previous=fleet.cfg["init_timeout"] if ans["status"] == "down" else None,
                    place=place,
                )
                if nxt is not None:
                    progress("fallback", host=hv, error=ans.get("error"), next=order[nxt])
                    pos = nxt
                    continue
            if ans["status"] == "timeout" or unsure:
                keys.keep = True  # it may still finish there: its key stays for it
            if ans["status"] in ("timeout", "down"):
                # it may still run (or create the VM) there: its capacity stays reserved for as long as it may
                _end(lease, "unknown", keep_for=fleet.cfg["init_timeout"])
            raise _attempt_failed(name, hv, ans, jid, fleet.cfg, key_id, tried, unsure)
    except BaseException as exc:
        _unless_master_gone(opts, not isinstance(exc, Failed), name, hv, None, key_id, tried, keys, lease, fleet.cfg)
        _end(lease, "failed")  # no-op when settled or kept for a timeout
        if seed and not keys.keep:
            removed = minionkeys.remove_key(opts, key_id, keys.pub) if keys.pub else False
            if isinstance(exc, Failed):
                exc.details["cleanup"] = {"key_removed": removed, "minion_id": key_id}
        raise
    raise Failed(f"virt.init of {name}: no candidate left", tried=tried)  # pragma: no cover - loop returns/raises


def _no_room(name, plan, tried):
    """No candidate could be reserved: the tenant's quota of their hypervisor groups when that refused every
    one, else in-flight inits took the room."""
    quota_full = [t["error"] for t in tried if t["outcome"] == "quota"]
    why = quota_full[0] if tried and len(quota_full) == len(tried) else "in-flight inits reserved the room (see tried)"
    return Failed(f"no host can take {name} any more: {why}", placement=_brief(plan), tried=tried)


def _note_attempt(opts, lease, tried, name, hv, ans, jid):
    tried.append({"host": hv, "outcome": ans["status"], "error": ans.get("error"), "jid": jid})
    if ans["status"] in ("down", "timeout"):  # it may leave disks and seeding there: cleaned once it answers
        leftovers.remember(lease.store, hv, name, jid, ans["status"], opts.get("id"))


def _tenant_quota(fleet, lease, tenant, name, req, hosts, since):
    """Take the tenant's quota for the VM (counted over the VMs of every hypervisor ``fleet`` targets, by the owner
    in their <metadata>: one ``virt.full_info`` round trip, the placement snapshot has no per-VM facts) and keep
    only the tenant's hypervisors among the candidates ``hosts``. ``tenant``: ``{name, quota, allowed(host),
    groups, disk_mib}`` or None (``disk_mib``: the disk its quota counts, default the request's).
    ``(candidates, place, full)``: ``place(host)`` checks the tenant's quotas per hypervisor group (None
    without); ``full``: ``{host: [reason]}`` of candidates whose group quota is used up already (placement
    passes them over, so they are not tried)."""
    if not tenant:
        return hosts, None, {}
    fleet_vms = fleet.gather("virt.full_info")
    asked = dict(req, disk_mib=tenant.get("disk_mib", req["disk_mib"]))  # the image and the new disks
    quota.reserve(lease.store, lease, tenant["name"], name, asked, fleet_vms, since, tenant["quota"])
    groups = tenant.get("groups")
    candidates = {h: a for h, a in hosts.items() if tenant["allowed"](h)}
    if not groups:
        return candidates, None, {}

    def place(host):
        quota.place(lease.store, lease, host, fleet_vms, since, groups)

    return candidates, place, quota.full(lease.store, lease, candidates, fleet_vms, since, groups)


def _end(lease, outcome, keep_for=None):
    """End the host reservation and the tenant quota entry of ``lease`` alike (see fleetstate.finish).
    A store that cannot be written never hides the call's outcome: what could not be ended is returned as
    a sentence (its entries expire by themselves), None when both ended."""
    errors = [
        err
        for err in (
            _quietly(fleetstate.finish, lease.store, lease, outcome, keep_for=keep_for),
            _quietly(quota.finish, lease.store, lease, outcome, keep_for=keep_for),
        )
        if err
    ]
    if not errors:
        return None
    return (
        f"its capacity reservation could not be marked {outcome} in the shared runner state: {errors[0]} "
        f"(the entry expires by itself within virt:shared:lock_ttl, {lease.ttl:g} s)"
    )


def _quietly(func, *args, **kwargs):
    """``func(*args, **kwargs)`` for bookkeeping in the shared store: its error message (logged), or None."""
    try:
        func(*args, **kwargs)
    except CommandExecutionError as exc:
        log.warning("virt.init: %s", exc)
        return str(exc)
    return None


def _lease_lost(name, hv, jid, key_id, exc, tried):
    """The error when the lock of ``name`` was lost while ``virt.init`` ran on ``hv`` as job ``jid``."""
    key = f"; the key of {key_id} is kept for it (salt-key -d {key_id} if the VM never appears)" if key_id else ""
    return Failed(
        f"stopped waiting for virt.init of {name} on {hv} (job {jid}): {exc}. "
        f"The job may still create the VM there: check with `salt-run jobs.lookup_jid {jid}` and, once the "
        f"store answers, `salt-run virt.query`; `salt-run virt.purge {name}` removes it if it is not wanted{key}",
        tried=[*tried, {"host": hv, "outcome": "unknown", "error": str(exc), "jid": jid}],
    )


@contextlib.contextmanager
def _before_placing(name):
    """Until a host is reserved nothing exists yet: a lost lock or a shared store that stopped answering
    (whichever the call meets first) stops ``virt.init`` with one message saying so."""
    try:
        yield
    except (fleetstate.LeaseLost, fleetstate.StoreError) as exc:
        raise Failed(f"virt.init of {name} stopped before placing it, nothing was created: {exc}") from None


def _snapshot(fleet, name, progress, lease, operator):
    """Every hypervisor's capacity (``virt.capacity``: no per-VM facts; pushed records where they are fresh,
    :mod:`saltvirt.fleet.capacitypush`) for placement, the warnings of :func:`check_name` (which refuses a name
    that is or may be in use) and the time of the snapshot's oldest figure. Stops (nothing published yet) if the
    lock of ``name`` is lost meanwhile."""
    hosts, since = capacitypush.capacities(fleet, check=lease.check)
    pushed = sum(1 for a in hosts.values() if "pushed_at" in a)
    _mark(progress, "hosts_queried", pushed=pushed, asked=len(hosts) - pushed)
    return hosts, check_name(hosts, name, lease.store, operator), since


def _warn(result, warnings):
    """``result`` with ``warnings`` (None: none) added to its ``warnings``."""
    warnings = [w for w in warnings if w]
    if warnings:
        result.setdefault("warnings", []).extend(warnings)
    return result


def _sealed_kwarg(fleet, hv, base_kwarg, name, keys):
    """``(jid, kwarg)``: a new job id and virt.init's arguments with its secrets (console password, the
    minion's private key when ``keys``) sealed for ``hv``, to open in that job only."""
    pub_jid = fleet.new_jid()
    kwarg = seal_console_password(fleet.opts, hv, dict(base_kwarg), name, pub_jid)
    if keys:
        kwarg.update(pub_key=keys.pub, priv_key=keys.sealed_for(hv, pub_jid), minion_id=keys.key_id)
    return pub_jid, kwarg


def host_need(req: Data, policy: Data | None) -> Data:
    """What the hypervisor checks again before it creates the VM (``virt.answer``'s ``capacity``): the room
    ``req`` takes and the placement ``policy``'s reserves and overcommit (:func:`saltvirt.host.capacity.overcommit`)."""
    pol = policy or placement.make_policy()
    return {
        "cpu": req["cpu"],
        "mem": req["mem"],
        "disk_mib": req.get("disk_mib") or 0,
        **{k: pol[k] for k in ("mem_reserve_mib", "cpu_overcommit", "disk_reserve_mib")},
    }


def _no_room_there(ans):
    """Whether ``ans`` is the hypervisor's own refusal for want of room (nothing was created there)."""
    return ans["status"] == "error" and answers.NO_ROOM in str(ans.get("error"))


def _publish_init(fleet, hv, args, kwarg, need, watch, progress, job, lease, keys, tried):
    """``virt.init`` on ``hv`` under ``lease``: never published for a name whose lock is no longer held; when
    the lock is lost while waiting (the store stopped answering), the job may still create the VM there, so
    its key (``keys``) and its room stay, and the error says where to look."""
    lease.check()
    lease.note(host=hv)
    try:
        return _call_init(fleet, hv, args, kwarg, need, watch, progress, job, lease.check)
    except fleetstate.LeaseLost as exc:
        if keys:
            keys.keep = True
        _end(lease, "unknown", keep_for=fleet.cfg["init_timeout"])
        raise _lease_lost(args[0], hv, job, keys.key_id if keys else None, exc, tried) from None


def _call_init(fleet, hv, args, kwarg, need, watch, progress, job, check):
    """``virt.init`` on ``hv`` (bounded by ``init_timeout``) as job ``job``, its publication and answer on
    the timeline; ``need``: the room the host checks first (:func:`host_need`); ``check``: the lease's (raises
    when the lock is lost while waiting)."""
    _mark(progress, "published", host=hv)
    ans, jid = fleet.call(
        hv,
        "virt.init",
        args,
        kwarg,
        max_wait=fleet.cfg["init_timeout"],
        watch=watch,
        jid=job,
        check=check,
        capacity=need,
    )
    _mark(progress, "returned", host=hv, status=ans["status"])
    return ans, jid


def _mark(progress, step, **data):
    """A step for the runner's timeline only (no event): ``progress.mark`` when the callback has one."""
    mark = getattr(progress, "mark", None)
    if mark is not None:
        mark(step, **data)


def _unless_master_gone(opts, suspect, name, hv, jid, key_id, tried, keys, lease, cfg):
    """If ``suspect`` (no answer, or an error while waiting) and the salt-master stopped: the job may well
    finish on the hypervisor without it, and its VM needs the pre-accepted key, so the key stays, its room
    stays reserved and the outcome is reported as unknown."""
    if not suspect or publish.master_running(opts):
        return
    keys.keep = True
    _end(lease, "unknown", keep_for=cfg["init_timeout"])
    message = leftovers.master_gone_message(name, hv, jid, key_id)
    log.error("%s", message)  # salt-run itself may fail to print its answer without a master
    raise Failed(message, tried=tried) from None


NAME_UNSURE = (
    "cannot tell whether a VM named {name!r} exists: {silent} did not answer and may have one{why}; "
    "retry virt.init of {name} when {they}"
)


def check_name(hosts: dict[str, Data], name: str, store: fleetstate.Store, operator: bool) -> list[str]:
    """Refuse (:class:`Failed`) a new VM ``name`` that a hypervisor of ``hosts`` (every hypervisor's answer)
    defines, or that may be defined on one that did not answer: for a tenant member, while any of them is
    silent (the master cannot tell which names are free there); for an operator (who may define a VM on a
    hypervisor directly anyway), while a tenant's quota ledger has the name (that tenant's VM may be there).
    The warnings of a name an operator creates while a hypervisor is silent."""
    where = sorted(h for h, a in hosts.items() if a["status"] == "up" and name in a["vm_info"])
    if where:
        raise NameTaken(f"a VM named {name!r} already exists on {', '.join(where)}: pick another name or purge it")
    silent = down_hosts(hosts)
    if not silent:
        return []
    listed = ", ".join(f"{h} ({hosts[h]['status']})" for h in silent)
    holders = quota.holders(store, name) if operator else []
    if holders or not operator:
        why = f" (tenant {', '.join(holders)}'s quota ledger has it)" if holders else ""
        they = "it answers" if len(silent) == 1 else "they answer"
        raise Failed(NAME_UNSURE.format(name=name, silent=listed, why=why, they=they), down=silent)
    return [f"{listed} did not answer: a VM named {name!r} there was not seen (no tenant's quota ledger has one)"]


def _order(plan, hosts, name, host, fallback, every):
    """The hypervisors to try, in order: the ranking, or ``host=`` first (only it with ``fallback=False``).
    ``hosts``: the candidates; ``every``: every hypervisor's answer."""
    order = [r["host"] for r in plan["ranking"]]
    if host:
        if host in every and host not in hosts:
            raise Failed(
                f"{host} is not a candidate for {name}: this call's tgt (or the tenant's hypervisors) leaves it out",
                placement=_brief(plan),
            )
        if host not in hosts:
            raise Failed(
                f"{host} is not one of the hypervisors ({', '.join(sorted(hosts)) or 'none found'}): "
                "check the name, or virt:hypervisors in the master config",
                placement=_brief(plan),
            )
        status = hosts[host]["status"]
        if status == "up" and host in plan["excluded"]:
            raise Failed(f"{host} cannot take {name}: {'; '.join(plan['excluded'][host])}", placement=_brief(plan))
        if status == "up" or (status == "down" and fallback):
            # a host that was down for the query may be back: it is tried first, the ranking after it
            order = [host] + ([h for h in order if h != host] if fallback else [])
        else:
            raise Failed(
                f"{host} is {status}: {hosts[host].get('error')}" + ("" if fallback else " (fallback=False)"),
                placement=_brief(plan),
            )
    if not order:
        raise Failed(plan["reason"], placement=_brief(plan), tried=[])
    return order


def _placed(plan, hosts, first, progress):
    chosen = _entry(plan, first)
    reason = plan["reason"] if first == plan["host"] else f"{first}: asked for with host="
    if hosts[first]["status"] != "up":
        reason += f" (it did not answer the query: {hosts[first].get('error')}; trying it, then the ranking)"
    progress("placed", host=first, score=chosen["score"], scores=chosen.get("scores"), reason=reason)


class _NewKey:
    """The new VM's minion key pair, pre-accepted on this master; a fresh pair replaces the previous one."""

    def __init__(self, opts, key_id, progress, vm=None):
        self.opts, self.key_id, self.progress, self.vm = opts, key_id, progress, vm or key_id
        self.pub: str | None = None  # the key pair fresh() made and the master accepted
        self.priv: str | None = None
        self.info: Data | None = None
        self.keep = False  # True: leave the key on failure (a timed-out virt.init may still use it)

    def fresh(self):
        if self.pub:
            minionkeys.remove_key(self.opts, self.key_id, self.pub)
            self.pub = None
        pub, priv = envelope.new_keypair()
        hypervisors.record_vm_id(self.opts, self.key_id, self.vm)  # before the key: never a hypervisor
        minionkeys.preaccept(self.opts, self.key_id, pub)
        # sha256 of minion.pub as written (what `sha256sum minion.pub` and the module's virt.init report)
        fingerprint = fsutil.sha256(pub)
        self.progress("key_accepted", minion_id=self.key_id, fingerprint=fingerprint)
        self.pub, self.priv = pub, priv
        self.info = {"minion_id": self.key_id, "state": "accepted", "fingerprint": fingerprint}

    def sealed_for(self, hv, job):
        """The private key sealed for hypervisor ``hv``'s accepted key (never what a minion claims), to be
        opened as ``<minion_id>/priv_key`` in job ``job`` only."""
        if self.priv is None:
            raise CommandExecutionError(f"no key pair was made for {self.key_id} to seal")
        return envelope.seal(minionkeys.accepted_pub(self.opts, hv), self.priv, f"{self.key_id}/priv_key", job)


def _created(fleet, name, hv, ans, jid, plan, tried, keys, started, progress):
    """The runner's answer once ``virt.init`` succeeded on ``hv``."""
    key, warnings = None, []
    if keys:
        key, warnings = _check_seeded_key(fleet.opts, keys.info, keys.pub, ans["ret"])
    vm_info = ans["ret"].get("vm_info") if isinstance(ans["ret"], dict) else None
    if not isinstance(vm_info, dict):  # a hypervisor whose virt.init does not return it: ask (one more round trip)
        info, _ = fleet.call(hv, "virt.vm_info", [name])
        vm_info = (info.get("ret") or {}).get(name) if info["status"] == "up" else None
    result = {
        "name": name,
        "host": hv,
        "placement": dict(_brief(plan), chosen=_entry(plan, hv)),
        "tried": tried,
        "key": key,
        "init": {k: v for k, v in ans["ret"].items() if k != "vm_info"} if isinstance(ans["ret"], dict) else ans["ret"],
        "jid": jid,
        "vm_info": vm_info,
        "seconds": round(time.monotonic() - started, 1),
    }
    if warnings:
        result["warnings"] = warnings
    progress("done", host=hv, seconds=result["seconds"])
    return result


def _still_may_create(fleet, hv, hosts, ans, name):
    """Why the unanswered (``down``) ``virt.init`` of ``name`` on ``hv`` may still create the VM there, or
    "" when it cannot: then the next host may be tried without running one VM twice. It cannot when ``hv``
    did not answer the query before either (the publication did not reach it), or when ``hv`` signed that
    the job is not running (which fences the job there: :mod:`saltvirt.base.jobfence`) and ``name`` is not
    defined there now (the job may have died, or ended unheard, after defining it)."""
    if hosts.get(hv, {}).get("status") != "up":
        return ""
    if not ans.get("gone"):
        return f"{hv} stopped answering while it ran virt.init of {name}, and may still create it"
    there, _jid = fleet.call(hv, "virt.list_domains")
    if there["status"] != "up" or not isinstance(there.get("ret"), list):
        return f"virt.init of {name} ended on {hv} without an answer, and {hv} did not say whether {name} exists"
    if name in there["ret"]:
        return f"virt.init of {name} ended on {hv} without an answer, and {name} is defined there"
    return ""


def _attempt_failed(name, hv, ans, jid, cfg, key_id, tried, unsure=""):
    """The error for a ``virt.init`` that did not succeed on ``hv`` and is not retried elsewhere
    (``unsure``: why it may have created the VM there all the same)."""
    if unsure:
        return Failed(
            f"{unsure} (job {jid}): no other hypervisor was tried, so that {name} never runs twice. "
            f"`salt-run virt.query` shows whether it exists once {hv} answers; the key of {key_id} is kept for "
            f"it (`salt-run virt.purge {name}` removes the VM, whatever the init left there, and the key)",
            tried=tried,
        )
    if ans["status"] == "timeout":
        return Failed(
            f"virt.init of {name} on {hv} was still running after {cfg['init_timeout']:g} s (job {jid}): "
            f"it may still finish. Check with `salt-run jobs.lookup_jid {jid}`; "
            f"the key of {key_id} is kept for it "
            f"(salt-key -d {key_id} if the VM never appears)",
            tried=tried,
        )
    if ans["status"] == "down":
        return Failed(
            f"no hypervisor answered virt.init for {name}: tried {', '.join(t['host'] for t in tried)}",
            tried=tried,
        )
    return Failed(f"virt.init of {name} on {hv} failed: {ans.get('error')}", tried=tried)


def _check_seeded_key(opts, key, pub, init_ret):
    """The hypervisor must have seeded *our* key; otherwise take the pre-accepted one back."""
    ret = init_ret if isinstance(init_ret, dict) else {}
    seeded = ret.get("key") or {}
    if ret.get("seed") and seeded.get("fingerprint") in (None, key["fingerprint"]):
        return key, []
    minionkeys.remove_key(opts, key["minion_id"], pub)
    if not ret.get("seed"):
        return dict(key, state="removed"), [
            "the hypervisor did not seed the VM, so no minion holds the pre-accepted key: removed it"
        ]
    return dict(key, state="removed"), [
        f"the hypervisor seeded another key (sha256 {str(seeded.get('fingerprint'))[:16]}...) "
        f"than the pre-accepted one: removed ours; "
        f"accept the VM's own key with salt-key -a {key['minion_id']} once it connects"
    ]


SEALED_ARG_REFUSED = (
    "salt-run virt.init: {arg} must be given in clear to the runner (it seals it for the chosen hypervisor "
    "itself); a sealed envelope or mapping is never accepted from a call"
)


def refuse_sealed_args(kwarg: Data) -> None:
    """A caller never hands the runner an envelope (or any mapping) where the runner seals a secret: it
    would be forwarded as is and opened by the hypervisor."""
    gfx = kwarg.get("graphics")
    if isinstance(gfx, dict) and gfx.get("password") is not None and not isinstance(gfx["password"], str):
        raise SaltInvocationError(SEALED_ARG_REFUSED.format(arg="graphics:password"))
    if kwarg.get("priv_key") is not None and not isinstance(kwarg["priv_key"], str):
        raise SaltInvocationError(SEALED_ARG_REFUSED.format(arg="priv_key"))


def seal_console_password(opts: SaltOpts, hv: str, kwarg: Data, name: str, job: str) -> Data:
    """A console password given to ``salt-run virt.init`` (``graphics: {password: ...}``) travels sealed
    to hypervisor ``hv``'s accepted minion key, like the new minion's private key (never in clear in the
    publication or the job cache), for job ``job``; the hypervisor's ``virt.init`` opens it."""
    refuse_sealed_args(kwarg)
    gfx = kwarg.get("graphics")
    if isinstance(gfx, dict) and isinstance(gfx.get("password"), str):
        sealed = envelope.seal(minionkeys.accepted_pub(opts, hv), gfx["password"], f"{name}/graphics", job)
        kwarg = dict(kwarg, graphics=dict(gfx, password=sealed))
    return kwarg
