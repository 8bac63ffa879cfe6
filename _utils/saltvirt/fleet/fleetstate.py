"""Runner state shared by every master: per-name locks (``virt.init``, migrate/evacuate) and capacity
reservations, kept in Salt's own cache layer (``salt.cache.Cache(opts)``), so the operator picks the
backend with Salt's standard ``cache:`` master setting.

What each ``cache:`` backend guarantees to the operator (redis: correct across masters; localfs and the
others: one master only) is in ``docs/topics/masters.md``. How (every update is a read-modify-write done by
:meth:`Store.transact`): with ``redis``, ``WATCH`` + ``MULTI``/``EXEC`` on the same Redis hash field Salt's
``redis`` cache driver uses (``<keys_prefix><sep><bank>/`` -> ``key``), on a client built from the same
``cache.redis.*`` options (``cache.redis.cluster_mode`` is refused: a transaction across the driver's keys
spans hash slots); with any other driver, an ``flock`` on ``<cachedir>/salt-virt/state.lock`` around fetch +
store, and a warning when the driver is not ``localfs``.

Locks (bank ``salt-virt/locks``, one entry per VM name / minion id)::

    {token, kind: init|migrate|..., name, owner: {master, host, pid, pid_start, job},
     taken, renewed, expires, ttl, detail: {...}}

A lock is a lease: its holder renews it every ``ttl / 3`` seconds from a thread while it works
(``virt:shared:lock_ttl``, default 60 s). A lock is taken over only when its owner is gone: on the
same master (same master id and host name) when the owner's pid is no longer that process (checked
at once, whatever the expiry); for another master's lock when its lease expired (its master died or
lost the store for longer than the ttl). A local owner that is still alive is never broken, even
with an expired lease. Every takeover is reported (``taken_over`` with the stale record). Clocks of
the masters must agree (NTP) to well under the ttl.

Reservations (bank ``salt-virt/reservations``, one entry per hypervisor)::

    {"entries": {vm: {cpu, mem, disk_mib, token, owner, state: active|settled, expires, settled_at}}}

taken at placement (under a compare-and-set that re-checks the host still fits with every other
reservation counted) and settled when the VM is running, or dropped when the call failed. An active
reservation counts as used capacity until it expires (renewed with its lock); a settled one counts
for snapshots taken before it settled (those did not see the VM yet); none counts once the VM shows
up running in the snapshot (the host's own figures include it then).
"""

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import salt.cache
import salt.payload
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import install, procs
from saltvirt.base.config import section, virt_conf
from saltvirt.base.salttypes import Data, SaltOpts

# seconds a redis command (and connecting) may take: a store that stops answering (a cut network) fails
# the call instead of hanging the runner and its lease (Salt's own redis driver waits forever)
REDIS_TIMEOUT = 10
if TYPE_CHECKING:  # every use of the module follows _redis_client, which imported it
    import redis
else:
    redis = None  # imported on first use (cache: redis only): ~0.2 s of every salt-run virt.* start-up otherwise


def _redis_module():
    global redis
    if redis is None:
        try:
            import redis as module  # noqa: PLC0415 - only needed with cache: redis (Salt's driver needs it too)
        except ImportError:
            return None
        redis = module
    return redis


log = logging.getLogger(__name__)

LOCKS = "salt-virt/locks"
RESERVATIONS = "salt-virt/reservations"
DEFAULTS = {"lock_ttl": 60.0, "settle_window": 900.0, "clock_skew": 5.0}
_MULTI_MASTER = ("redis",)


def config(opts: SaltOpts) -> Data:
    """``virt:shared`` from the master config: defaults < config."""
    conf = section(virt_conf(opts).get("shared"), "virt:shared", DEFAULTS)
    cfg = dict(DEFAULTS)
    for key, value in conf.items():
        try:
            cfg[key] = float(value)
        except (TypeError, ValueError):
            raise SaltInvocationError(f"virt:shared:{key} must be a number of seconds, not {value!r}") from None
        if cfg[key] < (1 if key == "lock_ttl" else 0):
            raise SaltInvocationError(f"virt:shared:{key} is too small: {value!r}")
    return cfg


class AbortUpdate(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a transact() update function: leave the entry as it is."""


class Store:
    """Atomic read-modify-write of one cache entry (see the module doc for what each backend guarantees)."""

    def __init__(self, opts):
        self.opts = opts
        self.cache = salt.cache.Cache(opts)
        self.driver = self.cache.driver
        self._redis = None
        if self.driver == "redis":
            self._redis = _redis_client(opts)
        else:
            self.lockfile = os.path.join(self.cache.cachedir, "salt-virt", "state.lock")
            if self.driver != "localfs":
                log.warning(
                    "virt: cache driver %r has no compare-and-set in salt-virt: its shared state is safe on "
                    "one master only (a file lock); use cache: redis for several masters",
                    self.driver,
                )

    @property
    def multi_master(self) -> bool:
        return self.driver in _MULTI_MASTER

    def describe(self) -> str:
        if self._redis is not None:
            return f"redis ({self._redis['where']})"
        return f"{self.driver} (file lock {self.lockfile}: one master)"

    def fetch(self, bank: str, key: str) -> Any:
        if self._redis is not None:  # our client, with its timeouts (Salt's driver has none)
            return self._reading(lambda: _redis_fetch(self._redis, bank, key))
        return self.cache.fetch(bank, key) or None

    def entries(self, bank: str) -> dict[str, Any]:
        if self._redis is not None:
            return self._reading(lambda: _redis_entries(self._redis, bank))
        out = {}
        for key in self.cache.list(bank) or []:
            val = self.fetch(bank, key)
            if val:
                out[key] = val
        return out

    def _reading(self, read):
        try:
            return read()
        except redis.RedisError as exc:
            raise self._failed("read", exc) from exc

    def _failed(self, verb: str, exc: Exception) -> "StoreError":
        """The one wording of a store that did not answer: where the state lives and what to check."""
        return StoreError(
            f"the shared runner state ({self.describe()}) cannot be {verb}: {str(exc).rstrip('.')}. "
            "Check the master's cache: setting and that the store is reachable"
        )

    def transact(self, bank: str, key: str, update: Callable[..., Any]) -> Any:
        """``update(old or None) -> new`` (None deletes; raise :class:`AbortUpdate` to keep it). Returns new."""
        try:
            if self._redis is not None:
                return _redis_transact(self._redis, bank, key, update)
            return self._locked_transact(bank, key, update)
        except (AbortUpdate, CommandExecutionError, SaltInvocationError):
            raise
        except Exception as exc:  # SaltCacheError, redis errors: say where the state lives
            raise self._failed("updated", exc) from exc

    def _locked_transact(self, bank, key, update):
        os.makedirs(os.path.dirname(self.lockfile), mode=0o700, exist_ok=True)
        with open(self.lockfile, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            new = update(self.fetch(bank, key))
            if new is None:
                self.cache.flush(bank, key)
            else:
                self.cache.store(bank, key, new)
            return new


# redis: the driver's own layout, one WATCH/MULTI transaction per update ------------------------------
def _redis_client(opts):
    if _redis_module() is None:
        raise CommandExecutionError(
            f"virt: cache: redis needs the redis Python client on the master: {install.pip_hint('redis')}"
        )
    if opts.get("cache.redis.cluster_mode"):
        raise CommandExecutionError(
            "virt: cache.redis.cluster_mode is not supported for salt-virt's shared state (its transactions "
            "would span hash slots): point the masters at one redis server (with a replica for failover)"
        )
    sep = opts.get("cache.redis.separator", "_")
    host, port = opts.get("cache.redis.host", "localhost"), opts.get("cache.redis.port", 6379)
    sock = opts.get("cache.redis.unix_socket_path")
    client = redis.Redis(
        host,
        port,
        unix_socket_path=sock,
        db=opts.get("cache.redis.db", "0"),
        password=opts.get("cache.redis.password"),
        socket_timeout=REDIS_TIMEOUT,
        socket_connect_timeout=REDIS_TIMEOUT,
        # one quick retry on a broken connection (a restarted redis: the pooled one is dead), none on a
        # timeout; redis-py's default (3 retries, backoff up to 10 s, timeouts too) turned one refused
        # connection into seconds and one hung redis into 40 s per command
        retry=_retry_once(),
    )
    return {
        "client": client,
        "banks": opts.get("cache.redis.banks_prefix", "$BANKS") + sep,
        "keys": opts.get("cache.redis.keys_prefix", "$KEYS") + sep,
        "stamps": opts.get("cache.redis.timestamp_prefix", "$TSTAMP") + sep,
        "where": sock or f"{host}:{port}",
    }


def _retry_once():
    from redis.backoff import ExponentialBackoff  # noqa: PLC0415 - redis is imported on first use
    from redis.retry import Retry  # noqa: PLC0415

    return Retry(ExponentialBackoff(cap=0.2, base=0.05), 1, supported_errors=(redis.ConnectionError,))


def _redis_fetch(rd, bank, key):
    raw = rd["client"].hget(rd["keys"] + bank.rstrip("/") + "/", key)
    return salt.payload.loads(raw) if raw else None


def _redis_entries(rd, bank):
    found = rd["client"].hgetall(rd["keys"] + bank.rstrip("/") + "/")
    return {k.decode(): v for k, v in ((k, salt.payload.loads(raw)) for k, raw in found.items() if raw) if v}


def _redis_transact(rd, bank, key, update, attempts=200):
    bank = bank.rstrip("/") + "/"
    hkey, tkey = rd["keys"] + bank, rd["stamps"] + bank
    for _ in range(attempts):
        with rd["client"].pipeline() as pipe:
            try:
                pipe.watch(hkey)
                raw = pipe.hget(hkey, key)
                new = update(salt.payload.loads(raw) if raw else None)
                pipe.multi()
                if new is None:
                    pipe.hdel(hkey, key)
                    pipe.hdel(tkey, key)
                else:
                    pipe.zadd(rd["banks"], {hkey: 0})
                    pipe.hset(hkey, key, salt.payload.dumps(new))
                    pipe.hset(tkey, key, salt.payload.dumps(int(time.time())))
                pipe.execute()
                return new
            except redis.WatchError:
                time.sleep(0.005)
                continue
    raise CommandExecutionError(f"virt: {bank}{key} in redis changed {attempts} times while updating it: try again")


# owners and liveness --------------------------------------------------------------------------------
def me(opts: SaltOpts, job: str | None = None) -> Data:
    pid = os.getpid()
    return {
        "master": opts.get("id"),
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": procs.start_time(pid),
        "job": job,
    }


def local_owner_alive(opts: SaltOpts, owner: Data | None) -> bool | None:
    """True/False for an owner on this master (same master id and host), None for another master's."""
    if not owner or owner.get("master") != opts.get("id") or owner.get("host") != socket.gethostname():
        return None
    start = procs.start_time(owner.get("pid") or -1)
    return start is not None and start == owner.get("pid_start")


def who(rec: Data) -> str:
    """A one-line description of a lock's owner, for messages."""
    own = rec.get("owner") or {}
    job = f", job {own['job']}" if own.get("job") else ""
    return (
        f"{rec.get('kind', 'a call')} by master {own.get('master')} "
        f"(host {own.get('host')}, pid {own.get('pid')}{job}) "
        f"since {_ts(rec.get('taken'))}, lease until {_ts(rec.get('expires'))}"
    )


def _ts(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else "?"


class Journal:
    """A bounded log in the shared store (bank ``bank``, entry ``key``): the last ``size`` records, oldest first.
    What balancing, HA and remediation decided, for ``salt-run virt.balance_log``/``ha_log``/``remediate_log``."""

    def __init__(self, bank: str, key: str = "log", size: int = 200) -> None:
        self.bank, self.key, self.size = bank, key, size

    def append(self, store: "Store", records: list[Data], keep: int | None = None) -> None:
        """Add ``records``, keeping the last ``keep`` (None: ``size``)."""
        keep = self.size if keep is None else keep
        if records:
            store.transact(
                self.bank, self.key, lambda old: {"entries": [*((old or {}).get("entries") or []), *records][-keep:]}
            )

    def history(self, store: "Store", last: int | None = None) -> list[Data]:
        """The records, oldest first (the ``last`` ones only, when given)."""
        entries = list((store.fetch(self.bank, self.key) or {}).get("entries") or [])
        return entries[-last:] if last else entries


class StoreError(CommandExecutionError):
    """The shared store could not be read or updated (it names the store and what to check)."""


class LeaseLost(CommandExecutionError):  # noqa: N818 - named for what happened, as HeldError
    """The call no longer holds its lock (:meth:`Lease.check`): it must stop before its next step."""


class HeldError(SaltInvocationError):
    """The name is locked by a live owner."""

    def __init__(self, name, rec, note=""):
        self.record = rec
        super().__init__(f"{name!r} is held: {who(rec)}{note}: wait for it, or retry once it is released")


# locks ----------------------------------------------------------------------------------------------
class Lease:
    """The locks one call holds (several names) and the reservation it made; renewed from a thread."""

    def __init__(self, store, opts, kind, names, job=None, ttl=None, cfg=None):
        self.store, self.opts, self.kind = store, opts, kind
        self.cfg = cfg or config(opts)
        self.ttl = float(ttl or self.cfg["lock_ttl"])
        self.names = sorted(set(names))
        self.token = uuid.uuid4().hex
        self.owner = me(opts, job)
        self.held, self.taken_over, self.reservation = [], [], None
        self.quota = None  # (tenant, vm) of a tenant quota entry (saltvirt.fleet.quota)
        self.on_renew = []  # more entries renewed with the lease: callables(expires)
        self.lost, self.renewed_at = None, None
        self.store_error = None  # why the last renewal failed (None once one succeeds)
        self._stop = threading.Event()
        self._thread = None

    # taking and giving back
    def acquire(self) -> "Lease":
        try:
            for name in self.names:
                self._take(name)
        except BaseException:
            self.release()
            raise
        self.renewed_at = time.time()
        self._thread = threading.Thread(target=self._renew_loop, name=f"virt-lease-{self.names[0]}", daemon=True)
        self._thread.start()
        return self

    def _take(self, name):
        now = time.time()
        stale: list[Data] = []

        def update(old):
            stale.clear()
            if old and old.get("token") != self.token:
                alive = local_owner_alive(self.opts, old.get("owner"))
                if alive:
                    note = "" if old.get("expires", 0) > now else " (its lease expired, but the process is alive)"
                    raise HeldError(name, old, note)
                if alive is None and old.get("expires", 0) > now:
                    raise HeldError(name, old)
                stale.append(old)
            return {
                "token": self.token,
                "kind": self.kind,
                "name": name,
                "owner": self.owner,
                "taken": now,
                "renewed": now,
                "expires": now + self.ttl,
                "ttl": self.ttl,
                "detail": {},
            }

        self.store.transact(LOCKS, name, update)
        self.held.append(name)
        if stale:
            why = "its process is gone" if local_owner_alive(self.opts, stale[0].get("owner")) is False else "expired"
            log.warning("virt: took over the stale lock of %r (%s): %s", name, why, who(stale[0]))
            self.taken_over.append({"name": name, "why": why, "stale": stale[0], "was": who(stale[0])})

    def release(self) -> str | None:
        """Give the locks back (idempotent). A store that cannot be written leaves them to expire: what
        happened then, as a sentence for the caller's answer (None when every lock was given back)."""
        self._stop.set()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        failed = []
        for name in list(self.held):

            def update(old):
                if not old or old.get("token") != self.token:
                    raise AbortUpdate

            try:
                self.store.transact(LOCKS, name, update)
            except AbortUpdate:
                pass
            except Exception as exc:  # noqa: BLE001 - the lease expires by itself; the caller says so
                failed.append((name, exc))
            self.held.remove(name)
        if not failed:
            return None
        names = ", ".join(repr(name) for name, _exc in failed)
        return (
            f"the lock of {names} could not be given back: {failed[0][1]} "
            f"(it expires by itself {self.ttl:g} s after its last renewal, virt:shared:lock_ttl)"
        )

    # while working
    def note(self, **detail: Any) -> None:
        """Record what the holder is doing (host, hypervisor job) in its lock entries."""
        for name in self.held:

            def update(old, name=name):
                if not old or old.get("token") != self.token:
                    raise AbortUpdate
                return dict(old, detail=dict(old.get("detail") or {}, **detail))

            with contextlib.suppress(AbortUpdate):
                self.store.transact(LOCKS, name, update)

    def renew(self) -> None:
        now = time.time()
        for name in self.held:

            def update(old, name=name):
                if not old or old.get("token") != self.token:
                    self.lost = self.lost or (name, old)
                    raise AbortUpdate
                return dict(old, renewed=now, expires=now + self.ttl)

            with contextlib.suppress(AbortUpdate):
                self.store.transact(LOCKS, name, update)
        if self.reservation:
            renew_reservation(self.store, self.reservation, self.token, now + self.ttl)
        for renew in self.on_renew:
            renew(now + self.ttl)
        self.renewed_at, self.store_error = now, None

    def _renew_loop(self):
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - check() reports a lease we could not keep
                self.store_error = str(exc)
                log.warning("virt: cannot renew the lock of %s: %s", ", ".join(self.names), exc)

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless every lock is still ours: another holder took one, or none could
        be renewed for the lease's ttl (the store stopped answering: another master may take the names once
        it is back). Cheap (no store access): call it before an irreversible step and while waiting."""
        if self.lost:
            name, rec = self.lost
            by = who(rec) if rec else "nobody (it was removed)"
            raise LeaseLost(f"lost the lock of {name!r} while working (now held: {by}): stopped")
        if self.renewed_at and time.time() > self.renewed_at + self.ttl:
            why = self.store_error or f"the shared runner state ({self.store.describe()}) did not answer"
            why = why[:1].upper() + why[1:]
            raise LeaseLost(
                f"the lock of {', '.join(map(repr, self.names))} could not be renewed for {self.ttl:g} s "
                f"(virt:shared:lock_ttl), so another master may take it: stopped. {why}"
            )


@contextlib.contextmanager
def lock(
    opts: SaltOpts,
    names: Iterable[str],
    kind: str = "init",
    job: str | None = None,
    ttl: float | None = None,
    store: Store | None = None,
) -> Iterator[Lease]:
    """Hold the locks of ``names`` (VM names / minion ids) for one call: raises :class:`HeldError` (with
    who holds it) if a live owner has one. The same function serves virt.init and migrate/evacuate."""
    lease = Lease(store or Store(opts), opts, kind, names, job=job, ttl=ttl).acquire()
    try:
        yield lease
    finally:
        lease.release()


def holders(opts: SaltOpts, store: Store | None = None) -> dict[str, Any]:
    """Every lock entry now in the store: ``{name: record}``."""
    return (store or Store(opts)).entries(LOCKS)


# reservations ---------------------------------------------------------------------------------------
def _counts(rec, answer, since, now, skew):
    vm = ((answer or {}).get("vm_info") or {}).get(rec.get("name"))
    if vm and vm.get("state") == "running":
        return False  # the host's own figures count it
    if rec.get("state") == "settled":
        return rec.get("settled_at", 0) >= since - skew
    return rec.get("expires", 0) > now


def _prune(entries, now, window):
    return {
        n: r
        for n, r in entries.items()
        if (r.get("state") == "settled" and r.get("settled_at", 0) > now - window)
        or (r.get("state") != "settled" and r.get("expires", 0) > now)
    }


def tally(
    ledger: Data | None,
    answer: Data | None,
    since: float,
    now: float | None = None,
    skew: float = DEFAULTS["clock_skew"],
) -> Data:
    """What one host's reservations add to its used capacity: ``{cpu, mem, disk_mib, vms: [names],
    groups: {name: group}}``."""
    now = now or time.time()
    out: Data = {"cpu": 0, "mem": 0, "disk_mib": 0, "vms": [], "groups": {}}
    for name, rec in sorted(((ledger or {}).get("entries") or {}).items()):
        if _counts(dict(rec, name=name), answer, since, now, skew):
            out["cpu"] += int(rec.get("cpu") or 0)
            out["mem"] += int(rec.get("mem") or 0)
            out["disk_mib"] += int(rec.get("disk_mib") or 0)
            out["vms"].append(name)
            if rec.get("group"):
                out["groups"][name] = rec["group"]
    return out


def reserved(store: Store, hosts: dict[str, Data], since: float, cfg: Data | None = None) -> dict[str, Data]:
    """``{host: tally}`` for every host in ``hosts`` (the snapshot taken at ``since``)."""
    cfg = cfg or DEFAULTS
    ledgers = store.entries(RESERVATIONS)
    now = time.time()
    return {h: tally(ledgers.get(h), hosts.get(h), since, now, cfg["clock_skew"]) for h in hosts}


class NoRoomError(Exception):
    def __init__(self, reasons, load):
        super().__init__("; ".join(reasons))
        self.reasons, self.load = reasons, load


def reserve(
    store: Store,
    lease: Lease,
    host: str,
    name: str,
    req: Data,
    answer: Data | None,
    since: float,
    pol: Data | None = None,
    fits: Callable[..., list[str]] | None = None,
    cfg: Data | None = None,
) -> Any:
    """Reserve ``req`` on ``host`` for VM ``name`` if it still fits with every other reservation
    (``fits(answer, load) -> reasons``; not checked for a host that did not answer). Atomic per host.
    Raises :class:`NoRoomError`."""
    cfg = cfg or lease.cfg
    now = time.time()
    refused: list[tuple[list[str], Data]] = []  # (reasons, load) of the host that has no room

    def update(old):
        refused.clear()
        entries = _prune(dict((old or {}).get("entries") or {}), now, cfg["settle_window"])
        entries.pop(name, None)  # a stale one of ours (retry after a dead master) is replaced
        load = tally({"entries": entries}, answer, since, now, cfg["clock_skew"])
        reasons = fits(answer, load) if fits and (answer or {}).get("status") == "up" else []
        if reasons:
            refused.append((reasons, load))
            raise AbortUpdate
        entries[name] = active_entry(
            lease, now, cpu=req["cpu"], mem=req["mem"], disk_mib=req.get("disk_mib") or 0, group=req.get("group")
        )
        return {"entries": entries}

    try:
        store.transact(RESERVATIONS, host, update)
    except AbortUpdate:
        raise NoRoomError(*refused[0]) from None
    lease.reservation = (host, name)


def active_entry(lease: Lease, now: float, **sizes: Any) -> Data:
    """A new ``active`` ledger entry of ``lease`` (host reservations, tenant quotas): ``sizes`` + who, when."""
    return dict(sizes, token=lease.token, owner=lease.owner, state="active", taken=now, expires=now + lease.ttl)


def renew_reservation(
    store: Store, where: tuple[str, str], token: str, expires: float, bank: str = RESERVATIONS
) -> Any:
    """Extend the active entry ``where`` (``(key, vm)`` in ``bank``) held with ``token`` to ``expires``."""
    host, name = where

    def update(old):
        entries = dict((old or {}).get("entries") or {})
        rec = entries.get(name)
        if not rec or rec.get("token") != token or rec.get("state") != "active":
            raise AbortUpdate
        entries[name] = dict(rec, expires=max(expires, rec.get("expires", 0)))
        return {"entries": entries}

    with contextlib.suppress(AbortUpdate):
        store.transact(bank, host, update)


def finish(store: Store, lease: Lease, outcome: str, keep_for: float | None = None) -> None:
    """End the reservation of ``lease``: ``settled`` (the VM is running/defined: counts for older
    snapshots only), ``failed`` (dropped), ``unknown`` (kept active ``keep_for`` more seconds)."""
    where, lease.reservation = lease.reservation, None  # ended, even if the store cannot be written now
    if where:
        end_entry(store, RESERVATIONS, where, lease, outcome, keep_for)


def end_entry(
    store: Store, bank: str, where: tuple[str, str], lease: Lease, outcome: str, keep_for: float | None = None
) -> Any:
    """End ``lease``'s entry ``where`` (``(key, vm)`` in ``bank``) as :func:`finish` describes."""
    host, name = where
    now = time.time()

    def update(old):
        entries = dict((old or {}).get("entries") or {})
        rec = entries.get(name)
        if not rec or rec.get("token") != lease.token:
            raise AbortUpdate
        if outcome == "settled":
            entries[name] = dict(rec, state="settled", settled_at=now)
        elif outcome == "unknown":
            entries[name] = dict(rec, expires=now + float(keep_for or lease.ttl))
        else:
            del entries[name]
        return {"entries": entries} if entries else None

    with contextlib.suppress(AbortUpdate):
        store.transact(bank, host, update)
