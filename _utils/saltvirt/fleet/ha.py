"""Automatic HA (issue 38, opt-in: ``virt:ha:enabled``): the master engine ``virt_ha`` runs :func:`run_round` every
``interval`` seconds (:func:`serve`). A round decides which hypervisors are lost, and for each one lost long enough
fences it and restarts its HA VMs elsewhere through :func:`saltvirt.fleet.recovery.recover`, the very path of
``salt-run virt.recover`` (its down checks, libvirtd probes, fencing, per-VM locks, last look and claims).
User guide: docs/topics/recovery.md ("Automatic HA").

Lost, from what Salt authenticates only (the event bus is not: any minion can fire any tag), both at once:

* no signed answer: the round's ``virt.full_info`` (:meth:`saltvirt.fleet.publish.Fleet.gather`) reports the hypervisor
  ``down`` (no answer signed with its key, nor to a job check, for ``virt:hypervisors:down_after`` seconds);
* no connection: the master's own transport view (:func:`connected`: Salt's ``CkMinions.connected_ids``, the
  minions whose addresses hold a connection to the master's publish port) does not have it.

A host is acted on once both said lost in every round for ``virt:ha:lost_after`` seconds (one round where either
sees it again starts the count anew). HA VMs: :func:`selected` (``virt:ha:vms``, ``virt:ha:groups``, the VM's own
``ha: True``; a tenant's VM by its group only with ``virt:ha:tenant_groups``, by its flag only with
``virt:ha:tenant_flag``). ``virt:ha:fence: manual``: the round only alerts.

Never twice: one round at a time fleet-wide (the round lock :data:`ROUND_LOCK`, a
:mod:`saltvirt.fleet.fleetstate` lock of kind ``virt.ha``: another master's round does nothing); a round that
finds a recovery at work (:func:`in_progress`: a ``virt.recover`` lock, or a VM a recovery left ``recovering``)
does nothing; a host handled stays handled until it answers again, and a host that comes back has nothing started
(``back``: its stale copies are for ``salt-run virt.reconcile``). A lost host's resources are unregistered from
Salt's registry (:mod:`saltvirt.fleet.resourcereg`; registered again when it answers). The per-host state is bank
:data:`BANK` entry :data:`STATE`; every decision goes into the log (:func:`history`, ``salt-run virt.ha_log``) and
is fired as ``salt/virt/ha/<decision>`` (explained: host, reason, VMs; progress only, never a source of decisions).
"""

import fnmatch
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from salt.exceptions import SaltException, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import master_virt, section
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import (
    engineloop,
    fleetstate,
    placement,
    publish,
    recovery,
    recovery_guard,
    resourcereg,
    runprogress,
)
from saltvirt.model import checks

log = logging.getLogger(__name__)

BANK = "salt-virt/ha"
STATE = "hosts"  # {"hosts": {host: {lost_since, last, handled, retry_at}}}
JOURNAL = fleetstate.Journal(BANK)  # the decisions: salt-run virt.ha_log
ROUND_LOCK = "virt.ha:round"  # a lock name no VM or minion id has (':')
TAG = "salt/virt/ha/"  # + the decision
FENCES = ("command", "manual")
DEFAULTS: Data = {
    "enabled": False,
    "vms": [],
    "groups": [],
    "tenant_groups": False,
    "tenant_flag": False,
    "fence": "command",
    "lost_after": 60,
    "down_after": 10,
}
DISABLED = "automatic HA is off: set virt:ha:enabled: True in the master config (salt-run virt.recover HOST by hand)"
DEFAULT_INTERVAL = 10.0
# the decisions (log records and event tags)
ONE_SIGNAL, LOST, BACK = "one_signal", "lost", "back"
ALERT, NO_HA_VMS, RECOVERED, RECOVER_FAILED, REFUSED = "alert", "no_ha_vms", "recovered", "recover_failed", "refused"


SHAPE = " ({enabled: True, groups: [...]})"  # of virt:ha, for its messages


# configuration ----------------------------------------------------------------------------------------------
def config(conf: Data) -> Data:
    """``virt:ha`` of the master's ``virt`` config ``conf``, checked (SaltInvocationError saying what to fix)."""
    raw = section(conf.get("ha"), "virt:ha", DEFAULTS, SHAPE)
    cfg = dict(DEFAULTS, **raw)
    cfg["enabled"] = validate.to_bool(cfg["enabled"])
    cfg["tenant_groups"] = validate.to_bool(cfg["tenant_groups"])
    cfg["tenant_flag"] = tenant_flag(conf)
    cfg["vms"] = list(validate.config_names(cfg["vms"] or [], "virt:ha:vms", "master config"))
    cfg["groups"] = list(validate.config_names(cfg["groups"] or [], "virt:ha:groups", "master config"))
    if cfg["fence"] not in FENCES:
        raise SaltInvocationError(f"virt:ha:fence must be one of {', '.join(FENCES)}, not {cfg['fence']!r}")
    cfg["lost_after"] = validate.seconds(cfg["lost_after"], "virt:ha:lost_after")
    cfg["down_after"] = validate.seconds(cfg["down_after"], "virt:ha:down_after")
    if cfg["enabled"] and cfg["fence"] == "command" and not recovery.fence_config(conf)["command"]:
        raise SaltInvocationError(
            "virt:ha:fence: command needs virt:fence:command (the command that powers a host off); without a power "
            "switch set virt:ha:fence: manual (HA then only alerts)"
        )
    return cfg


def tenant_flag(conf: Data) -> bool:
    """``virt:ha:tenant_flag`` of the master's ``virt`` config ``conf``: whether a tenant's ``ha=True`` counts (and
    ``salt-run virt.init``/``virt.update`` take it from a tenant). Read alone: a tenant's call does not depend on the
    rest of ``virt:ha`` being complete."""
    raw = section(conf.get("ha"), "virt:ha", None, SHAPE)
    return validate.to_bool(raw.get("tenant_flag", DEFAULTS["tenant_flag"]))


def flag_ignored(conf: Data, tenant: str | None, name: str, value: Any) -> str | None:
    """What an operator is told when it flags tenant ``tenant``'s VM ``name`` HA (``ha=value``) while a tenant's
    flag does not count (``virt:ha:tenant_flag`` off), or None: HA judges a flag by the VM's owner, not by who set
    it."""
    if not tenant or value is None or not checks.flag(value, "ha") or tenant_flag(conf):
        return None
    return (
        f"ha=True on tenant {tenant}'s VM {name} is recorded, but automatic HA counts a tenant's VM's flag only with "
        f"virt:ha:tenant_flag: True in the master config; to make {name} HA alone, name it in virt:ha:vms"
    )


def _tenants(vm: Data) -> bool:
    """Whether a recorded VM may be a tenant's: its owner names a tenant, or the record has no ``owner`` (an older
    salt-virt recorded it). The operator's VMs: no owner in <metadata>, or one without a tenant."""
    return "owner" not in vm or bool((vm["owner"] or {}).get("tenant"))


def selected(rec: Data, cfg: Data) -> dict[str, str]:
    """The HA VMs of host record ``rec``: ``{name: why it is HA}``. A VM named in ``virt:ha:vms`` (names or
    fnmatch patterns: the operator's list) is; so is one whose group is in ``virt:ha:groups`` or whose record says
    ``ha: True`` (``virt.init``/``virt.update ha=True``), if it is the operator's, or a tenant's with
    ``virt:ha:tenant_groups`` (the group) or ``virt:ha:tenant_flag`` (the flag): a tenant chooses its VMs' groups
    and flags, and their restarts take capacity on other hypervisors (:func:`_tenants`)."""
    out = {}
    for name, vm in sorted((rec.get("vms") or {}).items()):
        listed = next((p for p in cfg["vms"] if fnmatch.fnmatchcase(name, p)), None)
        if listed:
            out[name] = f"virt:ha:vms lists {listed}"
            continue
        tenants = _tenants(vm)
        if vm.get("ha") is True and (not tenants or cfg["tenant_flag"]):
            out[name] = "its record says ha: True"
            continue
        group = vm.get("group")
        if group and group in cfg["groups"] and (not tenants or cfg["tenant_groups"]):
            out[name] = f"its group {group} is in virt:ha:groups"
    return out


# the two signals, and what is at work --------------------------------------------------------------------------
def connected(opts: SaltOpts, ids: Iterable[str]) -> set[str] | None:
    """Which of ``ids`` hold a connection to this master's publish port (Salt's ``CkMinions.connected_ids``: the
    minion data cache's addresses of each authenticated minion id). None: the master cannot tell
    (``minion_data_cache: False``), which counts as connected: no host is lost on one signal."""
    if not opts.get("minion_data_cache", True):
        return None
    import salt.utils.minions  # noqa: PLC0415 - the master's transport view, only where a round reads it

    return set(salt.utils.minions.CkMinions(opts).connected_ids(subset=list(ids)))


def in_progress(store: fleetstate.Store, now: float) -> str | None:
    """Why no HA round may act now (a recovery is at work: a live ``virt.recover`` lock, or a VM left
    ``recovering`` by a run that may still be starting it), or None."""
    for name, rec in sorted(store.entries(fleetstate.LOCKS).items()):
        if (rec or {}).get("kind") == "virt.recover" and (rec.get("expires") or 0) > now:
            return f"a recovery holds {name} ({fleetstate.who(rec)}): this round does nothing"
    for name, rec in sorted(store.entries(recovery_guard.VMS).items()):
        if (rec or {}).get("state") == "recovering":
            return (
                f"a recovery of {name} from {rec.get('from')} to {rec.get('to')} did not settle (master "
                f"{rec.get('master')}): it may be starting there. Check {rec.get('to')}, then salt-run virt.recover "
                f"{rec.get('from')} force=True settles it; until then HA does nothing"
            )
    return None


# the decision (pure) -----------------------------------------------------------------------------------------
def _ts(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else "?"


def decide(hosts: dict[str, Data], linked: set[str] | None, state: dict[str, Data], now: float, cfg: Data) -> Data:
    """One round's decisions from ``hosts`` (:meth:`saltvirt.fleet.publish.Fleet.gather`), ``linked``
    (:func:`connected`) and the per-host ``state`` the last round left: ``{state, decisions, act}``, ``act`` the
    hosts lost for ``lost_after`` seconds and not handled yet (their decisions come from acting on them)."""
    new: dict[str, Data] = {}
    decisions: list[Data] = []
    act: list[str] = []

    def record(host: str, decision: str, reason: str) -> None:
        decisions.append({"at": now, "host": host, "decision": decision, "reason": reason})

    for host in sorted(hosts):
        ans, old = hosts[host], state.get(host) or {}
        signed_down = ans.get("status") == "down"
        linked_now = linked is None or host in linked
        if ans.get("status") == "up" and linked_now:
            if old.get("handled"):
                record(
                    host,
                    BACK,
                    f"{host} answers again; HA starts nothing on it. Its VMs restarted elsewhere still have their old "
                    f"definitions there: run salt-run virt.reconcile {host} before it runs VMs again",
                )
            elif old.get("lost_since"):
                record(host, BACK, f"{host} answers again (lost since {_ts(old['lost_since'])}): nothing was done")
            continue
        keep: Data = {k: old[k] for k in ("handled", "retry_at") if k in old}
        if signed_down and not linked_now:
            since = old.get("lost_since") or now
            new[host] = dict(keep, lost_since=since, last=LOST)
            if old.get("handled"):
                continue
            if not old.get("lost_since"):
                record(
                    host,
                    LOST,
                    f"{host}: no signed answer and no connection to the master: lost; HA acts at "
                    f"{_ts(since + cfg['lost_after'])} (virt:ha:lost_after {cfg['lost_after']:g} s) unless it is seen",
                )
            if now - since >= cfg["lost_after"] and now >= (old.get("retry_at") or 0):
                act.append(host)
            continue
        if signed_down:
            why = "no signed answer, but " + (
                "its connection to the master is still up"
                if linked is not None
                else "this master keeps no minion data cache (minion_data_cache: False): it cannot tell connections"
            )
        else:
            why = f"it answers ({ans.get('status')}: {ans.get('error') or 'signed'})"
            if not linked_now:
                why += ", but the master sees no connection from it"
        new[host] = dict(keep, last=ONE_SIGNAL)  # both signals are needed, in every round: the count starts anew
        if old.get("last") != ONE_SIGNAL:
            record(host, ONE_SIGNAL, f"{host}: {why}: not lost (HA needs both signals)")
    return {"state": new, "decisions": decisions, "act": act}


# acting on a lost host ------------------------------------------------------------------------------------------
def _act(
    remote: publish.Fleet,
    store: fleetstate.Store,
    host: str,
    hosts: dict[str, Data],
    cfg: Data,
    conf: Data,
    now: float,
) -> Data:
    """Fence ``host`` and restart its HA VMs (or only alert): ``{record, handled}``. ``hosts``: the round's answers,
    which the recovery plans from (asking again would wait on the lost host once more)."""
    base = {"at": now, "host": host}
    try:
        rec = recovery.recall(remote.opts, host, store)
    except SaltException as exc:
        return {"record": dict(base, decision=REFUSED, reason=f"{host} is lost: {exc}"), "handled": False}
    if not rec:
        why = f"{host} is lost, but the master has no record of its VMs (schedule salt-run virt.record)"
        return {"record": dict(base, decision=REFUSED, reason=why), "handled": False}
    ha_vms = selected(rec, cfg)
    if not ha_vms:
        why = (
            f"{host} is lost; none of its VMs ({', '.join(sorted(rec.get('vms') or {})) or 'none'}) is HA: nothing done"
        )
        return {"record": dict(base, decision=NO_HA_VMS, reason=why, vms={}), "handled": True}
    if cfg["fence"] == "manual":
        why = (
            f"{host} is lost; virt:ha:fence is manual: nothing fenced, nothing restarted. Make sure {host} is off, "
            f"then salt-run virt.recover {host} restarts its VMs (HA ones: {', '.join(sorted(ha_vms))})"
        )
        return {"record": dict(base, decision=ALERT, reason=why, vms=ha_vms), "handled": True}
    pol = placement.make_policy(conf.get("placement"))
    try:
        out = recovery.recover(remote, host, conf, pol, store, only=sorted(ha_vms), hosts=hosts)
    except SaltException as exc:
        why = f"{host} is lost; recovering it was refused: {exc}"
        return {"record": dict(base, decision=REFUSED, reason=why, vms=ha_vms), "handled": False}
    done = {n: r["host"] for n, r in out.get("recovered", {}).items()}
    failed = {n: f.get("error") for n, f in out.get("failed", {}).items()}
    parts = [f"{n} on {h}" for n, h in sorted(done.items())] or ["nothing restarted"]
    parts += [f"{n} failed: {e}" for n, e in sorted(failed.items())]
    left = {**out.get("not_recoverable", {}), **out.get("elsewhere", {})}
    parts += [f"{n}: {w}" for n, w in sorted(left.items()) if n in ha_vms]
    fenced = out.get("fenced") or {}
    why = f"{host} is lost; fenced ({' '.join(fenced.get('command') or []) or 'not needed'}): " + "; ".join(parts)
    rec_out = dict(base, decision=RECOVER_FAILED if failed else RECOVERED, reason=why, vms=ha_vms, recovered=done)
    rec_out["not_ha"] = out.get("not_selected", [])
    return {"record": rec_out, "handled": True}


# a round ------------------------------------------------------------------------------------------------------
def run_round(
    opts: SaltOpts,
    client: Any = None,
    remote: Any = None,
    now: float | None = None,
    fire: Callable[[str, Data], Any] | None = None,
) -> Data:
    """One HA round (see the module doc) with the master's ``opts``. ``remote``: how the hypervisors are reached
    (None: :class:`saltvirt.fleet.publish.Fleet` over ``client``); ``now``: the round's time; ``fire(tag, data)``:
    how each decision is announced (None: the master's bus). The answer: ``enabled``, ``ran``, and ``reason``
    (did not run) or ``decisions``."""
    conf = master_virt(opts)[0]
    cfg = config(conf)
    if not cfg["enabled"]:
        return {"enabled": False, "ran": False, "reason": DISABLED}
    store = fleetstate.Store(opts)
    if remote is None:
        remote = publish.Fleet.of_master(opts, client)
    try:
        lease = fleetstate.Lease(store, opts, "virt.ha", [ROUND_LOCK]).acquire()
    except fleetstate.HeldError as exc:
        return {"enabled": True, "ran": False, "reason": f"another HA round is at work: {exc}"}
    try:
        out = _round(opts, remote, store, lease, cfg, conf, time.time() if now is None else now)
    finally:
        unreleased = lease.release()
    if unreleased:
        out.setdefault("warnings", []).append(unreleased)
    for decision in out.get("decisions") or []:
        (fire or (lambda tag, data: runprogress.fire(opts, tag, data, logging.WARNING)))(
            TAG + decision["decision"], decision
        )
    return out


def _round(opts, remote, store, lease, cfg, conf, now):
    busy = in_progress(store, now)
    if busy:
        return {"enabled": True, "ran": False, "reason": busy}
    # a round's own wait for a silent host (shorter than the runner's: silence alone decides nothing here)
    remote = remote.with_cfg(dict(remote.cfg, down_after=min(cfg["down_after"], remote.cfg["down_after"])))
    hosts = remote.gather("virt.full_info")
    result = decide(hosts, connected(opts, hosts), (store.fetch(BANK, STATE) or {}).get("hosts") or {}, now, cfg)
    state, decisions = result["state"], list(result["decisions"])
    for host in sorted(h for h, st in state.items() if st.get("last") == LOST):  # its VMs drop out of T@ targets
        resourcereg.drop(opts, host, "automatic HA: no signed answer and no connection to the master")
    for host in result["act"]:
        lease.check()  # the round lock still ours (its store answered): else another master's round may act
        acted = _act(remote, store, host, hosts, cfg, conf, now)
        decisions.append(acted["record"])
        if acted["handled"]:
            state[host] = dict(state[host], handled=now)
        else:  # refused (probes, fencing, a record missing): tried again after lost_after, not every round
            state[host] = dict(state[host], retry_at=now + cfg["lost_after"])
    store.transact(BANK, STATE, lambda _old: {"hosts": state})
    JOURNAL.append(store, decisions)
    return {"enabled": True, "ran": True, "decisions": decisions}


def serve(
    opts: SaltOpts,
    interval: Any = DEFAULT_INTERVAL,
    stop: threading.Event | None = None,
    client_factory: Callable[[], Any] | None = None,
    reload: Callable[[SaltOpts], SaltOpts] | None = None,
) -> None:
    """Run :func:`run_round` every ``interval`` seconds until ``stop`` is set (the master engine ``virt_ha``; the
    loop: :func:`saltvirt.fleet.engineloop.serve`)."""
    engineloop.serve("virt_ha", opts, run_round, _report, interval, stop, client_factory, reload)


def _report(answer):
    for decision in answer.get("decisions") or []:
        log.warning("virt_ha: %s: %s", decision["decision"], decision["reason"])
    if not answer.get("ran"):
        log.info("virt_ha: %s", answer.get("reason"))
