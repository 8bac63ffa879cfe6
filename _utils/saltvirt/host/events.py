"""Domain lifecycle events on the Salt bus: the library behind the ``virt_events`` engine (minion side).

A :class:`Watcher` holds one libvirt connection with libvirt's event loop running (the daemon thread of
:mod:`saltvirt.host.conn`), registers domain callbacks (lifecycle, reboot, I/O error, control error, guest
agent; in Salt's scheme also the rest of Salt's types) and hands every event to ``fire(tag, data)`` (the
engine sends it to the master). libvirt calls the callbacks on its event-loop thread; they only queue raw
facts, and the watcher's own thread maps and sends them, so the bookkeeping has one thread.

Tag: ``salt/virt/<host>/domain/<vm>/<event>`` (:func:`tag`; the host is the minion id; characters
outside ``[A-Za-z0-9._+@:-]`` in either name are %-escaped so a name cannot add tag levels or glob
characters). Data (:func:`payload`): ``name``, ``uuid``, ``event``, ``detail``, ``host``, ``time``
(UTC, ISO 8601), plus per event ``direction`` (migrated: in/out), ``device``/``source``/``action``
(io_error), ``reason`` (agent), ``reconciled``/``was`` (see below). Never anything from the domain
XML (console passwords, secrets).

Reconnects: libvirt's close callback (libvirtd restarted, keepalive timeout) or a dead connection
found by the watcher ends the session; it reconnects with exponential backoff (``backoff_min`` ..
``backoff_max`` seconds). What changed while it was disconnected is found by comparing the domains'
states before the loss (the last snapshot, kept up to date by the events) with a snapshot after the
reconnect (:func:`reconcile`); those changes are fired as the matching events with
``reconciled: True`` and ``detail: reconciled``. A VM that stopped and started again in between is
seen by its new domain id. Events are delivered at least once around a reconnect (an event libvirt
queues while the new snapshot is taken may repeat a reconciled one).

The watcher's own sessions are events too: ``salt/virt/<host>/engine/connected`` (``session``: 1, 2,
...; ``reconnect``), sent after the reconciled events, and ``salt/virt/<host>/engine/disconnected``
(``reason``: eof, keepalive, error, connection dead).

Every lifecycle event, reconciled ones too, is also handed to ``on_lifecycle(event, extra)`` whatever is sent (the
``virt_vm`` resources' registration: :class:`saltvirt.host.vmresources.Refresher`).

The inbox between libvirt's thread and the watcher's is bounded (``virt:events:inbox_max`` of the minion
config): a flood of events while sending is slow (the master away, a guest agent flapping) drops the newest
facts instead of growing the minion's memory. Drops are counted, logged at most once a
:data:`DROP_EVERY` and reported as one ``salt/virt/<host>/engine/dropped`` event (``dropped``: how many
since the last report, ``inbox_max``) once the inbox is empty again (or once a :data:`DROP_EVERY` while it
stays full): a reactor that needs what they said re-reads the VMs' states (``virt.vm_state``). libvirt's
close notice is never dropped.
"""

import collections
import datetime
import logging
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import ConfigGet, Conn, Data
from saltvirt.host import query, readiness, saltevents
from saltvirt.host.conn import DEFAULT_OPEN_TIMEOUT, connect, describe, event_loop, resolve_uri

try:
    import libvirt
except ImportError:  # the engine's __virtual__ reports this
    libvirt = None

log = logging.getLogger(__name__)

# libvirt's lifecycle (event type, detail) names -> our event name. Every pair libvirt defines is listed
# (tests/unit/test_events.py checks that against the bindings); an unknown pair maps by its type.
LIFECYCLE = {
    "DEFINED": {"ADDED": "defined", "UPDATED": "defined", "RENAMED": "defined", "FROM_SNAPSHOT": "defined"},
    "UNDEFINED": {"REMOVED": "undefined", "RENAMED": "undefined"},
    "STARTED": {
        "BOOTED": "started",
        "MIGRATED": "migrated",  # the target of an incoming migration
        "RESTORED": "started",
        "FROM_SNAPSHOT": "started",
        "WAKEUP": "started",
    },
    "SUSPENDED": dict.fromkeys(
        (
            "PAUSED",
            "MIGRATED",
            "IOERROR",
            "WATCHDOG",
            "RESTORED",
            "FROM_SNAPSHOT",
            "API_ERROR",
            "POSTCOPY",
            "POSTCOPY_FAILED",
        ),
        "suspended",
    ),
    "RESUMED": dict.fromkeys(("UNPAUSED", "MIGRATED", "FROM_SNAPSHOT", "POSTCOPY", "POSTCOPY_FAILED"), "resumed"),
    "STOPPED": {
        "SHUTDOWN": "stopped",
        "DESTROYED": "stopped",
        "CRASHED": "crashed",  # the guest crashed (on_crash=destroy)
        "MIGRATED": "migrated",  # the source of an outgoing migration
        "SAVED": "stopped",
        "FAILED": "crashed",  # the emulator died (QEMU killed or crashed)
        "FROM_SNAPSHOT": "stopped",
    },
    "SHUTDOWN": dict.fromkeys(("FINISHED", "GUEST", "HOST"), "shutdown"),
    "PMSUSPENDED": dict.fromkeys(("MEMORY", "DISK"), "pmsuspended"),
    "CRASHED": {"PANICKED": "panicked", "CRASHLOADED": "panicked"},  # guest panic (pvpanic, hyperv crash)
}
BY_TYPE = {
    "DEFINED": "defined",
    "UNDEFINED": "undefined",
    "STARTED": "started",
    "SUSPENDED": "suspended",
    "RESUMED": "resumed",
    "STOPPED": "stopped",
    "SHUTDOWN": "shutdown",
    "PMSUSPENDED": "pmsuspended",
    "CRASHED": "panicked",
}
EVENTS = (
    "defined",
    "undefined",
    "started",
    "suspended",
    "resumed",
    "stopped",
    "shutdown",
    "pmsuspended",
    "crashed",
    "panicked",
    "migrated",
    "rebooted",
    "io_error",
    "control_error",
    "agent_connected",
    "agent_disconnected",
)
# the state a VM is in after a lifecycle event type (None: unchanged); the reconcile diff compares these
STATE_AFTER = {
    "STARTED": "running",
    "SUSPENDED": "paused",
    "RESUMED": "running",
    "STOPPED": "shutoff",
    "PMSUSPENDED": "pmsuspended",
    "CRASHED": "crashed",
}
SAFE = "._-+@:"  # kept as they are in a tag part; everything else is %-escaped
DEFAULTS: dict[str, object] = {"backoff_min": 1.0, "backoff_max": 30.0, "events": None, "reconcile": True}
# Salt's libvirt_events scheme beside ours (saltvirt.host.saltevents)
DEFAULTS.update(tags="salt-virt", tag_prefix=saltevents.DEFAULT_PREFIX, filters=None)
# what events are registered on, and Salt's engine's other objects: (register, deregister, event-id constant
# prefix) on a libvirt connection
OBJECT_CALLS = {
    "domain": ("domainEventRegisterAny", "domainEventDeregisterAny", "VIR_DOMAIN_EVENT_ID_"),
    "network": ("networkEventRegisterAny", "networkEventDeregisterAny", "VIR_NETWORK_EVENT_ID_"),
    "pool": ("storagePoolEventRegisterAny", "storagePoolEventDeregisterAny", "VIR_STORAGE_POOL_EVENT_ID_"),
    "nodedev": ("nodeDeviceEventRegisterAny", "nodeDeviceEventDeregisterAny", "VIR_NODE_DEVICE_EVENT_ID_"),
    "secret": ("secretEventRegisterAny", "secretEventDeregisterAny", "VIR_SECRET_EVENT_ID_"),
}
PENDING_MAX = 1000  # events kept for the master while it does not take them (oldest dropped first)
RETRY_EVERY = 5.0  # seconds between delivery attempts of kept events while nothing else happens
INBOX_MAX = 10000  # default of virt:events:inbox_max: facts queued by libvirt's thread (a few MiB at most)
INBOX_LIMIT = 1_000_000
DROP_EVERY = 60.0  # seconds: at most one log warning and one engine/dropped event a flood, then one per this


def _const(name, default=None):
    return getattr(libvirt, name, default) if libvirt is not None else default


def _lifecycle_codes():
    """``{(type code, detail code): (type name, detail name)}`` from the bindings' constants."""
    codes: dict[tuple[int, int | None], tuple[str, str | None]] = {}
    for typ, details in LIFECYCLE.items():
        tcode = _const(f"VIR_DOMAIN_EVENT_{typ}")
        if tcode is None:
            continue
        codes[(tcode, None)] = (typ, None)
        for det in details:
            dcode = _const(f"VIR_DOMAIN_EVENT_{typ}_{det}")
            if dcode is not None:
                codes[(tcode, dcode)] = (typ, det)
    return codes


_CODES = _lifecycle_codes()


def lifecycle(event: int, detail: int) -> tuple[str, str, Data]:
    """libvirt lifecycle ``(event, detail)`` codes -> ``(name, detail, extra)``; unknown codes keep a name
    by their type (or ``lifecycle``) and the number as detail."""
    typ, _ = _CODES.get((event, None), (None, None))
    _, det = _CODES.get((event, detail), (typ, None))
    if typ is None:
        return "lifecycle", f"{event}/{detail}", {}
    name = LIFECYCLE[typ].get(det) or BY_TYPE[typ]
    extra = {}
    if name == "migrated":
        extra["direction"] = "in" if typ == "STARTED" else "out"
    return name, det.lower() if det else str(detail), extra


def _named(prefix, code):
    """The suffix of the bindings' constant ``<prefix><SUFFIX>`` whose value is ``code``, lower case."""
    if libvirt is not None:
        for attr in dir(libvirt):
            if attr.startswith(prefix) and getattr(libvirt, attr) == code:
                return attr[len(prefix) :].lower()
    return str(code)


def io_error(action: int) -> str:
    """IO_ERROR_REASON's action code -> ``none``/``pause``/``report``."""
    return _named("VIR_DOMAIN_EVENT_IO_ERROR_", action)


def agent(state: int, reason: int) -> tuple[str, str]:
    """AGENT_LIFECYCLE ``(state, reason)`` -> ``(event name, reason name)``."""
    connected = state == _const("VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED", 1)
    why = _named("VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_REASON_", reason)
    return ("agent_connected" if connected else "agent_disconnected"), why


# tags and data -------------------------------------------------------------------------------------
def tag_part(text: Any) -> str:
    """One level of an event tag: ``text`` with every character outside ``[A-Za-z0-9._+@:-]`` %-escaped
    (``/``, ``*``, spaces, newlines, ``%`` itself), so a VM or minion name adds no tag level and no glob;
    ``.``/``..`` are escaped whole. Reversible with ``urllib.parse.unquote``."""
    if not isinstance(text, str) or not text:
        raise SaltInvocationError(f"an event tag part must be a non-empty string, not {text!r}")
    part = urllib.parse.quote(text, safe=SAFE)
    return part.replace(".", "%2E") if set(part) == {"."} else part


def tag(host: str, vm: str, event: str) -> str:
    """``salt/virt/<host>/domain/<vm>/<event>`` with both names escaped by :func:`tag_part`."""
    if event not in EVENTS and event != "lifecycle":
        raise SaltInvocationError(f"unknown virt event {event!r} (known: {', '.join(EVENTS)})")
    return f"salt/virt/{tag_part(host)}/domain/{tag_part(vm)}/{event}"


def engine_tag(host: str, what: str) -> str:
    """``salt/virt/<host>/engine/<connected|disconnected|dropped>``: the watcher's own sessions and drops."""
    if what not in ("connected", "disconnected", "dropped"):
        raise SaltInvocationError(f"unknown engine event {what!r}")
    return f"salt/virt/{tag_part(host)}/engine/{what}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def payload(host: str, vm: str, uuid: str, event: str, detail: str, **extra: Any) -> Data:
    """The event data: who, what, when; ``extra`` keys with a None value are left out."""
    data = {"name": vm, "uuid": uuid, "event": event, "detail": detail, "host": host, "time": now()}
    data.update({k: v for k, v in extra.items() if v is not None})
    return data


# snapshots and the reconcile diff ------------------------------------------------------------------
def snapshot(conn: Conn) -> dict[str, Data]:
    """``{uuid: {name, state, id, persistent}}`` of every domain (state names as ``virt.vm_state``)."""
    found = {}
    for dom in conn.listAllDomains(0):
        try:
            state = query.state_name(dom.state()[0])
            found[dom.UUIDString()] = {
                "name": dom.name(),
                "state": state,
                "id": dom.ID() if state != "shutoff" else -1,
                "persistent": bool(dom.isPersistent()),
            }
        except libvirt.libvirtError as exc:  # vanished while listing: it is simply not there
            log.debug("virt_events: skipping a domain while taking a snapshot: %s", exc)
    return found


ACTIVE = ("running", "paused", "pmsuspended", "blocked", "shutdown")


def _transition(was, now_state):
    """The event for a VM seen in ``was`` state before and ``now_state`` after, or None."""
    if was == now_state:
        return None
    if now_state == "crashed":
        return "crashed"
    if now_state == "shutoff":
        return "stopped"
    if now_state == "paused":
        return "suspended"
    if now_state == "pmsuspended":
        return "pmsuspended"
    if now_state in ACTIVE:
        return "resumed" if was in ("paused", "pmsuspended") else "started"
    return None


def reconcile(before: Mapping[str, Data], after: Mapping[str, Data]) -> list[tuple[str, Any, str, Any]]:
    """The events that explain how ``before`` became ``after`` (both from :func:`snapshot`), in order:
    ``[(uuid, name, event, was)]``. New VMs are ``defined`` (and ``started`` when running), vanished
    ones ``stopped`` (when they ran) and ``undefined``; a VM running under a new domain id stopped
    and started again. Sorted by VM name (vanished and changed ones first, then new ones)."""
    out = []
    for uuid, old in sorted(before.items(), key=lambda item: (item[1]["name"], item[0])):
        new = after.get(uuid)
        if new is None:
            if old["state"] in ACTIVE:
                out.append((uuid, old["name"], "stopped", old["state"]))
            out.append((uuid, old["name"], "undefined", old["state"]))
            continue
        if old["state"] in ACTIVE and new["state"] in ACTIVE and old.get("id") != new.get("id"):
            out += [(uuid, new["name"], "stopped", old["state"]), (uuid, new["name"], "started", "shutoff")]
            continue
        event = _transition(old["state"], new["state"])
        if event:
            out.append((uuid, new["name"], event, old["state"]))
    for uuid, new in sorted(after.items(), key=lambda item: (item[1]["name"], item[0])):
        if uuid not in before:
            out.append((uuid, new["name"], "defined", None))
            if new["state"] in ACTIVE:
                out.append((uuid, new["name"], "started", "shutoff"))
    return out


def settings(config: Mapping[str, Any] | None) -> Data:
    """Engine options -> checked settings (``backoff_min``/``backoff_max`` seconds, ``events`` filter,
    ``reconcile``)."""
    config = {k: v for k, v in (config or {}).items() if not str(k).startswith("__")}
    unknown = sorted(set(config) - set(DEFAULTS) - {"connection"})
    if unknown:
        raise SaltInvocationError(
            f"virt_events: unknown option(s) {', '.join(unknown)} (known: connection, {', '.join(sorted(DEFAULTS))})"
        )
    out = dict(DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS and v is not None})
    for key in ("backoff_min", "backoff_max"):
        out[key] = validate.seconds(out[key], f"virt_events: {key}")
    out["backoff_max"] = max(out["backoff_max"], out["backoff_min"])
    if out["events"] is not None:
        wanted = [out["events"]] if isinstance(out["events"], str) else list(out["events"])
        bad = sorted(set(wanted) - set(EVENTS))
        if bad:
            raise SaltInvocationError(f"virt_events: unknown event(s) {', '.join(bad)} (known: {', '.join(EVENTS)})")
        out["events"] = set(wanted)
    out["reconcile"] = out["reconcile"] not in (False, "false", "False", 0, "0")
    out.update(saltevents.settings(out.pop("tags"), out.pop("tag_prefix"), out.pop("filters")))
    return out


def inbox_max(value: Any) -> int:
    """``virt:events:inbox_max`` checked: how many facts the inbox holds before it drops the newest."""
    return validate.int_in(value, "virt:events:inbox_max in the minion config", 1, INBOX_LIMIT)


class Drops:
    """Facts dropped because the inbox was full: counted on libvirt's thread (a warning at the first, then at
    most once a DROP_EVERY, with the count), taken by the watcher's thread for one ``engine/dropped`` event."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = self.unreported = self.unlogged = 0
        self.logged_at: float | None = None
        self.reported_at = time.monotonic()

    def add(self, bound: int) -> None:
        with self.lock:
            self.total, self.unreported, self.unlogged = self.total + 1, self.unreported + 1, self.unlogged + 1
            if self.logged_at is not None and time.monotonic() - self.logged_at < DROP_EVERY:
                return
            count, self.unlogged, self.logged_at = self.unlogged, 0, time.monotonic()
        log.warning(
            "virt_events: the inbox is full (virt:events:inbox_max: %d, events are not sent fast enough): "
            "%d event(s) dropped (%d in all); the master gets an engine/dropped event",
            bound,
            count,
            self.total,
        )

    def take(self, inbox_empty: bool) -> int:
        """How many to report now (0: nothing, or not yet): once the inbox is empty, else once a DROP_EVERY."""
        with self.lock:
            if not self.unreported or (not inbox_empty and time.monotonic() - self.reported_at < DROP_EVERY):
                return 0
            count, self.unreported, self.reported_at = self.unreported, 0, time.monotonic()
            return count


# the watcher ---------------------------------------------------------------------------------------
class Watcher:
    """One hypervisor's libvirt events -> ``fire(tag, data)``, reconnecting after libvirtd goes away.

    ``connect`` is a context-manager factory yielding a libvirt connection (the engine passes
    :func:`saltvirt.host.conn.connect` with the configured URI, open timeout and keepalive)."""

    def __init__(
        self, host, connect, fire, options=None, on_defined=None, inbox_max=INBOX_MAX, on_lifecycle=None, on_beat=None
    ):
        self.host, self.connect, self.fire = host, connect, fire
        self.on_beat = on_beat  # on_beat(connected): the engine's heartbeat (saltvirt.host.readiness.engine_beat)
        self.beat_at = 0.0
        self.on_defined = on_defined  # called when a definition is added or changed (virt.capacity's cache)
        # called with (event, extra) for every lifecycle event, reconciled ones too, whatever the engine sends
        # (the virt_vm resources' registration: saltvirt.host.vmresources.Refresher)
        self.on_lifecycle = on_lifecycle
        self.options = settings(options)
        # (kind, who, args) facts; bounded: libvirt's thread never waits, it drops
        self.inbox: queue.Queue[tuple[str, Any, tuple[Any, ...]]] = queue.Queue(maxsize=inbox_max)
        self.drops = Drops()
        self.closed = None  # libvirt's close notice when it came with the inbox full: (reason,)
        self.known = None  # the last snapshot, kept current by the events: {uuid: {name, state, id, ...}}
        self.stop = threading.Event()
        self.connected = threading.Event()  # set while a session runs (tests and the engine's log)
        self.sessions = 0
        # (tag, data) the master did not take yet
        self.pending: collections.deque[tuple[str, Data]] = collections.deque(maxlen=PENDING_MAX)
        self.uri = None  # the connection's URI (Salt's libvirt_events tags name it)
        self.last_try = 0.0

    # libvirt's callbacks (event-loop thread): queue raw facts only ------------------------------
    def _queue(self, fact):
        """Queue one fact without waiting (this is libvirt's event-loop thread); with the inbox full it is
        dropped and counted, except the close notice, which the session finds once the inbox is empty."""
        try:
            self.inbox.put_nowait(fact)
        except queue.Full:
            if fact[0] == "closed":
                self.closed = fact[2]
            else:
                self.drops.add(self.inbox.maxsize)

    def _on_lifecycle(self, _conn, dom, event, detail, _opaque):
        self._queue(("lifecycle", self._who(dom), (event, detail)))

    def _on_reboot(self, _conn, dom, _opaque):
        self._queue(("rebooted", self._who(dom), ()))

    def _on_io_error(self, _conn, dom, src_path, dev_alias, action, reason, _opaque):
        self._queue(("io_error", self._who(dom), (src_path, dev_alias, action, reason)))

    def _on_control_error(self, _conn, dom, _opaque):
        self._queue(("control_error", self._who(dom), ()))

    def _on_agent(self, _conn, dom, state, reason, _opaque):
        self._queue(("agent", self._who(dom), (state, reason)))

    def _extra_callback(self, event_type):
        """The callback of one of Salt's other domain event types (``saltevents.DOMAIN_EXTRA``): queues who
        and libvirt's arguments between the domain and the opaque, mapped on the watcher's thread."""
        return lambda _conn, dom, *args: self._queue(("extra", event_type, (self._who(dom), args[:-1])))

    def on_close(self, _conn: Conn, reason: int, _opaque: Any) -> None:
        """libvirt's connection close callback (libvirtd gone, keepalive timeout, ...)."""
        self._queue(("closed", None, (reason,)))

    def _object_callback(self, obj, event_type):
        """The callback of a network/pool/nodedev/secret event: queues ``(object, type)`` and who it is."""

        def ident(thing):
            if obj == "nodedev":
                return {"name": thing.name()}
            if obj == "secret":  # its UUID only: never its value or usage
                return {"uuid": thing.UUIDString()}
            return {"name": thing.name(), "uuid": thing.UUIDString()}

        if event_type == "lifecycle":
            return lambda _conn, thing, event, _detail, _opaque: self._queue(
                ("object", (obj, event_type), (ident(thing), event))
            )
        return lambda _conn, thing, _opaque: self._queue(("object", (obj, event_type), (ident(thing), None)))

    @staticmethod
    def _who(dom):
        return dom.name(), dom.UUIDString(), dom.ID()

    # mapping and sending (the watcher's thread) -------------------------------------------------
    def _send(self, name, uuid, event, detail, **extra):
        wanted = self.options["events"]
        if wanted is not None and event not in wanted:
            return
        self._deliver(tag(self.host, name, event), payload(self.host, name, uuid, event, detail, **extra))

    def _engine(self, what, **data):
        self._deliver(engine_tag(self.host, what), dict(data, host=self.host, event=what, time=now()))

    def _report_drops(self):
        count = self.drops.take(self.inbox.empty())
        if count:
            self._engine("dropped", dropped=count, inbox_max=self.inbox.maxsize)

    def _deliver(self, tag_, data):
        """Send in order; what the master does not take is kept (up to PENDING_MAX) and sent later."""
        self.pending.append((tag_, data))
        if len(self.pending) == 1 or time.monotonic() - self.last_try > RETRY_EVERY:
            self.flush()

    def flush(self) -> None:
        """Send the kept events, oldest first; stop at the first the master does not take."""
        self.last_try = time.monotonic()
        sent = 0
        while self.pending:
            tag_, data = self.pending[0]
            try:
                self.fire(tag_, data)
            except Exception as exc:  # noqa: BLE001 - kept and retried; the watcher goes on
                log.warning(
                    "virt_events: the master did not take %s (%s); %d event(s) kept for a retry",
                    tag_,
                    exc,
                    len(self.pending),
                )
                break
            self.pending.popleft()
            sent += 1
        if sent > 1:
            log.info("virt_events: sent %d events the master had not taken before", sent)

    def _track(self, name, uuid, dom_id, typ):
        if self.known is None:
            return
        if typ == "UNDEFINED":
            self.known.pop(uuid, None)
            return
        # a VM first seen starting without a definition is transient (createXML): it is gone once stopped
        new = {"name": name, "state": "shutoff", "id": -1, "persistent": typ == "DEFINED"}
        entry = self.known.setdefault(uuid, new)
        entry["name"] = name
        if typ == "DEFINED":
            entry["persistent"] = True
        if STATE_AFTER.get(typ) == "shutoff" and not entry["persistent"]:
            self.known.pop(uuid, None)
        elif STATE_AFTER.get(typ):
            entry["state"] = STATE_AFTER[typ]
            entry["id"] = dom_id if entry["state"] != "shutoff" else -1

    def _send_salt(self, who: Any, kind: str, args: Any) -> None:
        """The same event in Salt's libvirt_events scheme (engine option ``tags``)."""
        event_type = {"rebooted": "reboot", "agent": "agent_lifecycle"}.get(kind, kind)
        if self.options["tags"] == "salt-virt" or not saltevents.wanted(self.options, event_type):
            return
        uri = self.uri or ""
        if kind == "lifecycle":
            typ, det = _CODES.get(tuple(args), _CODES.get((args[0], None), (None, None)))
            data = saltevents.lifecycle(uri, who, typ, det)
        elif kind == "io_error":
            src_path, dev_alias, action, reason = args
            data = saltevents.data(uri, who, event_type, srcPath=src_path, dev=dev_alias, action=io_error(action))
            data["reason"] = reason
        elif kind == "agent":
            state, reason = args
            data = saltevents.data(uri, who, event_type, state=agent(state, reason)[0].removeprefix("agent_"))
            data["reason"] = _named("VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_REASON_", reason).replace("_", " ")
        else:
            data = saltevents.data(uri, who, event_type)
        self._deliver(saltevents.tag(self.options["tag_prefix"], uri, event_type), data)

    def _send_object(self, what: Any, args: Any) -> None:
        """A network/pool/nodedev/secret event in Salt's libvirt_events scheme (registered only for it)."""
        (obj, event_type), (ident, code) = what, args
        uri = self.uri or ""
        name = saltevents.lifecycle_name(libvirt, obj, code) if code is not None else None
        data = saltevents.object_data(uri, obj, event_type, ident, name)
        self._deliver(saltevents.tag(self.options["tag_prefix"], uri, event_type, obj), data)

    def _send_extra(self, event_type: str, args: Any) -> None:
        """One of Salt's other domain events, in its scheme only (registered only for it). Relayed as data:
        nothing in it (a guest's or tenant's values) changes what the watcher tracks or does."""
        who, cb_args = args
        uri = self.uri or ""
        try:
            data = saltevents.extra_data(uri, who, event_type, cb_args)
        except (TypeError, ValueError, AttributeError) as exc:  # arguments of another libvirt: skip, go on
            log.warning("virt_events: could not map a %s event of %s: %s", event_type, who[0], exc)
            return
        self._deliver(saltevents.tag(self.options["tag_prefix"], uri, event_type), data)

    def handle(self, kind: str, who: Any, args: Any) -> bool:
        """Map one queued fact to its event and send it; returns False when the connection closed."""
        if kind == "closed":
            return False
        if kind == "object":
            self._send_object(who, args)
            return True
        if kind == "extra":
            self._send_extra(who, args)
            return True
        name, uuid, dom_id = who
        self._send_salt(who, kind, args)
        if kind == "lifecycle":
            event, detail = args
            typ = _CODES.get((event, None), (None, None))[0]
            ev_name, det, extra = lifecycle(event, detail)
            self._track(name, uuid, dom_id, typ)
            if typ == "DEFINED" and self.on_defined is not None:
                self.on_defined()
            self._lifecycle_hook(ev_name, extra)
            if self.options["tags"] != "libvirt_events":  # not Salt's tags only
                self._send(name, uuid, ev_name, det, **extra)
            return True
        if self.options["tags"] == "libvirt_events":  # Salt's tags only
            return True
        if kind == "io_error":
            src_path, dev_alias, action, reason = args
            self._send(
                name, uuid, "io_error", reason or "unknown", device=dev_alias, source=src_path, action=io_error(action)
            )
        elif kind == "agent":
            ev_name, why = agent(*args)
            self._send(name, uuid, ev_name, why)
        else:
            self._send(name, uuid, kind, kind)
        return True

    # sessions --------------------------------------------------------------------------------------
    def _register(self, conn):
        """Register the callbacks; returns ``[(deregister method, callback id)]``."""
        ours: list[tuple[str, Callable[..., None]]] = [
            ("LIFECYCLE", self._on_lifecycle),
            ("REBOOT", self._on_reboot),
            ("IO_ERROR_REASON", self._on_io_error),
            ("CONTROL_ERROR", self._on_control_error),
            ("AGENT_LIFECYCLE", self._on_agent),
        ]
        prefix = OBJECT_CALLS["domain"][2]
        # (what, object, event-id constants: the first the bindings have, callback)
        wanted: list[tuple[str, str, tuple[str, ...], Callable[..., None]]] = [
            (f"{prefix}{ev}", "domain", (f"{prefix}{ev}",), cb) for ev, cb in ours
        ]
        wanted += [  # Salt's scheme only
            (f"domain/{ev}", "domain", saltevents.DOMAIN_EXTRA[ev][0], self._extra_callback(ev))
            for ev in saltevents.domain_extra_wanted(self.options)
        ]
        wanted += [  # Salt's scheme only
            (f"{obj}/{ev}", obj, (f"{OBJECT_CALLS[obj][2]}{ev.upper()}",), self._object_callback(obj, ev))
            for obj, ev in saltevents.objects_wanted(self.options)
        ]
        ids = []
        for what, obj, consts, callback in wanted:
            register, deregister, _prefix = OBJECT_CALLS[obj]
            const = next((c for c in consts if hasattr(libvirt, c)), None)
            try:
                if const is None:
                    raise AttributeError(f"the bindings have no {consts[0]}")
                ids.append((deregister, getattr(conn, register)(None, getattr(libvirt, const), callback, None)))
            except (AttributeError, libvirt.libvirtError) as exc:  # older bindings or daemon: the others still work
                log.info("virt_events: %s events not available: %s", what, exc)
        try:
            conn.registerCloseCallback(self.on_close, None)
        except libvirt.libvirtError as exc:  # then a dead connection is found by isAlive()
            log.info("virt_events: no close callback: %s", exc.get_error_message())
        return ids

    def _reconcile(self, after):
        before, self.known = self.known, after
        if before is None:
            self._lifecycle_hook("connected", {})  # the first session: libvirtd reached
            return
        for uuid, name, event, was in reconcile(before, after):
            self._lifecycle_hook(event, {})  # the registration follows, reconcile option or not
            if self.options["reconcile"]:
                self._send(name, uuid, event, "reconciled", reconciled=True, was=was)

    def _lifecycle_hook(self, event, extra):
        if self.on_lifecycle is not None:
            try:
                self.on_lifecycle(event, extra)
            except Exception as exc:  # noqa: BLE001 - the events go on being sent whatever the hook met
                log.warning("virt_events: the lifecycle hook failed on a %s event: %s", event, exc)

    def session(self, conn: Conn) -> None:
        """Register, reconcile, then send events until the connection closes or :attr:`stop` is set."""
        ids = self._register(conn)
        self.uri = conn.getURI()
        self._reconcile(snapshot(conn))
        self.sessions += 1
        self._engine("connected", session=self.sessions, reconnect=self.sessions > 1)
        self.connected.set()
        why = "stopped"
        try:
            while not self.stop.is_set():
                self._beat(True, readiness.BEAT_EVERY)
                try:
                    kind, who, args = self.inbox.get(timeout=1)
                except queue.Empty:
                    self._report_drops()
                    if self.pending and time.monotonic() - self.last_try > RETRY_EVERY:
                        self.flush()
                    if self.closed is not None:  # it came with the inbox full: after what was queued before
                        kind, who, args = "closed", None, self.closed
                    elif not conn.isAlive():
                        why = "connection dead"
                        return
                    else:
                        continue
                if not self.handle(kind, who, args):
                    why = _named("VIR_CONNECT_CLOSE_REASON_", args[0])
                    return
                self._report_drops()
        finally:
            self.connected.clear()
            self._beat(False)
            if why != "stopped":
                log.info("virt_events: libvirt connection lost (%s)", why)
                self._engine("disconnected", session=self.sessions, reason=why)
            for deregister, cb_id in ids:
                try:
                    getattr(conn, deregister)(cb_id)
                except libvirt.libvirtError:
                    log.debug("virt_events: could not deregister callback %s (connection gone)", cb_id)
            try:
                conn.unregisterCloseCallback()
            except libvirt.libvirtError:
                log.debug("virt_events: could not unregister the close callback (connection gone)")

    def _beat(self, connected: bool, every: float = 0.0) -> None:
        if self.on_beat is None or time.monotonic() - self.beat_at < every:
            return
        self.beat_at = time.monotonic()
        try:
            self.on_beat(connected)
        except OSError as exc:  # a full disk must not stop the events
            log.warning("virt_events: could not write the engine's heartbeat: %s", exc)

    def run(self) -> None:
        """Sessions until :attr:`stop` is set, reconnecting with exponential backoff."""
        event_loop()  # before the first open: libvirt delivers events only through a registered loop
        delay = self.options["backoff_min"]
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with self.connect() as conn:
                    self.session(conn)
            except Exception as exc:  # noqa: BLE001 - libvirtd down or refusing: retry after the backoff
                log.warning("virt_events: libvirt unavailable (%s); retrying in %.0f s", exc, delay)
            self._drain()
            self.closed = None  # the ended session's
            if self.stop.is_set():
                break
            if time.monotonic() - started > self.options["backoff_max"]:
                delay = self.options["backoff_min"]  # it ran a while: start the backoff afresh
            self.stop.wait(delay)
            delay = min(delay * 2, self.options["backoff_max"])

    def _drain(self):
        """Send what the last session queued before it ended (the close notice itself is dropped)."""
        while True:
            try:
                kind, who, args = self.inbox.get_nowait()
            except queue.Empty:
                self._report_drops()
                return
            if kind != "closed":
                self.handle(kind, who, args)


def serve(
    host: str,
    fire: Any,
    config_get: ConfigGet,
    connection: str | None,
    options: Mapping[str, Any] | None,
    on_defined: Any = None,
    engine: str = "virt_events",
    on_lifecycle: Any = None,
    beat_dir: str | None = None,
) -> None:
    """An engine's body: watch this hypervisor's libvirt (the engine's own connection option, else
    ``virt:connection``, with its open timeout and keepalive; the inbox bounded by ``virt:events:inbox_max``)
    and hand its events to ``fire`` until the minion stops. A bad option is logged once and the engine idles
    (Salt would restart a failing engine at once, logging the same error in a loop). ``beat_dir``: the minion's
    cachedir, where the engine's heartbeat goes (:func:`saltvirt.host.readiness.engine_beat`)."""
    uri = connection or resolve_uri(config_get)
    open_timeout = config_get("virt:connection:open_timeout", DEFAULT_OPEN_TIMEOUT)
    keepalive = config_get("virt:connection:keepalive", None)
    try:
        watcher = Watcher(
            host,
            lambda: connect(uri, open_timeout=open_timeout, keepalive=keepalive),
            fire,
            options,
            on_defined=on_defined,
            inbox_max=inbox_max(config_get("virt:events:inbox_max", INBOX_MAX)),
            on_lifecycle=on_lifecycle,
            on_beat=(lambda up: readiness.engine_beat(beat_dir, engine, up)) if beat_dir else None,
        )
    except Exception as exc:  # noqa: BLE001 - a configuration error: say it once, do not crash-loop
        log.error("%s engine not started: %s", engine, exc)
        while True:
            time.sleep(3600)
    log.info("%s: watching %s for %s", engine, describe(uri), host)
    watcher.run()
