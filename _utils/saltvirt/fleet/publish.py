"""How the ``virt`` runner reaches the hypervisors (master side): which minions are hypervisors, one
LocalClient publication to all of them with bounded waits, answers merged per minion (hosts that do
not answer are reported ``down``, never dropped), and the fleet views built on it (:meth:`Fleet.gather`,
:func:`locate`). :class:`Fleet` is the one way there for the runners, the master engines and the fleet modules:
the master's opts, these settings and a LocalClient in one object, with ``run``/``call`` (signed answers and
their statuses), ``ret``/``answers`` (a step's return, or :class:`Failed`), ``gather`` and ``capacities``.
The master's key store is :mod:`saltvirt.fleet.minionkeys`; the master side of ``virt.init`` is
:mod:`saltvirt.fleet.vmcreate`.

Which minions are hypervisors: ``virt:hypervisors`` in the master config, minion ids only (see
:mod:`saltvirt.fleet.hypervisors`; grains and answers decide nothing, nothing is learnt, nothing discovered
with ``*``). Its mapping form also carries the waits (every key optional)::

    virt:
      hypervisors:
        tgt: 'hyper*'            # or a list of ids, a pcre, a nodegroup (tgt_type), an id-only compound
        tgt_type: glob
        timeout: 5               # seconds before a slow hypervisor is asked whether it still runs the job
        gather_job_timeout: 5    # seconds between two such checks
        down_after: 20           # seconds with no answer to any check before it is reported down
        down_memory: 300         # seconds a host reported down stays suspect: down after one unanswered
                                 # check (timeout + gather_job_timeout) instead of down_after; 0: off
        max_wait: 60             # hard bound for a query, whatever the minions say
        init_timeout: 1800       # hard bound for virt.init on one hypervisor (image copy + seeding)

The minions expected to answer are the accepted keys the target matches, published to as an explicit
list, so a stopped hypervisor is listed as ``down``. A per-call ``tgt=`` narrows the choice among them
(for ``virt.init`` and a tenant's ``virt.update`` only where the VM may go or is looked up: names and
quotas are checked in answers of every hypervisor, :meth:`Fleet.wide`).

Answer statuses: ``up`` (returned), ``error`` (answered with an error: the module raised, or virt
did not load on an expected hypervisor), ``down`` (no signed answer, and no signed answer to its job checks
for ``down_after`` seconds, or its job ended without one), ``timeout`` (still running the job when
``max_wait`` ran out: it may still finish). Only answers a hypervisor signed with its minion key for this
request are believed (:mod:`saltvirt.fleet.replies`): the event bus is not an authenticated channel.
"""

import contextlib
import io
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import salt.cache
import salt.client
import salt.key
import salt.utils.jid
import salt.utils.minions
from salt.exceptions import CommandExecutionError

from saltvirt.base import metrics, validate
from saltvirt.base.config import master_opts
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import hypervisors, replies
from saltvirt.pki import answers

log = logging.getLogger(__name__)

DEFAULTS = {
    "tgt": None,
    "tgt_type": None,
    "timeout": 5,
    "gather_job_timeout": 5,
    "down_after": 20,
    "down_memory": 300,
    "max_wait": 60,
    "init_timeout": 1800,
}
_NO_VIRT = re.compile(r"^'virt(\.[\w.]+)?' (is not available|__virtual__ returned False)")
_ERR_PREFIX = re.compile(r"^(ERROR: |ERROR executing '[\w.]+': )")


def config(opts: SaltOpts, **overrides: Any) -> Data:
    """Effective settings: defaults < master config (``virt:hypervisors``) < per-call overrides. Raises
    :class:`saltvirt.fleet.hypervisors.NotConfiguredError` (saying what to add) when no hypervisors are
    configured, SaltInvocationError for a target on minion-reported data without the opt-in."""
    hypervisors.target(opts)
    cfg: Data = dict(DEFAULTS, tgt=None, tgt_type=None)
    cfg.update(hypervisors.waits(opts))
    cfg.update({k: v for k, v in overrides.items() if v is not None and k in DEFAULTS})
    for key in ("timeout", "gather_job_timeout", "down_after", "max_wait", "init_timeout"):
        cfg[key] = validate.seconds(cfg[key], f"virt:hypervisors:{key}")
    if cfg["down_memory"] not in (0, "0"):  # 0: every call waits down_after in full
        cfg["down_memory"] = validate.seconds(cfg["down_memory"], "virt:hypervisors:down_memory")
    cfg["down_memory"] = float(cfg["down_memory"])
    # a hard bound shorter than Salt's own down-detection would report down hosts as 'timeout'
    floor = cfg["timeout"] + cfg["down_after"] + 2
    cfg["max_wait"] = max(cfg["max_wait"], floor)
    cfg["init_timeout"] = max(cfg["init_timeout"], floor)
    return cfg


# who is a hypervisor -------------------------------------------------------------------------------
def key_lists(opts: SaltOpts) -> dict[str, list[str]]:
    return salt.key.Key(opts).list_keys()


# publish and gather --------------------------------------------------------------------------------
def classify(ret: Any, retcode: Any) -> Data:
    """One minion's answer -> ``{status, ret | error, no_virt?}``."""
    if isinstance(ret, str) and _NO_VIRT.match(ret):
        return {"status": "error", "error": ret, "no_virt": True}
    failed = retcode not in (None, 0) or (
        isinstance(ret, str) and ret.startswith(("ERROR", "Passed invalid arguments"))
    )
    if failed:
        if isinstance(ret, dict) and any(isinstance(v, str) and _NO_VIRT.match(v) for v in ret.values()):
            msg = next(v for v in ret.values() if isinstance(v, str) and _NO_VIRT.match(v))
            return {"status": "error", "error": msg, "no_virt": True}
        text = ret if isinstance(ret, str) else repr(ret)
        return {"status": "error", "error": _ERR_PREFIX.sub("", text).strip(), "retcode": retcode}
    return {"status": "up", "ret": ret}


def _relay(client, watch, senders=()):
    """Hand the events on the bus now whose tag starts with ``watch[0]``, sent by one of ``senders`` (the
    minions this publication went to, as the master authenticated the sender: ``id`` of a minion event), to
    ``watch[1]``; any other minion's events under that tag are dropped. Progress only: nothing is decided from
    them. Bounded as :func:`_drain` (it read until the bus was empty: a guest firing that tag without pause held
    the runner for as long as it fired)."""
    if watch:
        _read_now(client, lambda ev: _relay_one(ev, watch, senders), tag=watch[0], match_type="startswith")


def _relay_one(ev, watch, senders):
    data = ev.get("data") or {}
    if isinstance(data, dict) and data.get("source") != "runner" and data.get("id") in senders:
        try:
            watch[1](ev["tag"], data.get("data", data) if isinstance(data.get("data"), dict) else data)
        except Exception as exc:  # noqa: BLE001 - progress display never breaks the work
            log.debug("virt runner: progress relay failed: %s", exc)


def _named(opts: SaltOpts, tgt: str | Sequence[str]) -> tuple[list[str], dict[str, Data]]:
    """One or a few named minions (virt.init, migration steps): ``(hypervisors, refused)``."""
    named = [tgt] if isinstance(tgt, str) else list(tgt)
    members = set(hypervisors.members(opts, named)) & set(key_lists(opts)["minions"])
    refused = {
        m: {"status": "error", "error": f"{m} is not one of the hypervisors (virt:hypervisors in the master config)"}
        for m in named
        if m not in members
    }
    return [m for m in named if m in members], refused


# the longest one read of the bus blocks before the wait looks at the clock. It polled before: a look every
# 5 ms kept 8.5% of a core busy for as long as a runner waited (a TCG boot, a migration: minutes)
TICK = 0.1
DRAIN_MAX = 1000  # events read at once before a hypervisor is given up (see _drain)


MASTER_LOOK = 2.0  # seconds between two looks at the salt-master while a wait lasts (the first as it begins)


def master_running(opts: SaltOpts) -> bool:
    """Whether this master's salt-master still accepts connections on its ret port (a runner runs on the master
    host): when it stopped, a hypervisor that "did not answer" had no master to answer to."""
    import socket  # noqa: PLC0415 - only in a wait that lasts

    host = opts.get("interface") or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((host, int(opts.get("ret_port", 4506))), timeout=5):
            return True
    except OSError:
        return False


class MasterGone(CommandExecutionError):  # noqa: N818 - says what happened, as Failed does
    """The salt-master stopped while a runner waited for answers: none can reach the runner any more."""


class _MasterWatch:
    """Whether the salt-master, seen running during this wait (its first look is as the wait begins, right after
    the publication), has stopped since: two looks in a row :data:`MASTER_LOOK` apart find its ret port closed.
    A runner waited out every hypervisor's silence before (41 s in test_faults) and took them for silent. A
    master never seen running (a wait without one) is never reported gone."""

    def __init__(self, opts: SaltOpts, started: float) -> None:
        self.opts, self.next, self.seen, self.misses = opts, started, False, 0

    def gone(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + MASTER_LOOK
        if master_running(self.opts):
            self.seen, self.misses = True, 0
            return False
        self.misses += 1
        return self.seen and self.misses >= 2


def _wait(waiting, client, watch, expected, check, max_wait):
    """Read the bus until every expected hypervisor answered, was given up, or ``max_wait`` ran out. Each read
    blocks until an event arrives (Salt reads a big answer whole) or :data:`TICK` passes, so a wait costs no CPU
    between events; the clock's work (``check``, give-ups, job checks, the master's look) runs once a tick.
    :class:`MasterGone` when the salt-master stops meanwhile."""
    deadline = waiting.started + max_wait
    ticked = None
    master = _MasterWatch(waiting.opts, waiting.started)
    while waiting.missing:
        now = time.monotonic()
        if now > deadline:
            return
        if ticked is None or now - ticked >= TICK:
            if check is not None:
                check()
            if master.gone(now):
                raise MasterGone(
                    f"the salt-master stopped while waiting for {waiting.fun} from "
                    f"{', '.join(sorted(waiting.missing))}: no answer can reach this runner any more; once the "
                    "master is back, look at what happened there (salt-run virt.query) before running it again"
                )
            # an answer already on the bus is neither silence nor a reason to ask again: a loaded runner reads late
            if waiting.silent(now) or waiting.due(now):
                _drain(client, waiting, watch, expected)
            waiting.give_up(now)
            waiting.ask(now)
            ticked = now
            if not waiting.missing:
                return
        event = client.event.get_event(wait=max(0.001, min(TICK, deadline - now)), tag="", full=True)
        _dispatch(event, waiting, watch, expected)


def _dispatch(event, waiting, watch, expected):
    tag = str((event or {}).get("tag", ""))
    if tag.startswith("salt/job/"):
        waiting.take(event)
    elif watch and tag.startswith(watch[0]):
        _relay_one(event, watch, expected)


def _drain(client, waiting, watch, expected):
    """Read what is on the bus now, without waiting (see :func:`_read_now`)."""
    _read_now(client, lambda event: _dispatch(event, waiting, watch, expected))


def _read_now(client, handle, tag="", **match):
    """Hand the events on the bus now (``tag``: those under it) to ``handle``, without waiting: at most
    :data:`DRAIN_MAX` of them, because a bus that anyone can flood must not hold a runner."""
    for _ in range(DRAIN_MAX):
        event = client.event.get_event(no_block=True, tag=tag, full=True, **match)
        if not event:
            return
        handle(event)


@contextlib.contextmanager
def _watching(client: Any, watch: tuple[str, Callable[..., Any]] | None) -> Iterator[None]:
    """``watch``'s events subscribed for the block (from before the publication: none is missed), and
    unsubscribed however it ends (a lost lock's ``check`` raises mid-wait)."""
    if not watch:
        yield
        return
    client.event.subscribe(watch[0], match_type="startswith")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            client.event.unsubscribe(watch[0], match_type="startswith")


class Fleet:
    """The master's one way to the hypervisors: ``opts``, the settings ``cfg`` (:func:`config`, read from the
    master config on first use when None) and the LocalClient ``client`` (None: one per publication), with
    what the runner, the engines and the fleet modules ask of them. Every answer it returns is one the
    hypervisor signed for the request (:mod:`saltvirt.fleet.replies`); the bus only relays progress (``watch``).
    """

    def __init__(self, opts: SaltOpts, cfg: Data | None = None, client: Any = None) -> None:
        self.opts, self._cfg, self.client = opts, cfg, client

    @classmethod
    def of_master(cls, opts: SaltOpts, client: Any = None, **overrides: Any) -> "Fleet":
        """The master's transport from its ``opts`` as Salt hands them to a runner or engine (Salt's old flat
        ``virt.*`` keys read too: :func:`saltvirt.base.config.master_opts`), its settings narrowed for this call
        by ``overrides`` (``tgt``, ``tgt_type``, ``timeout``: :func:`config`)."""
        return cls(opts, config(master_opts(opts), **overrides), client)

    @property
    def cfg(self) -> Data:
        if self._cfg is None:
            self._cfg = config(self.opts)
        return self._cfg

    def with_cfg(self, cfg: Data) -> "Fleet":
        """The same transport (opts, client) with other settings."""
        return Fleet(self.opts, cfg, self.client)

    def with_client(self, client: Any) -> "Fleet":
        """The same transport (opts, settings) over the LocalClient ``client``."""
        return Fleet(self.opts, self._cfg, client)

    def wide(self) -> "Fleet":
        """This transport without its per-call ``tgt``/``tgt_type``: every hypervisor. What a VM name must be
        unique among and what a tenant's quota counts is the whole fleet, whatever ``tgt`` a call passes."""
        return self.with_cfg(dict(self.cfg, tgt=None, tgt_type=None))

    def target(self) -> list[str]:
        """The hypervisors to publish to: the configured ones (accepted keys), narrowed by a per-call
        ``tgt``/``tgt_type`` in ``cfg``; a sorted list of minion ids."""
        return hypervisors.narrow(self.opts, self.cfg.get("tgt"), self.cfg.get("tgt_type"))

    def within_target(self, hosts: dict[str, Data]) -> dict[str, Data]:
        """The part of ``hosts`` (answers of every hypervisor, :meth:`wide`) that ``cfg``'s per-call ``tgt``
        selects: all of them without one."""
        if not self.cfg.get("tgt"):
            return hosts
        ids = set(self.target())
        return {h: a for h, a in hosts.items() if h in ids}

    def new_jid(self) -> str:
        """A fresh Salt job id, to seal a secret for the job before publishing it (``run(..., jid=)``)."""
        return salt.utils.jid.gen_jid(self.opts)

    def run(
        self,
        fun: str,
        arg: Sequence[Any] = (),
        kwarg: Data | None = None,
        *,
        tgt: str | Sequence[str] | None = None,
        max_wait: float | None = None,
        watch: tuple[str, Callable[..., Any]] | None = None,
        jid: str | None = None,
        check: Callable[[], None] | None = None,
        tenant: str | None = None,
        capacity: Data | None = None,
    ) -> tuple[dict[str, Data], str | None]:
        """Publish ``fun`` once to the hypervisors (``tgt``: these named ones) and gather every answer within the
        configured bounds.

        Returns ``({minion: {"status": up|error|down|timeout, "ret"|"error": ...}}, jid)`` for every minion
        expected (the target's accepted keys). Only answers the hypervisor signed for this request count
        (:mod:`saltvirt.fleet.replies`); a slow hypervisor is waited for while it says it still runs the job.
        ``watch=(tag_prefix, callback)`` relays matching master events (e.g. virt.init progress) while waiting.
        ``jid``: publish under this job id (made beforehand with :meth:`new_jid`: what a sealed secret is bound
        to). ``check()``: called while waiting (cheap, no I/O); what it raises stops the wait and is raised (a
        lock the caller no longer holds: :meth:`saltvirt.fleet.fleetstate.Lease.check`).
        ``tenant``: the call acts for this tenant on the VM named by ``arg[0]``: the hypervisor itself refuses it
        unless that VM's recorded owner is this tenant (``virt.answer``). ``capacity`` (``virt.init``): the room the
        hypervisor checks it still has before it runs the function (:func:`saltvirt.fleet.vmcreate.host_need`).
        """
        opts, cfg = self.opts, self.cfg
        refused: dict[str, Data] = {}
        if tgt is None:
            ids = self.target()
        else:
            ids, refused = _named(opts, tgt)
            if refused and not ids:
                return refused, None
        if not ids:
            return {}, None
        expected = set(ids)
        max_wait = float(max_wait or cfg["max_wait"])
        client = self.client or salt.client.get_local_client(opts["conf_file"])
        nonce = answers.new_nonce()
        request = {"fun": fun, "nonce": nonce, "args": list(arg), "kwargs": dict(kwarg or {})}
        if tenant is not None:
            request["tenant"] = tenant
        if capacity is not None:
            request["capacity"] = capacity
        with _watching(client, watch):
            with contextlib.redirect_stdout(io.StringIO()) as noise:  # LocalClient prints "No minions matched"
                more = {"jid": jid} if jid else {}  # LocalClient's own default otherwise (a new jid)
                pub = client.run_job(
                    sorted(ids), "virt.answer", [], "list", timeout=cfg["timeout"], kwarg=request, listen=True, **more
                )
            if noise.getvalue().strip():
                log.debug("virt runner: LocalClient said: %s", noise.getvalue().strip())
            if not pub:
                out = {m: {"status": "down", "error": "the master could not publish to it"} for m in expected}
                return {**out, **refused}, None
            waiting = replies.Replies(opts, client, cfg, pub["jid"], fun, nonce, expected, classify)
            try:
                _wait(waiting, client, watch, expected, check, max_wait)
            finally:
                _relay(client, watch, expected)
                waiting.clean_up()
        out = {**waiting.answers, **waiting.down}
        for mid in waiting.missing:
            if time.monotonic() - waiting.started >= max_wait:
                out[mid] = {
                    "status": "timeout",
                    "error": f"no answer within max_wait={max_wait:g} s (it may still be running)",
                }
            else:
                out[mid] = waiting.down_answer(mid)
        return {mid: out[mid] for mid in sorted(out)}, pub["jid"]

    def call(
        self,
        minion: str,
        fun: str,
        arg: Sequence[Any] = (),
        kwarg: Data | None = None,
        *,
        max_wait: float | None = None,
        watch: tuple[str, Callable[..., Any]] | None = None,
        jid: str | None = None,
        check: Callable[[], None] | None = None,
        tenant: str | None = None,
        capacity: Data | None = None,
    ) -> tuple[Data, str | None]:
        """Run ``fun`` on one minion; ``(answer, jid)`` with the same statuses as :meth:`run`."""
        got, jid = self.run(
            fun,
            arg,
            kwarg,
            tgt=[minion],
            max_wait=max_wait,
            watch=watch,
            jid=jid,
            check=check,
            tenant=tenant,
            capacity=capacity,
        )
        return got.get(minion) or {"status": "down", "error": "did not answer"}, jid

    def ret(self, minion: str, fun: str, *args: Any, max_wait: float | None = None, **kwargs: Any) -> Any:
        """What ``fun(*args, **kwargs)`` returned on ``minion``, or :class:`Failed` with ``status`` (error, down,
        timeout): for the steps of a migration, a recovery or a roll, where any other answer stops the work."""
        ans, jid = self.call(minion, fun, list(args), kwargs or None, max_wait=max_wait)
        if ans["status"] != "up":
            error = ans.get("error") or ans["status"]
            raise Failed(f"{fun} on {minion}: {error}", host=minion, status=ans["status"], jid=jid)
        return ans["ret"]

    def answers(self, fun: str, *args: Any, tgt: str | list[str] | None = None) -> dict[str, Data]:
        """Every hypervisor's (or those in ``tgt``) answer to ``fun(*args)``: ``{minion: {status, ret|error}}``
        (:meth:`run`, one publication)."""
        return self.run(fun, list(args), tgt=tgt)[0]

    def gather(self, fun: str = "virt.full_info", check: Callable[[], None] | None = None) -> dict[str, Data]:
        """Every hypervisor's answer to ``fun`` in the runner's shape (``full_info`` and ``capacity`` ->
        ``{status, host, vm_info}``, ``host_info`` -> ``{status, host}``, ``vm_state`` -> ``{status, vms}``).
        ``check``: as in :meth:`run`."""
        got, _jid = self.run(fun, check=check)
        out = {}
        for mid, ans in got.items():
            if ans["status"] != "up":
                out[mid] = {k: v for k, v in ans.items() if k in ("status", "error", "no_virt")}
            elif fun in ("virt.full_info", "virt.capacity") and isinstance(ans["ret"], dict):
                ret = ans["ret"]
                out[mid] = {"status": "up", "host": ret.get("host", {}), "vm_info": ret.get("vm_info", {})}
            elif fun == "virt.vm_state":
                out[mid] = {"status": "up", "vms": ans["ret"]}
            else:
                out[mid] = {"status": "up", "host": ans["ret"]}
        if fun in ("virt.full_info", "virt.capacity", "virt.host_info") and metrics.ensure(self.opts):
            measure(out)
        return out

    def capacities(self, check: Callable[[], None] | None = None) -> dict[str, Data]:
        """Every hypervisor's capacity for placement (``virt.capacity``: node totals, usage, the group
        index; not every VM's facts). A hypervisor with an older salt-virt that has no ``virt.capacity``
        is asked ``virt.full_info`` instead, so placement still sees it."""
        hosts = self.gather("virt.capacity", check)
        old = sorted(h for h, a in hosts.items() if a.get("no_virt") and "virt.capacity" in str(a.get("error")))
        if old:
            log.info("virt runner: %s have no virt.capacity (older salt-virt): asking virt.full_info", ", ".join(old))
            hosts.update(self.with_cfg(dict(self.cfg, tgt=old, tgt_type="list")).gather("virt.full_info", check))
        for answer in hosts.values():
            answer.pop("no_virt", None)
        return hosts


# fleet views ---------------------------------------------------------------------------------------
class Failed(CommandExecutionError):  # noqa: N818 - the runner's public name for it
    """A runner operation failed; ``details`` (tried hosts, cleanup, ...) go into the runner's answer."""

    def __init__(self, message, **details):
        super().__init__(message)
        self.details = details


def failure(exc: Exception, **extra: Any) -> Data:
    """A runner function's answer for ``exc``: its real message, its :class:`Failed` details, ``extra`` and
    ``retcode: 1`` (the loader module also sets ``__context__["retcode"]``, salt-run's exit code)."""
    return {"error": getattr(exc, "error", None) or str(exc), **getattr(exc, "details", {}), **extra, "retcode": 1}


def measure(hosts: dict[str, Data]) -> None:
    """The capacity gauges of the hypervisors in ``hosts`` (:meth:`Fleet.gather`'s answers; minion ids as labels: the
    operator's machines). Memory in bytes; "used": what running VMs hold, as placement counts it."""
    for host, ans in hosts.items():
        metrics.set_gauge("saltvirt.host.up", int(ans["status"] == "up"), host=host)
        facts = ans.get("host") or {}
        mem, cpus = validate.int_or_none(facts.get("mem_total")), validate.int_or_none(facts.get("vcpus_total"))
        if ans["status"] != "up" or not mem or not cpus:
            continue
        used_mem = validate.int_or_none(facts.get("mem_used_by_vms")) or 0
        used_cpus = validate.int_or_none(facts.get("vcpus_used_by_vms")) or 0
        for state, mib in (("total", mem), ("used", used_mem), ("free", max(mem - used_mem, 0))):
            metrics.set_gauge("saltvirt.host.memory", mib << 20, host=host, state=state)
        for state, n in (("total", cpus), ("used", used_cpus), ("free", max(cpus - used_cpus, 0))):
            metrics.set_gauge("saltvirt.host.vcpus", n, host=host, state=state)
        for state in ("defined", "active"):
            if isinstance(facts.get(f"vms_{state}"), int):
                metrics.set_gauge("saltvirt.host.vms", facts[f"vms_{state}"], host=host, state=state)
    metrics.flush()


def down_hosts(hosts: dict[str, Data]) -> list[str]:
    return sorted(h for h, a in hosts.items() if a["status"] != "up")


def locate(hosts: dict[str, Data], name: str, host: str | None = None) -> str:
    """The one hypervisor where VM ``name`` is defined (``hosts`` from :meth:`Fleet.gather`)."""

    def has(ans):
        vms = ans.get("vms") if "vms" in ans else ans.get("vm_info")
        return ans["status"] == "up" and name in (vms or {})

    found = sorted(h for h, a in hosts.items() if has(a))
    unknown = down_hosts(hosts)
    if host:
        if host in found:
            return host
        if host in unknown:
            raise Failed(f"hypervisor {host} is {hosts[host]['status']}: {hosts[host].get('error')}", down=unknown)
        raise Failed(f"VM {name!r} is not defined on {host}" + (f" (it is on {', '.join(found)})" if found else ""))
    if len(found) > 1:
        raise Failed(
            f"VM name {name!r} is ambiguous: defined on {', '.join(found)}. Pass host=<one of them>, "
            "and rename one of them to keep names unique",
            hosts=found,
        )
    if not found:
        hint = f"; these hypervisors did not answer and may have it: {', '.join(unknown)}" if unknown else ""
        raise Failed(f"VM {name!r} is not defined on any hypervisor that answered{hint}", down=unknown)
    return found[0]
