"""saltvirt.host.events: libvirt's event codes -> event names, tags (odd names escaped), the reconcile diff,
and the watcher on libvirt's test driver (live lifecycle events on test:///default; a reconnect to a
file-based test:/// node whose file changed meanwhile, i.e. what happened while disconnected)."""

import contextlib
import queue
import re
import threading
import time
import urllib.parse
import uuid

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import conn as vconn
from saltvirt.host import events, readiness

WAIT = 30  # seconds: a bound for the watcher's thread, not a speed check


def test_every_lifecycle_code_of_the_bindings_is_mapped():
    types = "|".join(sorted(events.LIFECYCLE, key=len, reverse=True))
    found = {}
    for attr in dir(libvirt):
        match = re.fullmatch(rf"VIR_DOMAIN_EVENT_({types})_(\w+)", attr)
        if match:
            found.setdefault(match.group(1), set()).add(match.group(2))
    assert set(found) == set(events.LIFECYCLE)
    for typ, details in found.items():
        assert details == set(events.LIFECYCLE[typ]), typ
    assert set(events.BY_TYPE) == set(events.LIFECYCLE)
    assert {name for d in events.LIFECYCLE.values() for name in d.values()} <= set(events.EVENTS)


@pytest.mark.parametrize(
    ("typ", "detail", "expected"),
    [
        ("STARTED", "BOOTED", ("started", "booted", {})),
        ("STOPPED", "DESTROYED", ("stopped", "destroyed", {})),
        ("STOPPED", "SHUTDOWN", ("stopped", "shutdown", {})),
        ("STOPPED", "FAILED", ("crashed", "failed", {})),  # QEMU killed
        ("STOPPED", "CRASHED", ("crashed", "crashed", {})),
        ("CRASHED", "PANICKED", ("panicked", "panicked", {})),  # guest panic
        ("STARTED", "MIGRATED", ("migrated", "migrated", {"direction": "in"})),
        ("STOPPED", "MIGRATED", ("migrated", "migrated", {"direction": "out"})),
        ("SUSPENDED", "IOERROR", ("suspended", "ioerror", {})),
        ("RESUMED", "UNPAUSED", ("resumed", "unpaused", {})),
        ("UNDEFINED", "REMOVED", ("undefined", "removed", {})),
    ],
)
def test_lifecycle_mapping(typ, detail, expected):
    code = getattr(libvirt, f"VIR_DOMAIN_EVENT_{typ}")
    assert events.lifecycle(code, getattr(libvirt, f"VIR_DOMAIN_EVENT_{typ}_{detail}")) == expected


def test_unknown_codes_keep_a_name():
    assert events.lifecycle(libvirt.VIR_DOMAIN_EVENT_STOPPED, 99) == ("stopped", "99", {})
    assert events.lifecycle(77, 3) == ("lifecycle", "77/3", {})


def test_io_error_and_agent_names():
    assert events.io_error(libvirt.VIR_DOMAIN_EVENT_IO_ERROR_PAUSE) == "pause"
    assert events.io_error(libvirt.VIR_DOMAIN_EVENT_IO_ERROR_REPORT) == "report"
    assert events.agent(
        libvirt.VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED,
        libvirt.VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_REASON_CHANNEL,
    ) == ("agent_connected", "channel")
    assert events.agent(
        libvirt.VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_DISCONNECTED,
        libvirt.VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_REASON_DOMAIN_STARTED,
    ) == ("agent_disconnected", "domain_started")


# tags ---------------------------------------------------------------------------------------------
def test_tag_of_plain_names():
    assert events.tag("hyper1", "web1", "started") == "salt/virt/hyper1/domain/web1/started"
    assert events.tag("hv-1.example.com", "db_2.x", "crashed") == "salt/virt/hv-1.example.com/domain/db_2.x/crashed"


@pytest.mark.parametrize(
    "name",
    ["a/b", "../x", "..", ".", "web 1", "web*", "x?[y]", "line\nbreak", "100%", "tab\there", "ünï", "a/../../salt/key"],
)
def test_odd_names_cannot_add_tag_levels_or_globs(name):
    tag = events.tag("hyper1", name, "stopped")
    parts = tag.split("/")
    assert len(parts) == 6 and parts[:4] == ["salt", "virt", "hyper1", "domain"] and parts[5] == "stopped"
    assert urllib.parse.unquote(parts[4]) == name  # reversible
    assert re.fullmatch(r"[A-Za-z0-9._+@:%-]+", parts[4]) and parts[4] not in (".", "..")
    assert not set("*?[]/ \n") & set(parts[4])


def test_hostile_host_and_bad_parts_are_refused_or_escaped():
    assert events.tag("h/x*", "vm", "started") == "salt/virt/h%2Fx%2A/domain/vm/started"
    for bad in ("", None, 5):
        with pytest.raises(SaltInvocationError, match="non-empty string"):
            events.tag("hyper1", bad, "started")
    with pytest.raises(SaltInvocationError, match="unknown virt event 'exploded'"):
        events.tag("hyper1", "vm", "exploded")


def test_payload_holds_who_what_when_only():
    data = events.payload("hyper1", "web1", "u-1", "io_error", "enospc", device="vda", source=None)
    assert set(data) == {"name", "uuid", "event", "detail", "host", "time", "device"}
    assert (data["name"], data["uuid"], data["event"], data["detail"], data["host"]) == (
        "web1",
        "u-1",
        "io_error",
        "enospc",
        "hyper1",
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", data["time"])


# reconcile ----------------------------------------------------------------------------------------
def vm(name, state, dom_id=-1):
    return {"name": name, "state": state, "id": dom_id, "persistent": True}


def test_reconcile_explains_every_change():
    before = {
        "u1": vm("a", "running", 1),
        "u2": vm("b", "shutoff"),
        "u3": vm("c", "running", 3),
        "u4": vm("d", "paused", 4),
        "u5": vm("e", "running", 5),
        "u6": vm("f", "running", 6),
        "u7": vm("g", "shutoff"),
    }
    after = {
        "u1": vm("a", "shutoff"),  # stopped
        "u2": vm("b", "running", 9),  # started
        "u4": vm("d", "running", 4),  # resumed
        "u5": vm("e", "running", 12),  # restarted: new domain id
        "u6": vm("f", "running", 6),  # unchanged
        "u7": vm("g", "crashed"),
        "u8": vm("h", "running", 13),  # new
    }
    assert events.reconcile(before, after) == [
        ("u1", "a", "stopped", "running"),
        ("u2", "b", "started", "shutoff"),
        ("u3", "c", "stopped", "running"),  # gone while running
        ("u3", "c", "undefined", "running"),
        ("u4", "d", "resumed", "paused"),
        ("u5", "e", "stopped", "running"),
        ("u5", "e", "started", "shutoff"),
        ("u7", "g", "crashed", "shutoff"),
        ("u8", "h", "defined", None),
        ("u8", "h", "started", "shutoff"),
    ]
    assert events.reconcile(after, after) == []


def test_settings_are_checked():
    assert events.settings({"backoff_min": "2", "events": "crashed"})["events"] == {"crashed"}
    assert events.settings({"backoff_min": 60, "backoff_max": 5})["backoff_max"] == 60
    with pytest.raises(SaltInvocationError, match="unknown option.*bakoff"):
        events.settings({"bakoff": 1})
    with pytest.raises(SaltInvocationError, match="unknown event.*boom"):
        events.settings({"events": ["started", "boom"]})
    with pytest.raises(SaltInvocationError, match="backoff_min must be a number of seconds above 0"):
        events.settings({"backoff_min": 0})


# the watcher on libvirt's test driver -------------------------------------------------------------
class Bus:
    """What the engine would send to the master: ``sent`` (domain events) and ``engine`` (its sessions)."""

    def __init__(self):
        self.sent, self.engine, self.lock = [], [], threading.Lock()

    def __call__(self, tag, data):
        with self.lock:
            (self.sent if "/domain/" in tag else self.engine).append((tag, data))

    def wait(self, pred, what):
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with self.lock:
                found = [d for t, d in self.sent if pred(t, d)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {WAIT} s; sent: {self.sent}")


def start(watcher):
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    assert watcher.connected.wait(WAIT), "the watcher did not connect"
    return thread


WAKE = ("wake", None, None)  # a no-op fact: only this file's stop() puts it, and only its handle knows it


def stop(watcher, thread):
    """Set the watcher's :attr:`stop`, then wake a session blocked on its inbox (``inbox.get(timeout=1)``): it
    sees the flag now instead of at its next 1 s tick, most of each live test's time. What stops the thread is
    still the flag: a loop that ignored it would run on and fail the join below."""
    handle = watcher.handle
    watcher.handle = lambda kind, who, args: True if (kind, who, args) == WAKE else handle(kind, who, args)
    watcher.stop.set()
    with contextlib.suppress(queue.Full):  # a full inbox wakes it anyway
        watcher.inbox.put_nowait(WAKE)
    thread.join(WAIT)
    assert not thread.is_alive()


def test_live_lifecycle_events_on_the_test_driver():
    bus = Bus()
    watcher = events.Watcher("hyper-test", lambda: vconn.connect("test:///default"), bus, {"backoff_min": 0.1})
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    try:
        dom.suspend()
        dom.resume()
        dom.destroy()
        dom.create()
        started = bus.wait(lambda t, d: t == "salt/virt/hyper-test/domain/test/started", "started event")
        assert started[0]["detail"] == "booted" and started[0]["uuid"] == dom.UUIDString()
        sent = [(t.rsplit("/", 1)[-1], d["detail"]) for t, d in bus.sent]
        assert sent == [
            ("suspended", "paused"),
            ("resumed", "unpaused"),
            ("stopped", "destroyed"),
            ("started", "booted"),
        ]
        assert all(d["host"] == "hyper-test" and d["name"] == "test" for _t, d in bus.sent)
        assert watcher.known[dom.UUIDString()]["state"] == "running"
    finally:
        stop(watcher, thread)
        if not dom.isActive():
            dom.create()
        conn.close()


def test_a_connected_watcher_beats_and_says_when_it_lost_libvirt(tmp_path):
    """The heartbeat salt-run virt.roll waits for after a reboot (virt.host_ready): written while the watcher holds
    a libvirt connection, and marked disconnected when its session ends."""
    beat = lambda up: readiness.engine_beat(str(tmp_path), "virt_events", up)  # noqa: E731
    watcher = events.Watcher("h1", lambda: vconn.connect("test:///default"), Bus(), {"backoff_min": 0.1}, on_beat=beat)
    assert readiness.engine_state(str(tmp_path))["ok"] is False  # not beaten yet
    thread = start(watcher)
    try:
        assert watcher.connected.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while not readiness.engine_state(str(tmp_path))["ok"]:
            assert time.monotonic() < deadline, readiness.engine_state(str(tmp_path))
            time.sleep(0.05)
    finally:
        stop(watcher, thread)
    assert readiness.engine_state(str(tmp_path)) == {
        "ok": False,
        "why": "the events engine (virt_events) runs but has lost libvirt",
    }


TRANSIENT = "<domain type='test'><name>evtr1</name><memory>65536</memory><os><type>hvm</type></os></domain>"


def test_known_states_follow_the_events():
    """What the reconcile diff starts from after a loss: persistent VMs with their last state, transient
    ones (started without a definition) forgotten once they stop."""
    bus = Bus()
    watcher = events.Watcher("h1", lambda: vconn.connect("test:///default"), bus, {"backoff_min": 0.1})
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    try:
        transient = conn.createXML(TRANSIENT, 0)
        uuid_ = transient.UUIDString()
        bus.wait(lambda t, d: t.endswith("/evtr1/started"), "transient started")
        assert watcher.known[uuid_]["state"] == "running" and watcher.known[uuid_]["persistent"] is False
        transient.destroy()
        dom.suspend()
        bus.wait(lambda t, d: t.endswith("/test/suspended"), "suspended")
        assert uuid_ not in watcher.known  # a stopped transient VM no longer exists
        assert watcher.known[dom.UUIDString()]["state"] == "paused"
    finally:
        stop(watcher, thread)
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            dom.resume()
        conn.close()


def test_event_filter():
    bus = Bus()
    opts = {"events": ["started"], "backoff_min": 0.1}
    watcher = events.Watcher("h1", lambda: vconn.connect("test:///default"), bus, opts)
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    try:
        dom.destroy()
        dom.create()
        bus.wait(lambda t, d: d["event"] == "started", "started event")
        assert [d["event"] for _t, d in bus.sent] == ["started"]
    finally:
        stop(watcher, thread)
        conn.close()


def test_events_the_master_does_not_take_are_kept_and_sent_in_order(monkeypatch):
    """The delivery function raises while the master is away (mastersend.MasterSender does; it needs a master, see
    tests/integration/test_events.py): events are kept, then sent oldest first; the oldest are dropped
    beyond PENDING_MAX."""
    master_up, got = [False], []

    def fire(tag, data):
        if not master_up[0]:
            raise RuntimeError("no master took the event")
        got.append(data["name"])

    watcher = events.Watcher("h1", None, fire)
    for name in ("a", "b", "c"):
        watcher._send(name, "u", "started", "booted")
    assert got == [] and [d["name"] for _t, d in watcher.pending] == ["a", "b", "c"]
    master_up[0] = True
    watcher.flush()
    assert got == ["a", "b", "c"] and not watcher.pending
    master_up[0] = False
    monkeypatch.setattr(events, "PENDING_MAX", 2)
    watcher = events.Watcher("h1", None, fire)
    for name in ("x", "y", "z"):
        watcher._send(name, "u", "stopped", "destroyed")
    assert [d["name"] for _t, d in watcher.pending] == ["y", "z"]


NODE = """<node xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>
  <cpu><mhz>2400</mhz><model>test-cpu</model><active>4</active><max>4</max><nodes>1</nodes><sockets>1</sockets>
  <cores>4</cores><threads>1</threads></cpu>
  <memory>4194304</memory>
{domains}
</node>"""
DOMAIN = """  <domain type='test'>
    <name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>64</memory><vcpu>1</vcpu>
    <os><type arch='x86_64'>hvm</type></os><devices/>
    <test:runstate>{state}</test:runstate>
  </domain>"""
RUNNING, SHUTOFF = 1, 5


def write_node(path, doms):
    path.write_text(NODE.format(domains="\n".join(DOMAIN.format(name=n, uuid=u, state=s) for n, u, s in doms)))


def test_reconnect_fires_what_changed_while_disconnected(tmp_path):
    ids = {n: str(uuid.uuid4()) for n in ("keep", "fa", "fb", "fc")}
    node = tmp_path / "node.xml"
    write_node(node, [("keep", ids["keep"], RUNNING), ("fa", ids["fa"], RUNNING), ("fb", ids["fb"], RUNNING)])
    bus = Bus()
    opts = {"backoff_min": 0.1, "backoff_max": 0.2}
    watcher = events.Watcher("hyper-test", lambda: vconn.connect(f"test://{node}"), bus, opts)
    thread = start(watcher)
    try:
        assert watcher.sessions == 1 and bus.sent == []  # the first snapshot is the baseline: no events
        assert bus.engine == [("salt/virt/hyper-test/engine/connected", bus.engine[0][1])]
        assert bus.engine[0][1]["session"] == 1 and bus.engine[0][1]["reconnect"] is False
        # while "disconnected": fa stopped, fb removed, fc defined and started (the file is the new truth)
        write_node(node, [("keep", ids["keep"], RUNNING), ("fa", ids["fa"], SHUTOFF), ("fc", ids["fc"], RUNNING)])
        watcher.on_close(None, libvirt.VIR_CONNECT_CLOSE_REASON_EOF, None)  # what libvirt calls when libvirtd goes
        bus.wait(lambda t, d: t.endswith("/fc/started"), "reconciled events")
        assert watcher.connected.wait(WAIT) and watcher.sessions == 2
        assert [(t.rsplit("/", 1)[1], d.get("reason"), d["session"]) for t, d in bus.engine] == [
            ("connected", None, 1),
            ("disconnected", "eof", 1),
            ("connected", None, 2),
        ]
        assert bus.engine[2][1]["reconnect"] is True
        got = [(t.split("/")[4], d["event"], d.get("was"), d["uuid"]) for t, d in bus.sent]
        assert got == [
            ("fa", "stopped", "running", ids["fa"]),
            ("fb", "stopped", "running", ids["fb"]),
            ("fb", "undefined", "running", ids["fb"]),
            ("fc", "defined", None, ids["fc"]),
            ("fc", "started", "shutoff", ids["fc"]),
        ]
        assert all(d["detail"] == "reconciled" and d["reconciled"] is True for _t, d in bus.sent)
        assert "keep" not in {d["name"] for _t, d in bus.sent}  # unchanged: nothing to say
    finally:
        stop(watcher, thread)


def test_inbox_max_is_checked():
    assert events.inbox_max("50") == 50 and events.inbox_max(events.INBOX_MAX) == events.INBOX_MAX
    for bad in (0, -1, True, "lots", events.INBOX_LIMIT + 1):
        with pytest.raises(SaltInvocationError, match="virt:events:inbox_max in the minion config must be"):
            events.inbox_max(bad)


def test_a_flood_of_events_stays_within_the_inbox_and_is_reported(tmp_path, monkeypatch, caplog):
    """libvirt's thread queues facts faster than the watcher sends them (here: no session takes any): the
    inbox holds at most ``inbox_max``, the rest is dropped, counted, logged once a DROP_EVERY and reported
    to the master as one engine/dropped event."""
    monkeypatch.setattr(events, "DROP_EVERY", 3600.0)  # one warning for the whole flood, whatever its pace
    node = tmp_path / "node.xml"
    write_node(node, [("flood", str(uuid.uuid4()), RUNNING)])
    bus = Bus()
    watcher = events.Watcher("h1", None, bus, inbox_max=5)
    flood = 200  # lifecycle events: a suspend and a resume each
    with caplog.at_level("WARNING"), vconn.connect(f"test://{node}") as conn:
        ids = watcher._register(conn)  # libvirt's callbacks, on its event-loop thread (connect started it)
        # registered after the watcher's (for this domain: libvirt allows one callback per event id and
        # domain), so libvirt calls it after the watcher's for each event
        seen, dom = [], conn.lookupByName("flood")

        def count(_conn, _dom, event, _detail, _opaque):
            seen.append(event)

        lifecycle = libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE
        ids.append(("domainEventDeregisterAny", conn.domainEventRegisterAny(dom, lifecycle, count, None)))
        try:
            for _ in range(flood // 2):
                dom.suspend()
                dom.resume()
            deadline = time.monotonic() + WAIT
            while len(seen) < flood and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            for deregister, cb_id in ids:
                getattr(conn, deregister)(cb_id)
    assert len(seen) == flood, f"libvirt delivered {len(seen)} of {flood} events within {WAIT} s"
    assert watcher.inbox.qsize() == 5  # bounded: the minion's memory does not grow with the flood
    assert watcher.drops.total == flood - 5
    warned = [r.getMessage() for r in caplog.records if "inbox is full" in r.getMessage()]
    assert len(warned) == 1 and "virt:events:inbox_max: 5" in warned[0], warned
    watcher._drain()  # what the watcher's thread does with the inbox once it runs
    assert [d["event"] for _t, d in bus.sent] == ["suspended", "resumed", "suspended", "resumed", "suspended"]
    assert [(t, d["dropped"], d["inbox_max"]) for t, d in bus.engine] == [("salt/virt/h1/engine/dropped", flood - 5, 5)]


def test_the_close_notice_is_not_lost_with_the_inbox_full(tmp_path):
    """libvirt closes the connection while the inbox is full: the session still ends (with the close's
    reason) once it has sent what was queued before."""
    node = tmp_path / "node.xml"
    write_node(node, [("keep", str(uuid.uuid4()), RUNNING)])
    bus = Bus()
    watcher = events.Watcher("h1", None, bus, inbox_max=1)
    with vconn.connect(f"test://{node}") as conn:
        watcher._on_reboot(conn, conn.lookupByName("keep"), None)  # what libvirt's thread would queue
        watcher.on_close(conn, libvirt.VIR_CONNECT_CLOSE_REASON_KEEPALIVE, None)
        assert watcher.inbox.qsize() == 1 and watcher.drops.total == 0
        watcher.session(conn)  # returns: it does not wait for a notice that never comes
    assert [t.rsplit("/", 1)[1] for t, _d in bus.sent] == ["rebooted"]
    assert [(t.rsplit("/", 1)[1], d.get("reason")) for t, d in bus.engine] == [
        ("connected", None),
        ("disconnected", "keepalive"),
    ]


def test_unreachable_libvirt_is_retried_with_backoff(tmp_path):
    """libvirtd absent at first (a socket nobody listens on): the watcher keeps trying, then connects."""
    node = tmp_path / "node.xml"
    attempts = []

    def connect():
        attempts.append(time.monotonic())
        if not node.exists():
            return vconn.connect(f"qemu+unix:///system?socket={tmp_path}/nobody-listens", open_timeout=5)
        return vconn.connect(f"test://{node}")

    watcher = events.Watcher("h1", connect, Bus(), {"backoff_min": 0.05, "backoff_max": 0.2})
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while len(attempts) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(attempts) >= 3 and not watcher.connected.is_set()
        write_node(node, [("keep", str(uuid.uuid4()), RUNNING)])
        assert watcher.connected.wait(WAIT)
        assert list(watcher.known.values())[0]["name"] == "keep"
    finally:
        stop(watcher, thread)
