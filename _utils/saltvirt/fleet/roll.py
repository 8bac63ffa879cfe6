"""Rolling hypervisor maintenance, the master side of ``salt-run virt.roll`` (issue 38). User guide:
docs/topics/maintenance.md.

Per host, ``batch`` hosts at a time (their steps one host after the other; ``batch`` is how many are out of
service at once):

1. ``maintenance``: the host joins the call's ``virt:placement:maintenance`` (the one maintenance mechanism:
   placement never chooses it) and the roll's lock ``virt.roll:<host>`` (:mod:`saltvirt.fleet.fleetstate`: two rolls
   never take one host);
2. ``evacuate``: :func:`saltvirt.fleet.relocate.evacuate`, the path of ``salt-run virt.evacuate`` (placement,
   per-VM locks, reservations, retries elsewhere only while the VM is verifiably on the host), then the master's
   record (``virt.record``) of every host again, so automatic HA never takes the emptied host, rebooting, for one
   lost with VMs;
3. ``states``: the host's own states (``virt.host_states``: ``state.apply`` there), when asked;
4. ``reboot``: when asked, after checking (signed) that no VM runs there (one that arrived meanwhile is evacuated
   again, else the roll stops): ``system.reboot`` is published, then the roll waits, bounded by ``timeout``, for a
   signed ``virt.boot_id`` that differs from the one before (the minion is back with its key, and it did boot) and
   a signed ``virt.host_ready`` that says ready: libvirtd answers, its TLS listener takes the host's own client
   certificate (when migrations use TLS), the events engine beats again, connected (when it has one); a
   hypervisor with an older salt-virt, without ``virt.host_ready``, is asked ``virt.capacity`` (libvirtd) instead;
5. ``maintenance_off``: out of the maintenance list again, lock released.

Then, with ``balance``, one :mod:`saltvirt.fleet.rebalance` round over the fleet.

Every answer believed is a hypervisor's signed answer (:mod:`saltvirt.fleet.publish`): the event bus decides
nothing (any minion can fire any tag); the reboot's own publication is fire-and-forget, its effect is judged by the
boot id. The first failure stops the roll: the host that failed stays out of service as the step left it (its
VMs already moved run where they went, nothing is stopped), the hosts after it are untouched, and the answer says
host, step and why (a state's failed ids and comments). ``test=True`` changes nothing: the evacuation's plan, the
states' dry run (Salt's ``test=True``), "would reboot", the balance's plan.
"""

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.fleet import fleetstate, publish, rebalance, recovery, relocate

log = logging.getLogger(__name__)

TAG = "salt/virt/roll/"  # + the step: progress announcements, never a source of decisions
LOCK = "virt.roll:"  # + the host: a lock name no VM or minion id has (':')
DEFAULT_TIMEOUT = 900  # seconds for one host's states, and for its reboot to answer again
HIGHSTATE = "highstate"
POLL = 2.0  # seconds between two questions to a host that answered with its boot from before the reboot

Progress = Callable[[str, str, str], None]  # (host, step, message)


class Stop(CommandExecutionError):  # noqa: N818 - reads as what it does: raise Stop(host, step, why)
    """The roll stops at ``host``'s ``step``; ``details`` say why (into the answer's ``stopped``)."""

    def __init__(self, host: str, step: str, reason: str, **details: Any):
        super().__init__(f"{host}: {step}: {reason}")
        self.host, self.step, self.reason, self.details = host, step, reason, details


def options(
    state: Any = None, reboot: Any = False, batch: Any = 1, timeout: Any = DEFAULT_TIMEOUT
) -> tuple[str | list[str] | None, bool, int, float]:
    """The call's ``(states, reboot, batch, timeout)``, checked: ``state`` is None (no states step),
    ``highstate`` (the host's top file) or SLS names (a list or ``a,b``)."""
    states: str | list[str] | None = None
    if state not in (None, "", False):
        if isinstance(state, str):
            names = [s.strip() for s in state.split(",") if s.strip()]
        elif isinstance(state, (list, tuple)) and all(isinstance(s, str) and s.strip() for s in state):
            names = [s.strip() for s in state]
        else:
            raise SaltInvocationError(f"state must be an SLS name, a list of them or {HIGHSTATE}, not {state!r}")
        states = HIGHSTATE if names == [HIGHSTATE] else names
    return (
        states,
        validate.to_bool(reboot),
        validate.positive_int(batch, "batch"),
        validate.seconds(DEFAULT_TIMEOUT if timeout is None else timeout, "timeout"),
    )


def state_outcome(answer: Any) -> Data:
    """``virt.host_states``' answer judged: ``{ok, failed: {id: comment}, changed: [ids], would_change: [ids]}``.
    Salt's state return is ``{id: {result, comment, changes}}``; a list (or a string) is a render error."""
    ret = answer.get("ret") if isinstance(answer, dict) else answer
    if not isinstance(ret, dict):
        errors = ret if isinstance(ret, list) else [str(ret)]
        return {"ok": False, "failed": {"render": "; ".join(map(str, errors))}, "changed": [], "would_change": []}
    failed, changed, would = {}, [], []
    for sid, res in ret.items():
        if not isinstance(res, dict):
            failed[str(sid)] = str(res)
            continue
        parts = str(sid).split("_|-")  # Salt's key: <module>_|-<id>_|-<name>_|-<function>
        name = str(res.get("__id__") or (parts[1] if len(parts) == 4 else sid))
        if res.get("result") is False:
            failed[name] = str(res.get("comment") or "failed")
        elif res.get("result") is None:
            would.append(name)
        elif res.get("changes"):
            changed.append(name)
    return {"ok": not failed, "failed": failed, "changed": changed, "would_change": would}


class Roll:
    """One ``virt.roll``: the steps above over ``remote`` (:class:`saltvirt.fleet.publish.Fleet`)."""

    def __init__(
        self,
        remote: publish.Fleet,
        policy: Data,
        *,
        states: str | list[str] | None = None,
        reboot: bool = False,
        test: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        migration: Data | None = None,
        progress: Progress | None = None,
    ):
        self.remote, self.policy = remote, policy
        self.states, self.reboot, self.test, self.timeout = states, reboot, test, timeout
        self.migration = migration or {}  # relocate.evacuate's tunnel, timeout, transport
        self.progress = progress
        self.maintenance: set[str] = set()

    def say(self, host: str, step: str, message: str) -> None:
        if self.progress:
            self.progress(host, step, message)

    def _policy(self) -> Data:
        """The placement policy with every host the roll has in maintenance now added."""
        return dict(self.policy, maintenance=[*self.policy["maintenance"], *sorted(self.maintenance)])

    # the steps ---------------------------------------------------------------------------------------------
    def evacuate(self, host: str) -> Data:
        ret = relocate.evacuate(self.remote, host, self._policy(), dry_run=self.test, **self.migration)
        stuck = ret.get("failed") or ret.get("cannot_place") or {}
        if stuck:
            errors = {name: str(why.get("error") or why) for name, why in stuck.items()}
            raise Stop(
                host,
                "evacuate",
                f"{len(stuck)} VM(s) could not be moved and still run there: "
                + "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())),
                vms=errors,
                moved=sorted(ret.get("moved") or {}),
            )
        if self.test:
            return {"plan": {n: p["target"] for n, p in ret["plan"].items()}}
        if ret["moved"]:
            self._record(host)
        return {"moved": {n: m["target"] for n, m in ret["moved"].items()}}

    def _record(self, host: str) -> None:
        """The master's record follows the VMs (as after ``virt.rebalance``): automatic HA reads it, and must not
        take the host that reboots empty for one lost with its old VMs (it would fence it)."""
        try:
            recorded = recovery.refresh(self.remote).get(host) or {}
        except CommandExecutionError as exc:
            recorded = {"status": str(exc)}
        if recorded.get("status") != "recorded" or recorded.get("vms"):
            why = recorded.get("status") if recorded.get("status") != "recorded" else f"VMs {recorded['vms']}"
            raise Stop(host, "evacuate", f"the master's record of it (virt.record) does not say it is empty: {why}")

    def apply_states(self, host: str) -> Data:
        mods = None if self.states == HIGHSTATE else self.states
        try:
            answer = self.remote.ret(host, "virt.host_states", mods, test=self.test, max_wait=self.timeout)
        except CommandExecutionError as exc:
            raise Stop(host, "states", f"the states could not be applied: {exc}") from None
        out = state_outcome(answer)
        if not out["ok"]:
            ids = ", ".join(sorted(out["failed"]))
            raise Stop(host, "states", f"state(s) failed: {ids}", failed=out["failed"], changed=out["changed"])
        del out["ok"], out["failed"]
        return out

    def _vms_on(self, host: str) -> list[str]:
        facts = self.remote.gather("virt.full_info").get(host) or {}
        if facts.get("status") != "up":
            raise Stop(host, "reboot", f"it did not answer before the reboot: {facts.get('error')}: not rebooted")
        return sorted(facts.get("vm_info") or {})

    def do_reboot(self, host: str) -> Data:
        if self.test:
            return {"would_reboot": True}
        if self._vms_on(host):  # placed there meanwhile by something outside this roll: moved again first
            self.evacuate(host)
            left = self._vms_on(host)
            if left:
                raise Stop(host, "reboot", f"VM(s) {', '.join(left)} are on it: not rebooted", vms=left)
        try:
            before = self.remote.ret(host, "virt.boot_id")
        except CommandExecutionError as exc:
            raise Stop(host, "reboot", f"its boot id could not be read: {exc}: not rebooted") from None
        self.remote.client.run_job([host], "system.reboot", [], tgt_type="list")
        return self._wait_back(host, before)

    def _wait_back(self, host: str, before: str) -> Data:
        """Wait, bounded by ``timeout``, for a signed new boot id and then a signed ``virt.host_ready`` (see the
        module doc)."""
        started = time.monotonic()
        deadline = started + self.timeout
        seen, booted = "no answer yet", False
        while time.monotonic() < deadline:
            left = max(deadline - time.monotonic(), 0.1)
            try:
                if not booted:
                    now = self.remote.ret(host, "virt.boot_id", max_wait=left)
                    booted = now != before
                    seen = "booted again" if booted else "still the boot before the reboot (not rebooted yet)"
                if booted:
                    waiting = self._not_ready(host, left)
                    if not waiting:
                        return {"boot_id": "new", "back_after": round(time.monotonic() - started, 3)}
                    seen = "booted again, but " + waiting
            except CommandExecutionError as exc:
                seen = ("booted again, but " if booted else "") + str(exc)
            self.say(host, "reboot", f"waiting: {seen}")
            # an answer from the old boot, or a host not ready yet, comes at once: ask again in a while
            time.sleep(min(POLL, max(deadline - time.monotonic(), 0)))
        raise Stop(host, "reboot", f"not back within timeout={self.timeout:g} s; last seen: {seen}", seen=seen)

    def _not_ready(self, host: str, left: float) -> str | None:
        """What ``host`` is still waiting for after its reboot (its signed ``virt.host_ready``), or None."""
        ans, jid = self.remote.call(host, "virt.host_ready", max_wait=left)
        if ans["status"] == "error" and ans.get("no_virt") and "virt.host_ready" in str(ans.get("error")):
            self.remote.ret(host, "virt.capacity", max_wait=left)  # an older salt-virt: libvirtd answers
            return None
        if ans["status"] != "up":
            raise publish.Failed(f"virt.host_ready on {host}: {ans.get('error') or ans['status']}", jid=jid)
        ready = ans["ret"]
        parts = [
            f"{part}: {ready[part]['why']}" for part in ("libvirtd", "tls", "engine") if ready[part]["ok"] is False
        ]
        return None if ready.get("ready") and not parts else "; ".join(parts) or "not ready"

    # one host, one batch -----------------------------------------------------------------------------------
    def host(self, host: str, record: Data) -> None:
        """The steps between maintenance on and off; each done step goes into ``record['steps']``."""
        steps: list[tuple[str, Callable[[str], Data]]] = [("evacuate", self.evacuate)]
        if self.states:
            steps.append(("states", self.apply_states))
        if self.reboot:
            steps.append(("reboot", self.do_reboot))
        for step, run in steps:
            self.say(host, step, f"{host}: {step}")
            started = time.monotonic()
            try:
                done = run(host)
            except Stop:
                raise
            except (CommandExecutionError, SaltInvocationError) as exc:  # e.g. the host stopped answering
                raise Stop(host, step, str(exc), **getattr(exc, "details", {})) from None
            record["steps"].append({"step": step, "seconds": round(time.monotonic() - started, 3), **done})

    def batch(self, hosts: list[str], records: dict[str, Data]) -> None:
        """``hosts`` in maintenance together, their steps one host after the other, then out again. On a
        :class:`Stop` only the host that failed stays in maintenance."""
        for host in hosts:
            self.maintenance.add(host)
            records[host] = {"status": "in maintenance", "steps": [{"step": "maintenance", "seconds": 0.0}]}
            self.say(host, "maintenance", f"{host}: maintenance on")
        failed = None
        try:
            for host in hosts:
                started = time.monotonic()
                try:
                    self.host(host, records[host])
                except Stop:
                    failed = host
                    records[host]["status"] = "stopped (left in maintenance)"
                    raise
                finally:
                    records[host]["seconds"] = round(time.monotonic() - started, 3)
                records[host]["status"] = "done"
        finally:
            for host in hosts:
                if host != failed:
                    self.maintenance.discard(host)
                    records[host]["steps"].append({"step": "maintenance_off", "seconds": 0.0})
                    self.say(host, "maintenance_off", f"{host}: maintenance off")
                    if records[host]["status"] != "done":
                        records[host]["status"] = "not started (the batch stopped)"


def running(facts: dict[str, Data]) -> dict[str, list[str]]:
    """``{uuid or name: [hosts where it runs]}`` of every running VM in ``facts`` (``virt.full_info`` answers)."""
    out: dict[str, list[str]] = {}
    for host, answer in sorted(facts.items()):
        for name, vm in (answer.get("vm_info") or {}).items():
            if vm.get("state") == "running":
                out.setdefault(str(vm.get("uuid") or name), []).append(host)
    return out


def _start(remote: publish.Fleet, hosts: list[str], batch: int) -> dict[str, Data]:
    """The fleet's signed facts, after the refusals that come before anything is done."""
    if not hosts:
        raise SaltInvocationError("no hypervisor matches the target: nothing to roll")
    facts = remote.gather("virt.full_info")
    unknown = [h for h in hosts if h not in facts]
    if unknown:
        raise SaltInvocationError(f"not hypervisors (virt:hypervisors): {', '.join(unknown)}: nothing rolled")
    down = [f"{h} ({facts[h]['status']}: {facts[h].get('error')})" for h in hosts if facts[h]["status"] != "up"]
    if down:
        raise publish.Failed(f"a roll starts with every host answering; not: {', '.join(down)}: nothing rolled")
    up = [h for h, a in facts.items() if a["status"] == "up"]
    if batch >= len(up):
        raise SaltInvocationError(
            f"batch={batch} would put every answering hypervisor ({len(up)}) in maintenance at once: no host left "
            "to take their VMs. Nothing rolled"
        )
    return facts


def roll(roller: Roll, hosts: Iterable[str], batch: int = 1, balance: bool = False) -> Data:
    """Roll ``hosts`` (sorted), ``batch`` at a time (see the module doc): ``{hosts: {host: {status, steps,
    seconds}}, done, stopped, untouched, left_in_maintenance, balance, vms, test}``."""
    todo = sorted(hosts)
    remote = roller.remote
    before = running(_start(remote, todo, batch))
    records: dict[str, Data] = {}
    stopped = None
    for i in range(0, len(todo), batch):
        chunk = todo[i : i + batch]
        try:
            if roller.test:
                roller.batch(chunk, records)
            else:
                with fleetstate.lock(remote.opts, [LOCK + h for h in chunk], kind="virt.roll"):
                    roller.batch(chunk, records)
        except Stop as exc:
            stopped = {"host": exc.host, "step": exc.step, "reason": exc.reason, **exc.details}
            break
        except fleetstate.HeldError as exc:  # another roll has one of them: nothing of this batch was done
            stopped = {"host": ",".join(chunk), "step": "maintenance", "reason": str(exc)}
            break
    ret: Data = {
        "test": roller.test,
        "hosts": records,
        "done": [h for h in todo if records.get(h, {}).get("status") == "done"],
        "stopped": stopped,
        "untouched": [h for h in todo if records.get(h, {}).get("status", "not started").startswith("not started")],
        "left_in_maintenance": sorted(roller.maintenance),
    }
    if balance and not stopped:
        ret["balance"] = _balance(roller)
    ret["vms"] = _intact(before, running(remote.gather("virt.full_info")))
    return ret


def _balance(roller: Roll) -> Data:
    proposal = rebalance.plan(roller.remote.gather("virt.full_info"), roller.policy)
    moves = [{"vm": m["vm"], "from": m["from"], "to": m["to"]} for m in proposal["moves"]]
    if roller.test or not moves:
        return {"moves": moves, "reason": proposal["reason"], "applied": False}
    done = rebalance.apply(roller.remote, proposal, **roller.migration)
    return {"moves": moves, "reason": proposal["reason"], "applied": True, "failed": done["failed"]}


def _intact(before: dict[str, list[str]], after: dict[str, list[str]]) -> Data:
    """Every VM that ran before the roll runs after it exactly once (by UUID): what is missing or twice."""
    return {
        "running_before": len(before),
        "running_after": len(after),
        "not_running": sorted(u for u in before if u not in after),
        "twice": {u: hosts for u, hosts in sorted(after.items()) if len(hosts) > 1},
    }
