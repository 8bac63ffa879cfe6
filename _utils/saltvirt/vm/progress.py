"""``virt.init`` progress events (``salt/virt/init/<vm>/<step>``) without hidden waits.

Salt's ``event.send`` opens a new event connection per event and, without a minion event bus
(``salt-call --local``, masterless, any process that loads the modules without a running
salt-minion), spins ~1 s per event trying to reach the absent minion socket. :class:`Progress`
decides once per ``virt.init`` where an event would go (:func:`route`), checks that the minion bus
is there (:func:`bus_reachable`: a socket connect that fails at once when nothing listens), and then
writes every step through one connection, framed as Salt's own client frames it; with no bus it sends
nothing and says why once.
"""

import datetime
import hashlib
import logging
import os
import socket
import stat
from collections.abc import Callable
from typing import Any

from saltvirt.base.salttypes import Data, SaltOpts

log = logging.getLogger(__name__)


def _local(opts):
    """As Salt's ``event.send`` decides: masterless events go to the minion's own bus."""
    return bool(
        (opts.get("local") or opts.get("file_client") == "local" or opts.get("master_type") == "disable")
        and not opts.get("use_master_when_local")
    )


def route(opts: SaltOpts) -> str:
    """Where ``event.send`` would put an event: ``local`` (the minion bus, masterless), ``master``
    (through the minion bus to the master: inside a running salt-minion) or ``salt-call`` (a
    ``salt-call`` with a master sends straight to the master over its own channel, no bus needed)."""
    if _local(opts):
        return "local"
    if opts.get("__cli") == "salt-call":
        return "salt-call"
    return "master"


def bus_address(opts: SaltOpts) -> str | tuple[str, int]:
    """The minion event bus's pull socket: a path (``ipc_mode: ipc``) or ``(host, port)`` (``tcp``),
    as ``salt.transport.base.ipc_publish_server`` names it."""
    if opts.get("ipc_mode") == "tcp":
        host = "::1" if opts.get("ipv6") else "127.0.0.1"
        return (host, int(opts.get("tcp_pull_port", 4511)))
    minion_id = str(opts.get("hash_id") or opts.get("id") or "")
    id_hash = getattr(hashlib, opts.get("hash_type") or "sha256")(minion_id.encode()).hexdigest()[:10]
    return os.path.join(opts.get("sock_dir") or "", f"minion_event_{id_hash}_pull.ipc")


def bus_reachable(opts: SaltOpts, timeout: float = 0.2) -> tuple[bool, str | None]:
    """(reachable, reason): is something listening on the minion event bus's pull socket? A missing
    socket file is known without a syscall to connect; a stale one (minion gone) refuses at once."""
    addr = bus_address(opts)
    if isinstance(addr, str):
        try:
            if not stat.S_ISSOCK(os.stat(addr).st_mode):
                return False, f"{addr} is not a socket"
        except OSError:
            return False, f"no minion event bus ({addr} does not exist: no salt-minion running here)"
        family = socket.AF_UNIX
    else:
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(addr)
    except OSError as exc:
        return False, f"no minion event bus at {addr}: {exc}"
    return True, None


def _connect(addr: str | tuple[str, int], timeout: float) -> socket.socket:
    """A plain blocking connection to the bus's pull socket (a spy point for the tests)."""
    family = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def _framer() -> Callable[..., bytes] | None:
    """Salt's own framing of its bus's pull socket (what its publisher client writes); None when this Salt
    has none (its event client is used then)."""
    import salt.transport.frame  # noqa: PLC0415 - only with a bus to fire on

    return getattr(salt.transport.frame, "frame_msg_ipc", None)


class Progress:
    """``progress(step, **data)`` for ``saltvirt.vm.provision.init``: fires ``<prefix>/<step>`` with
    ``data`` (plus ``base``) the way ``event.send`` would, through one connection per ``virt.init``.

    On a bus each event is packed and framed by Salt's own functions (``SaltEvent.pack``,
    ``frame_msg_ipc``) and written to the pull socket straight from this thread: ~0.1 ms an event, where
    Salt's event client (its own io loop, a thread per client) cost a few ms an init in CPU and GIL that
    the init waited for (issue #40). A send that does not finish in ``timeout`` seconds stops the events.
    ``send(tag, data)``: the fallback for the ``salt-call`` route (Salt's ``event.send``, synchronous).
    ``probe``: the bus check (a parameter so tests can count it)."""

    def __init__(self, opts, prefix, base=None, send=None, probe=bus_reachable, timeout=1.0):
        self.opts, self.prefix, self.base = opts, prefix, dict(base or {})
        self._send, self._probe, self._timeout = send, probe, timeout
        self.route = route(opts)
        self.skipped = None  # why events are not sent (None: they are)
        self.sent = 0
        self._bus: Any = None  # the connection to the bus's pull socket (or Salt's event client)
        self._decided = False

    def _decide(self):
        self._decided = True
        if self.route == "salt-call":
            if self._send is None:
                self.skipped = "no way to reach the master from this process"
            return
        ok, why = self._probe(self.opts)
        if not ok:
            self.skipped = why
            log.debug("virt.init progress events not sent: %s", why)

    def __call__(self, step: str, **data: Any) -> bool:
        """Send one step; False when events are not sent (see ``skipped``)."""
        if not self._decided:
            self._decide()
        if self.skipped:
            return False
        tag, payload = f"{self.prefix}/{step}", dict(data, **self.base)
        return self._deliver(tag, payload, self._send if self.route == "salt-call" else self._fire)

    def _deliver(self, tag: str, payload: Data, how: Callable[[str, Data], Any]) -> bool:
        try:
            ok = how(tag, payload)
        except Exception as exc:  # noqa: BLE001 - progress events are best effort, never fail the work
            ok = False
            log.debug("progress event %s not sent: %s", tag, exc)
        if ok is False:  # the bus went away: stop trying (each try could wait up to the timeout)
            self.skipped = f"the event bus did not take {tag}"
            self.close()
            return False
        self.sent += 1
        return True

    def _fire(self, tag: str, payload: Data) -> Any:
        import salt.utils.event  # noqa: PLC0415 - only with a bus to fire on

        if self.route != "local":  # what a running salt-minion forwards to its master (event.fire_master)
            payload, tag = {"data": payload, "tag": tag, "events": None, "pretag": None}, "fire_master"
        frame = _framer()
        if frame is None:
            if self._bus is None:
                self._bus = salt.utils.event.get_event("minion", opts=self.opts, listen=False)
            return self._bus.fire_event(payload, tag, timeout=int(self._timeout * 1000))
        if self._bus is None:
            self._bus = _connect(bus_address(self.opts), self._timeout)
        # as SaltEvent.fire_event fills in an event before it packs it (Salt's own events-fired metric,
        # an OpenTelemetry counter off by default, does not count these)
        payload["_stamp"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        tracing = getattr(salt.utils, "tracing", None)
        if tracing is not None:
            tracing.inject(payload)
        msg = salt.utils.event.SaltEvent.pack(tag, payload, max_size=self.opts.get("max_event_size"))
        self._bus.sendall(frame(msg if isinstance(msg, bytes) else msg.encode(), raw_body=True))
        return True

    def close(self) -> None:
        """Close the connection (every event is written by then)."""
        bus, self._bus = self._bus, None
        if bus is None:
            return
        try:
            bus.close() if isinstance(bus, socket.socket) else bus.destroy()
        except Exception as exc:  # noqa: BLE001 - closing a best-effort connection
            log.debug("closing the progress event connection: %s", exc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
