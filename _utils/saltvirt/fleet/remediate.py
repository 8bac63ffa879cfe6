"""Remediation (issue 38, opt-in per kind: ``virt:remediate:<kind>:enabled``): what the master does when an event
says a VM or a hypervisor needs help. The shipped reactor (``salt-virt.remediate.sls``) runs ``salt-run
virt.remediate kind=... host=... name=...`` (:func:`remediate`) for these events; user guide:
docs/topics/remediation.md.

* ``crashed`` (the engine's ``crashed``/``panicked``): restart the VM where it is, after a backoff that doubles with
  each restart in ``window`` (``backoff``, 2x, 4x ... up to ``backoff_max``); after ``max_restarts`` restarts in
  ``window`` move it (``move: True``: an offline migration to the host placement ranks best,
  :func:`saltvirt.fleet.relocate.move_off` with its per-VM lock, then a start there; once per ``window``) or stop
  and alert. A VM held crashed after a panic (``on_crash=preserve``: its operator keeps it for inspection) is only
  alerted. A restart happens under the VM's own lock (the one ``virt.init``, migrate and recover take) and after
  ``virt.recover``'s last look (:func:`saltvirt.fleet.recovery_guard.last_look`): a copy defined on any other
  hypervisor (recovered or migrated there), or one that does not answer, leaves it stopped and alerts;
* ``io_error`` (``io_error``): libvirt's default ``error_policy`` pauses a VM whose disk failed; this keeps it paused
  (never resumes it) and alerts, saying whether the host reports the disk full (ENOSPC);
* ``agent`` (``agent_disconnected``/``agent_connected``): a running VM whose guest agent stays disconnected for
  ``silent_after`` seconds is reset (``virt.reset``), at most ``max_resets`` times in ``window``; a master schedule
  of ``salt-run virt.remediate kind=agent`` (no host) looks again at the VMs it watches;
* ``beacon`` (a hypervisor's ``memusage``/``diskusage`` beacon): one continuous-balancing round
  (:func:`saltvirt.fleet.balancer.run_round`, with ``virt:balance``'s own switches), at most one per
  ``min_interval``.

Trust: Salt's event bus is not authenticated (any minion can send any tag and data in any hypervisor's name), so an
event is only a hint naming a host and a VM. Nothing is decided from its data: the host must be one of
``virt:hypervisors``; the VM's condition (state, libvirt's reason for it, the guest agent's channel, disk errors) is
asked of that host in a job only it answers, signed with its key (``virt.vm_condition``, :func:`ask`); a UUID in
the hint must be the VM's there; the action is taken only when that answer calls for it. A beacon's numbers are
never read: the balancing round decides from the hypervisors' signed facts. A hint refused (forged, not a
hypervisor, a VM not there) changes nothing and is not logged in the shared log (a tenant could otherwise push the
real entries out of it): the master's log and the runner's answer say why.

Every action and alert goes into the bounded log (bank :data:`BANK` entry ``log``, ``salt-run
virt.remediate_log``) and is fired as ``salt/virt/remediate/<kind>`` (explained: decision, reason). The restarts and
moves per VM UUID (:data:`CRASHES`), the agents watched (:data:`AGENTS`), the alerts given (:data:`ALERTS`) and the
last beacon round (:data:`BEACON`) are in the shared store every master uses.
"""

import logging
import time
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import master_virt, section
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import (
    balancer,
    fleetstate,
    hypervisors,
    placement,
    publish,
    recovery_guard,
    relocate,
    runprogress,
)

log = logging.getLogger(__name__)

BANK = "salt-virt/remediate"
CRASHES, AGENTS, ALERTS, BEACON = "crashes", "agents", "alerts", "beacon"
JOURNAL = fleetstate.Journal(BANK)  # every action and alert: salt-run virt.remediate_log
TAG = "salt/virt/remediate/"  # + the kind
KINDS = ("crashed", "io_error", "agent", "beacon")
DEFAULTS: dict[str, Data] = {
    "crashed": {"enabled": False, "backoff": 30, "backoff_max": 600, "max_restarts": 3, "window": 3600, "move": False},
    "io_error": {"enabled": False, "repeat_after": 3600},
    "agent": {"enabled": False, "silent_after": 300, "max_resets": 3, "window": 3600},
    "beacon": {"enabled": False, "min_interval": 300},
}
_SECONDS = ("backoff", "backoff_max", "window", "repeat_after", "silent_after", "min_interval")
_COUNTS = ("max_restarts", "max_resets")
# the decisions (log records, answers)
RESTARTED, RESTART_FAILED, MOVED, MOVE_FAILED = "restarted", "restart_failed", "moved", "move_failed"
GAVE_UP, KEPT_PAUSED, BALANCED = "gave_up", "kept_paused", "balanced"
SILENT, RESET, RESET_FAILED, AGENT_BACK = "agent_silent", "reset", "reset_failed", "agent_back"
NOTHING, REFUSED, OFF, BUSY = "nothing", "refused", "off", "busy"  # answers only, never logged
CRASH_REASONS = ("crashed", "failed")  # shutoff because the guest crashed (on_crash=destroy) or QEMU died


class Refused(SaltInvocationError):  # noqa: N818 - named for what happened, as publish.Failed
    """A hint that does not hold: the host is no hypervisor, did not confirm, or has no such VM."""


# configuration ----------------------------------------------------------------------------------------------
def config(conf: Data) -> dict[str, Data]:
    """``virt:remediate`` of the master's ``virt`` config ``conf``, checked (SaltInvocationError saying what to fix):
    ``{kind: settings}`` for every kind of :data:`KINDS`, each off unless ``enabled: True``."""
    raw = section(conf.get("remediate"), "virt:remediate", None, " ({crashed: {enabled: True}})")
    unknown = sorted(set(raw) - set(KINDS))
    if unknown:
        raise SaltInvocationError(f"virt:remediate: unknown kind(s) {', '.join(unknown)} (known: {', '.join(KINDS)})")
    return {kind: _kind_config(kind, raw.get(kind)) for kind in KINDS}


def _kind_config(kind: str, raw: Any) -> Data:
    where = f"virt:remediate:{kind}"
    raw = section(raw, where, DEFAULTS[kind], " ({enabled: True, ...})")
    cfg = dict(DEFAULTS[kind], **raw)
    for key, value in cfg.items():
        if key in ("enabled", "move"):
            cfg[key] = validate.to_bool(value)
        elif key in _SECONDS:
            cfg[key] = validate.seconds(value, f"{where}:{key}")
        elif key in _COUNTS:
            cfg[key] = validate.positive_int(value, f"{where}:{key}")
    return cfg


# how the hypervisors are asked --------------------------------------------------------------------------------
def ask(fleet: publish.Fleet, host: str, fun: str, *args: Any) -> Data:
    """``host``'s answer to ``fun(*args)`` in a job only it answers, believed only signed with its key:
    ``{status: up|error|down|timeout, ret|error}``."""
    return fleet.call(host, fun, list(args))[0]


def confirm(fleet: publish.Fleet, host: str, name: str, uuid: str | None = None) -> Data:
    """VM ``name``'s condition on ``host`` from its signed ``virt.vm_condition``; :class:`Refused` when the host does
    not answer so, has no such VM, or has it under another UUID than the hint's ``uuid``."""
    answer = ask(fleet, host, "virt.vm_condition", name)
    cond = answer.get("ret")
    if answer.get("status") != "up" or not isinstance(cond, dict):
        why = answer.get("error") or answer.get("status")
        raise Refused(f"{host} did not confirm VM {name}'s condition ({why}): nothing done")
    if uuid and str(uuid).lower() != str(cond.get("uuid")).lower():
        raise Refused(f"VM {name} on {host} has UUID {cond.get('uuid')}, not the event's {uuid}: nothing done")
    return cond


def crashed(cond: Data) -> bool:
    """Whether the host's answer says the VM crashed: shut off because the guest crashed or QEMU died."""
    return cond.get("state") == "shutoff" and cond.get("reason") in CRASH_REASONS


# one remediation ----------------------------------------------------------------------------------------------
class Run:
    """One ``virt.remediate``: the master's ``opts``, the kind's settings, the store, the clock and announcements."""

    def __init__(self, opts, kind, kcfg, fleet, now, fire, sleep):
        self.opts, self.kind, self.kcfg, self.fleet = opts, kind, kcfg, fleet
        self.store = fleetstate.Store(opts)
        self._now, self.fire, self.sleep = now, fire, sleep

    def now(self) -> float:
        return time.time() if self._now is None else self._now

    def done(self, decision: str, host: str | None, name: str | None, reason: str, **more: Any) -> Data:
        """A decision made on confirmed facts: logged, fired, and the answer."""
        rec = {"at": self.now(), "kind": self.kind, "host": host, "name": name, "decision": decision, "reason": reason}
        rec.update(more)
        JOURNAL.append(self.store, [rec])
        level = logging.WARNING if decision in (KEPT_PAUSED, GAVE_UP, MOVE_FAILED, RESTART_FAILED) else logging.INFO
        log.log(level, "virt.remediate %s: %s: %s", self.kind, decision, reason)
        self.fire(TAG + self.kind, rec)
        return dict(rec, acted=decision not in (NOTHING, SILENT, AGENT_BACK))


def remediate(
    opts: SaltOpts,
    kind: str,
    host: str | None = None,
    name: str | None = None,
    uuid: str | None = None,
    client: Any = None,
    now: float | None = None,
    fire: Callable[[str, Data], Any] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
) -> Data:
    """``salt-run virt.remediate``: see the module doc. ``host``/``name``/``uuid`` are the event's hints; ``client``:
    the LocalClient (None: the master's); ``now``: the time (tests); ``fire(tag, data)``: how a decision is
    announced (None: the master's bus); ``sleep``: how a crash's backoff waits. The answer: ``kind``, ``host``,
    ``name``, ``acted``, ``decision`` and ``reason``; :class:`Refused` for a hint that does not hold."""
    if kind not in KINDS:
        raise SaltInvocationError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    kcfg = config(master_virt(opts)[0])[kind]
    if not kcfg["enabled"]:
        why = f"remediation of {kind} is off: set virt:remediate:{kind}:enabled: True in the master config"
        return {"kind": kind, "host": host, "name": name, "acted": False, "decision": OFF, "reason": why}
    announce = fire or (lambda tag, data: runprogress.fire(opts, tag, data, logging.WARNING))
    run = Run(opts, kind, kcfg, publish.Fleet.of_master(opts, client), now, announce, sleep)
    if kind == "agent" and host is None and name is None:
        return sweep_agents(run)
    if not host:
        raise SaltInvocationError(f"virt.remediate kind={kind} needs host= (the hypervisor the event names)")
    try:
        hypervisors.require(opts, host, f"remediation ({kind})")
    except SaltInvocationError as exc:
        log.warning("virt.remediate %s: refused: %s", kind, exc)
        raise Refused(str(exc)) from None
    if kind == "beacon":
        return beacon(run, host)
    name = validate.vm_name(name, "name (the VM the event names)")
    try:  # one remediation of a VM at a time, fleet-wide: a flood of one event waits for nothing
        lease = fleetstate.Lease(run.store, opts, "virt.remediate", [f"virt.remediate:{name}"]).acquire()
    except fleetstate.HeldError as exc:
        return _quiet(run, host, name, str(exc), BUSY)
    try:
        act = {"crashed": restart, "io_error": io_error, "agent": agent}[kind]
        return act(run, host, name, uuid)
    except Refused as exc:  # a forged or stale hint: said here, not in the shared log
        log.warning("virt.remediate %s: refused: %s", kind, exc)
        raise
    finally:
        lease.release()


# crashed: restart with backoff, then move ---------------------------------------------------------------------
def _recent(entries: list[float] | None, now: float, window: float) -> list[float]:
    return [t for t in entries or [] if now - t < window]


def restart(run: Run, host: str, name: str, uuid: str | None) -> Data:
    """A crashed VM: restarted on ``host`` after its backoff, moved or given up after ``max_restarts``."""
    cond = confirm(run.fleet, host, name, uuid)
    if cond.get("state") == "crashed":  # on_crash=preserve: its operator keeps a panicked guest for inspection
        why = (
            f"{name} on {host} is held crashed after a panic (on_crash=preserve): left for inspection; salt {host} "
            f"virt.stop {name}, then virt.start, restarts it"
        )
        return run.done(GAVE_UP, host, name, why, uuid=cond.get("uuid"))
    if not crashed(cond):
        why = f"{host} reports {name} {cond.get('state')} ({cond.get('reason')}), not crashed: nothing to restart"
        return _quiet(run, host, name, why)
    vid, cfg = cond["uuid"], run.kcfg
    entry = run.store.fetch(BANK + "/" + CRASHES, vid) or {}
    restarts = _recent(entry.get("restarts"), run.now(), cfg["window"])
    if len(restarts) >= cfg["max_restarts"]:
        return move_or_give_up(run, host, name, vid, entry, len(restarts))
    delay = min(cfg["backoff"] * 2 ** len(restarts), cfg["backoff_max"])
    run.sleep(delay)
    try:  # the VM's own lock (virt.init, migrate, recover take it): nothing else starts or moves it meanwhile
        with fleetstate.lock(run.opts, [name], kind="virt.remediate", store=run.store):
            cond = confirm(run.fleet, host, name, vid)  # after the wait: someone may have started or moved it
            if not crashed(cond):
                why = f"{name} is {cond.get('state')} ({cond.get('reason')}) on {host} after the backoff: not restarted"
                return _quiet(run, host, name, why)
            # never a second copy: a VM recovered or migrated elsewhere leaves this stale one behind
            recovery_guard.last_look(run.fleet, name, vid, host, in_place=True)
            answer = ask(run.fleet, host, "virt.start", name)
    except fleetstate.HeldError as exc:
        return _quiet(run, host, name, str(exc), BUSY)
    except publish.Failed as exc:
        return run.done(GAVE_UP, host, name, f"{exc}: left stopped on {host}", uuid=vid)
    restarts.append(run.now())
    run.store.transact(BANK + "/" + CRASHES, vid, lambda old: dict(old or {}, restarts=restarts, name=name, host=host))
    nth = f"restart {len(restarts)} of {cfg['max_restarts']} in {cfg['window']:g} s"
    if answer.get("status") != "up":
        why = f"{name} crashed on {host} ({cond['reason']}); starting it failed: {answer.get('error')} ({nth})"
        return run.done(RESTART_FAILED, host, name, why, uuid=vid)
    why = f"{name} crashed on {host} ({cond['reason']}): started again after {delay:g} s ({nth})"
    return run.done(RESTARTED, host, name, why, uuid=vid, delay=delay)


def move_or_give_up(run: Run, host: str, name: str, vid: str, entry: Data, count: int) -> Data:
    """The restarts are spent: move the VM (``move: True``, once per ``window``) or leave it stopped and alert."""
    cfg = run.kcfg
    spent = f"{name} crashed on {host} {count + 1} times within {cfg['window']:g} s (max_restarts: {count})"
    if not cfg["move"]:
        why = f"{spent}: left stopped (virt:remediate:crashed:move is off); look at it, then salt-run virt.start"
        return run.done(GAVE_UP, host, name, why, uuid=vid)
    if _recent(entry.get("moved"), run.now(), cfg["window"]):
        why = f"{spent}, and it was moved within {cfg['window']:g} s already: left stopped; look at it"
        return run.done(GAVE_UP, host, name, why, uuid=vid)
    conf = master_virt(run.opts)[0]
    remote = run.fleet
    tunnel, timeout = relocate.settings(conf)
    pol = placement.make_policy(conf.get("placement"))
    out = relocate.move_off(remote, remote.gather("virt.full_info"), [(host, name)], pol, live=False, tunnel=tunnel,
                            timeout=timeout)  # fmt: skip
    moved = (out.get("moved") or {}).get(name)
    if not moved:
        why = f"{spent}: moving it failed, it stays stopped on {host}: {(out.get('failed') or {}).get(name)}"
        return run.done(MOVE_FAILED, host, name, why, uuid=vid)
    target = moved["target"]
    moves = [*_recent(entry.get("moved"), run.now(), cfg["window"]), run.now()]
    run.store.transact(
        BANK + "/" + CRASHES, vid, lambda _old: {"name": name, "host": target, "restarts": [], "moved": moves}
    )
    answer = ask(run.fleet, target, "virt.start", name)
    started = "started there" if answer.get("status") == "up" else f"starting it there failed: {answer.get('error')}"
    why = f"{spent}: moved to {target} (placement's choice), {started}"
    return run.done(MOVED if answer.get("status") == "up" else MOVE_FAILED, host, name, why, uuid=vid, to=target)


# io_error: kept paused, alerted ---------------------------------------------------------------------------------
def io_error(run: Run, host: str, name: str, uuid: str | None) -> Data:
    """A VM paused by a disk error stays paused (never resumed here) and is alerted, once per ``repeat_after``."""
    cond = confirm(run.fleet, host, name, uuid)
    if (cond.get("state"), cond.get("reason")) != ("paused", "ioerror"):
        why = f"{host} reports {name} {cond.get('state')} ({cond.get('reason')}), not paused by an I/O error"
        return _quiet(run, host, name, why)
    vid, now = cond["uuid"], run.now()
    last = (run.store.fetch(BANK + "/" + ALERTS, vid) or {}).get("at") or 0
    if now - last < run.kcfg["repeat_after"]:
        return _quiet(run, host, name, f"{name} on {host} was alerted at {_ts(last)} already: not again before "
                      f"{_ts(last + run.kcfg['repeat_after'])}")  # fmt: skip
    run.store.transact(BANK + "/" + ALERTS, vid, lambda _old: {"at": now, "name": name, "host": host})
    errors = cond.get("disk_errors") or {}
    full = sorted(d for d, e in errors.items() if e == "no_space")
    what = f"its disk {', '.join(full)} is full (ENOSPC)" if full else f"a disk error ({errors or 'unspecified'})"
    why = (
        f"{name} on {host} is paused by libvirt: {what}. It stays paused (resuming would fail or lose writes): free "
        f"space, then salt {host} virt.resume {name}"
    )
    return run.done(KEPT_PAUSED, host, name, why, uuid=vid, disk_errors=errors, enospc=bool(full))


# agent: reset after a long silence ------------------------------------------------------------------------------
def agent(run: Run, host: str, name: str, uuid: str | None) -> Data:
    """A hint about VM ``name``'s guest agent: watched from its first confirmed silence, reset once silent for
    ``silent_after`` seconds (:func:`check_agent`)."""
    cond = confirm(run.fleet, host, name, uuid)
    return check_agent(run, host, name, cond)


def check_agent(run: Run, host: str, name: str, cond: Data) -> Data:
    vid, now, cfg = cond["uuid"], run.now(), run.kcfg
    bank = BANK + "/" + AGENTS
    watched = run.store.fetch(bank, vid) or {}
    if cond.get("state") != "running" or cond.get("guest_agent") != "disconnected":
        if watched.get("silent_since"):
            run.store.transact(bank, vid, lambda old: dict(old or {}, silent_since=None))
            why = f"{name}'s guest agent on {host} is {cond.get('guest_agent')} ({cond.get('state')}): not watched now"
            return run.done(AGENT_BACK, host, name, why, uuid=vid)
        why = f"{host} reports {name} {cond.get('state')}, its guest agent {cond.get('guest_agent')}: nothing to do"
        return _quiet(run, host, name, why)
    since = watched.get("silent_since")
    if not since:
        run.store.transact(bank, vid, lambda old: dict(old or {}, silent_since=now, name=name, host=host))
        why = (
            f"{name}'s guest agent on {host} is disconnected: reset at {_ts(now + cfg['silent_after'])} unless it "
            f"connects (virt:remediate:agent:silent_after {cfg['silent_after']:g} s)"
        )
        return run.done(SILENT, host, name, why, uuid=vid)
    if now - since < cfg["silent_after"]:
        return _quiet(run, host, name, f"{name}'s guest agent silent since {_ts(since)}: not long enough yet")
    resets = _recent(watched.get("resets"), now, cfg["window"])
    if len(resets) >= cfg["max_resets"]:
        why = f"{name}'s guest agent on {host} is silent again after {len(resets)} resets within {cfg['window']:g} s"
        run.store.transact(bank, vid, lambda old: dict(old or {}, silent_since=None))
        return run.done(GAVE_UP, host, name, why + ": no more resets; look at the guest", uuid=vid)
    answer = ask(run.fleet, host, "virt.reset", name)
    run.store.transact(bank, vid, lambda old: dict(old or {}, silent_since=now, resets=[*resets, now]))
    if answer.get("status") != "up":
        why = f"{name}'s guest agent on {host} silent since {_ts(since)}; the reset failed: {answer.get('error')}"
        return run.done(RESET_FAILED, host, name, why, uuid=vid)
    why = f"{name}'s guest agent on {host} silent since {_ts(since)}: reset ({len(resets) + 1} of {cfg['max_resets']})"
    return run.done(RESET, host, name, why, uuid=vid)


def sweep_agents(run: Run) -> Data:
    """``virt.remediate kind=agent`` without a host (a master schedule): every watched VM looked at again, each on
    the host the watch recorded, through the same signed check."""
    out: dict[str, Data] = {}
    for vid, watched in sorted(run.store.entries(BANK + "/" + AGENTS).items()):
        if not (watched or {}).get("silent_since"):
            continue
        host, name = watched["host"], watched["name"]
        try:
            out[name] = check_agent(run, host, name, confirm(run.fleet, host, name, vid))
        except (Refused, CommandExecutionError) as exc:
            out[name] = {"acted": False, "decision": REFUSED, "reason": str(exc)}
    return {"kind": "agent", "acted": any(a.get("acted") for a in out.values()), "vms": out}


# beacon: one balancing round ------------------------------------------------------------------------------------
def beacon(run: Run, host: str) -> Data:
    """A hypervisor's beacon: one balancing round (its decisions come from the hypervisors' signed facts, never the
    beacon's numbers), at most one per ``min_interval`` whoever sends beacons."""
    now = run.now()
    slot: Data = {}

    def take(old: Any) -> Any:
        if old and now - float(old.get("at") or 0) < run.kcfg["min_interval"]:
            slot.update(old)
            raise fleetstate.AbortUpdate
        return {"at": now, "host": host}

    try:
        run.store.transact(BANK, BEACON, take)
    except fleetstate.AbortUpdate:
        why = f"a beacon round ran at {_ts(slot.get('at'))} (for {slot.get('host')}): at most one per min_interval"
        return _quiet(run, host, None, why)
    out = balancer.run_round(run.opts, client=run.fleet.client)
    moved = sorted(out.get("moved") or {})
    if not out.get("ran"):
        why = f"{host}'s beacon: no balancing round ran: {out.get('reason')}"
    else:
        why = f"{host}'s beacon: balancing round {out.get('round')}: moved {', '.join(moved) or 'nothing'}"
    return run.done(BALANCED, host, None, why, moved=moved, failed=sorted(out.get("failed") or {}))


# the log --------------------------------------------------------------------------------------------------------
def _quiet(run: Run, host: str, name: str | None, why: str, decision: str = NOTHING) -> Data:
    """Nothing to do on confirmed facts (``decision``: :data:`NOTHING`), or not now (:data:`BUSY`: another call
    holds the VM): said in the master's log and the answer, not in the shared log."""
    log.info("virt.remediate %s: %s", run.kind, why)
    return {"kind": run.kind, "host": host, "name": name, "acted": False, "decision": decision, "reason": why}


def _ts(epoch: Any) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch))) if epoch else "?"
