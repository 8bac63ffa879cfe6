"""Continuous balancing's rounds (issue 38, opt-in: ``virt:balance:enabled``): :func:`run_round` reads
``virt:balance``, gathers the fleet (``virt.full_info`` of every hypervisor, signed answers), decides with
:func:`saltvirt.fleet.balance.decide`, commits and performs the round's moves. ``salt-run virt.balance`` runs one
round (a dry run by default), the master engine ``virt_balance`` one every ``interval`` seconds (:func:`serve`);
each round that ran fires :data:`saltvirt.fleet.balance.TAG` (progress only). User guide: docs/topics/recovery.md.

One round at a time, fleet-wide, and never over the previous round's migrations:

* the round lock (:data:`ROUND_LOCK`, a :mod:`saltvirt.fleet.fleetstate` lock of kind ``virt.balance``) is held
  from before the state is read until the round's moves ended: another master's round (or a ``salt-run
  virt.balance`` meanwhile) is ``busy`` and does nothing;
* the moves in flight (:data:`MOVING` in bank ``salt-virt/balance``: round, VMs, ``until``) are written before the
  first migration starts and removed once the last one ended. A master that died meanwhile leaves them, and no
  round gathers or moves anything before ``until`` (``virt:migration_timeout`` per move, plus the lock ttl): its
  migrations may still run on the hypervisors. A migration that timed out (it may still run) keeps them
  ``virt:migration_timeout`` longer;
* a round's moves are made only when :func:`saltvirt.fleet.balance.commit` stored its state (compare-and-set on the
  round number): a master whose round another one committed first moves nothing (``committed: False``).

Each move is :func:`saltvirt.fleet.rebalance.apply`'s :func:`saltvirt.fleet.relocate.migrate` (the per-VM lock
``virt.migrate`` takes) with ``virt.migrate``'s checks on the target: room reserved there until the move ends,
maintenance, anti-affinity, and for a tenant's VM its hypervisor group quotas (:func:`saltvirt.fleet.quota.move`,
under the tenant ledger's compare-and-set). The outcome of every move goes into the decision log too
(``moved``/``move_failed``).
"""

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from salt.exceptions import SaltException

from saltvirt.base import config
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import (
    balance,
    engineloop,
    fleetstate,
    placement,
    publish,
    quota,
    rebalance,
    recovery,
    relocate,
    runprogress,
    tenants,
)

log = logging.getLogger(__name__)

ROUND_LOCK = "virt.balance:round"  # a lock name no VM or minion id has (':')
MOVING = "moving"  # bank balance.BANK: the moves of the round at work
MOVED, MOVE_FAILED = "moved", "move_failed"  # the log's records of what a move did
DISABLED = (
    "continuous balancing is off: set virt:balance:enabled: True in the master config (salt-run virt.rebalance "
    "proposes moves once, without it)"
)
DEFAULT_INTERVAL = 60.0


def _answer(policy_on: bool, dry_run: bool, **more: Any) -> Data:
    return {"enabled": policy_on, "dry_run": dry_run, **more}


def run_round(
    opts: SaltOpts,
    cfg: Data | None = None,
    client: Any = None,
    now: float | None = None,
    dry_run: bool = False,
    fire: Callable[[Data], Any] | None = None,
) -> Data:
    """One balancing round (see the module doc) with the master's ``opts``; ``cfg``:
    :func:`saltvirt.fleet.publish.config` (None: the master's); ``now``: the round's time (None: now). ``dry_run``:
    decide only (nothing is committed, logged, moved or fired). ``fire(answer)``: how a round that ran is announced
    (None: as :data:`saltvirt.fleet.balance.TAG` on the master's bus, :func:`saltvirt.fleet.runprogress.fire`). The
    answer: ``enabled``, ``dry_run``; when the round ran, ``ran: True``, ``committed``, ``moved``, ``failed`` and the
    round (:func:`saltvirt.fleet.balance.event_data`); else ``ran: False`` and ``reason``."""
    conf = config.master_virt(opts)[0]
    policy = balance.make_policy(conf.get("balance"), placement.make_policy(conf.get("placement")))
    if not policy["enabled"]:
        return _answer(False, dry_run, ran=False, reason=DISABLED)
    tunnel, timeout = relocate.settings(conf)
    remote = publish.Fleet(opts, cfg, client) if cfg else publish.Fleet.of_master(opts, client)
    store = fleetstate.Store(opts)
    if dry_run:
        result, _hosts, _tenancy = _decide(remote, store, policy, now)
        return _answer(True, True, ran=True, committed=False, **balance.event_data(result))
    try:
        lease = fleetstate.Lease(store, opts, "virt.balance", [ROUND_LOCK]).acquire()
    except fleetstate.HeldError as exc:
        return _answer(True, False, ran=False, reason=f"another round is at work: {exc}")
    try:
        out = _round(remote, store, lease, policy, now, tunnel, timeout)
    finally:
        unreleased = lease.release()
    if unreleased:
        out.setdefault("warnings", []).append(unreleased)
    if out.get("ran"):
        (fire or (lambda data: runprogress.fire(opts, balance.TAG, data)))(out)
    return out


def _decide(remote, store, policy, now):
    """``(round, snapshot, tenancy)``: the state read first (a round committed while the fleet answers makes this
    one's commit fail), then every hypervisor's ``virt.full_info`` and the tenants' ledgers."""
    state = balance.load_state(store)
    since = time.time()  # quota entries settled after this are not in the snapshot yet
    hosts = remote.gather("virt.full_info")
    conf = tenants.config(remote.opts)["tenants"]
    tenancy = balance.Tenancy(conf, store.entries(quota.QUOTAS) if conf else {}, since)
    return balance.decide(hosts, policy, state, time.time() if now is None else now, tenancy), hosts, tenancy


def _round(remote, store, lease, policy, now, tunnel, timeout):
    clock = time.time() if now is None else now
    waiting = in_flight(store, clock)
    if waiting:
        return _answer(True, False, ran=False, reason=waiting)
    result, hosts, tenancy = _decide(remote, store, policy, now)
    out = _answer(True, False, ran=True, **balance.event_data(result), moved={}, failed={})
    if not balance.commit(store, result):
        out["committed"] = False
        out["reason"] = (
            f"round {result['round']} was committed by another master first: nothing moved here (its moves, if "
            "any, are that master's)"
        )
        return out
    out["committed"] = True
    if result["moves"]:
        out.update(_perform(remote, store, lease, result, policy, hosts, tenancy, tunnel, timeout, clock))
    return out


def in_flight(store: fleetstate.Store, now: float) -> str | None:
    """Why no round may move now (a round's migrations may still run: :data:`MOVING`), or None. An entry whose
    ``until`` passed is dropped."""
    rec = store.fetch(balance.BANK, MOVING)
    if not rec:
        return None
    if rec.get("until", 0) > now:
        own = rec.get("owner") or {}
        return (
            f"round {rec.get('round')}'s moves ({', '.join(rec.get('vms') or [])}), started by master "
            f"{own.get('master')} (host {own.get('host')}, pid {own.get('pid')}) at {_ts(rec.get('started'))}, may "
            f"still run until {_ts(rec.get('until'))}: no round gathers or moves before then"
        )

    with contextlib.suppress(fleetstate.AbortUpdate):
        store.transact(balance.BANK, MOVING, _ours(rec.get("token")))
    return None


def _ts(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else "?"


def _perform(remote, store, lease, result, policy, hosts, tenancy, tunnel, timeout, clock):
    """The committed round's moves, with the moves in flight marked around them; ``{moved, failed}``."""
    moves = result["moves"]
    started = time.monotonic()
    marker = {
        "token": lease.token,
        "round": result["round"],
        "vms": [m["vm"] for m in moves],
        "owner": lease.owner,
        "started": clock,
        "until": clock + timeout * len(moves) + lease.ttl,
    }
    lease.check()  # the round lock still ours (its store answered): else another round may be at work
    store.transact(balance.BANK, MOVING, lambda _old: marker)
    done = rebalance.apply(remote, result, _checks(policy, hosts, tenancy), tunnel=tunnel, timeout=timeout)
    ended = clock + (time.monotonic() - started)
    running = sorted(vm for vm, why in done["failed"].items() if why.get("status") == "timeout")
    if running:  # it may still be migrating: no round moves before it must have ended
        store.transact(balance.BANK, MOVING, lambda _old: dict(marker, vms=running, until=ended + timeout))
    else:
        with contextlib.suppress(fleetstate.AbortUpdate):
            store.transact(balance.BANK, MOVING, _ours(lease.token))
    balance.JOURNAL.append(store, _outcomes(result, done, ended))
    if done["moved"]:
        try:
            recovery.refresh(remote)  # the record follows the VMs (virt.recover reads it)
        except SaltException as exc:  # the moves are done: report them, and that the record is behind
            done["record"] = f"not recorded again ({exc}): run salt-run virt.record"
    return done


def _ours(token):
    def drop(old):
        if not old or old.get("token") != token:
            raise fleetstate.AbortUpdate

    return drop


def _checks(policy: Data, hosts: dict[str, Data], tenancy: balance.Tenancy) -> Callable[[Data], Data]:
    """``checks(move)`` for :func:`saltvirt.fleet.rebalance.apply`: ``virt.migrate``'s placement checks, and for a
    tenant's VM (of a configured tenant) its hypervisor group quotas counted in ``hosts`` (the round's snapshot)."""

    def checks(move: Data) -> Data:
        vm = (hosts.get(move["from"]) or {}).get("vm_info", {}).get(move["vm"]) or {}
        tenant = (vm.get("owner") or {}).get("tenant")
        conf = tenancy.tenants.get(tenant) if tenant else None
        if conf is None:
            return relocate.placement_checks(policy["placement"])
        who = {"name": tenant, "groups": conf["groups"]}
        return relocate.placement_checks(policy["placement"], who, hosts, tenancy.since)

    return checks


def _outcomes(result: Data, done: Data, at: float) -> list[Data]:
    """The log's records of what each move of ``result`` did (``done``: :func:`saltvirt.fleet.rebalance.apply`'s)."""
    out = []
    for move in result["moves"]:
        name, src, dst = move["vm"], move["from"], move["to"]
        base = {"round": result["round"], "at": at, "vm": name, "host": src, "to": dst}
        if name in done["moved"]:
            took = done["moved"][name].get("seconds")
            out.append(dict(base, decision=MOVED, reason=f"{name} moved from {src} to {dst} in {took} s"))
        else:
            error = (done["failed"].get(name) or {}).get("error")
            out.append(dict(base, decision=MOVE_FAILED, reason=f"moving {name} from {src} to {dst} failed: {error}"))
    return out


# announcing a round, and running rounds continuously ---------------------------------------------------
def summary(answer: Data) -> str:
    """One log line of a round's answer."""
    if not answer.get("ran"):
        return str(answer.get("reason"))
    moved, failed = sorted(answer.get("moved") or {}), sorted(answer.get("failed") or {})
    kinds = ", ".join(sorted({d["decision"] for d in answer.get("decisions") or []}))
    return (
        f"round {answer.get('round')}: {kinds or 'no decision'}; committed {answer.get('committed')}, "
        f"moved {moved or 'none'}, failed {failed or 'none'}"
    )


def serve(
    opts: SaltOpts,
    interval: Any = DEFAULT_INTERVAL,
    stop: threading.Event | None = None,
    client_factory: Callable[[], Any] | None = None,
    reload: Callable[[SaltOpts], SaltOpts] | None = None,
) -> None:
    """Run :func:`run_round` every ``interval`` seconds until ``stop`` is set (the master engine ``virt_balance``;
    the loop: :func:`saltvirt.fleet.engineloop.serve`)."""
    engineloop.serve("virt_balance", opts, run_round, _report, interval, stop, client_factory, reload)


def _report(answer):
    (log.info if answer.get("ran") or not answer.get("enabled") else log.warning)("virt_balance: %s", summary(answer))
