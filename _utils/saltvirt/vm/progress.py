"""``virt.init`` progress events (``salt/virt/init/<vm>/<step>``) without hidden waits.

Salt's ``event.send`` opens a new event connection per event and, without a minion event bus
(``salt-call --local``, masterless, any process that loads the modules without a running
salt-minion), spins ~1 s per event trying to reach the absent minion socket. :class:`Progress`
decides once per ``virt.init`` where an event would go (:func:`route`), checks that the minion bus
is there (:func:`bus_reachable`: a socket connect that fails at once when nothing listens), and then
fires every step through one connection; with no bus it sends nothing and says why once.
"""

import hashlib
import logging
import os
import queue
import socket
import stat
import threading
from collections.abc import Callable
from typing import Any, TypeAlias

from saltvirt.base.salttypes import Data, SaltOpts

log = logging.getLogger(__name__)

Outbox: TypeAlias = "queue.SimpleQueue[tuple[str, Data] | None]"  # the sender's events; None: no more


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


class Progress:
    """``progress(step, **data)`` for ``saltvirt.vm.provision.init``: fires ``<prefix>/<step>`` with
    ``data`` (plus ``base``) the way ``event.send`` would, through one connection per ``virt.init``.

    On a bus the events go out from one sender thread, in order, while the init goes on (the connect
    and each send cost a few ms); :meth:`close` (the end of the ``with`` block) waits for them, at most
    ``close_timeout`` seconds. ``send(tag, data)``: the fallback for the ``salt-call`` route (Salt's
    ``event.send``, synchronous). ``probe``: the bus check (a parameter so tests can count it)."""

    def __init__(self, opts, prefix, base=None, send=None, probe=bus_reachable, close_timeout=5):
        self.opts, self.prefix, self.base = opts, prefix, dict(base or {})
        self._send, self._probe, self._close_timeout = send, probe, close_timeout
        self.route = route(opts)
        self.skipped = None  # why events are not sent (None: they are)
        self.sent = 0
        self._bus: Any = None  # salt.utils.event's event bus, once the sender fires on it
        self._running: tuple[threading.Thread, Outbox] | None = None  # the sender thread and its events
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
        """Send (or queue) one step; False when events are not sent (see ``skipped``)."""
        if not self._decided:
            self._decide()
        if self.skipped:
            return False
        tag, payload = f"{self.prefix}/{step}", dict(data, **self.base)
        if self.route != "salt-call":
            if self._running is None:
                outbox: Outbox = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._sender, args=(outbox,), daemon=True, name=f"progress {self.prefix}"
                )
                self._running = thread, outbox
                thread.start()
            self._running[1].put((tag, payload))
            return True
        return self._deliver(tag, payload, self._send)

    def _deliver(self, tag: str, payload: Data, how: Callable[[str, Data], Any]) -> bool:
        try:
            ok = how(tag, payload)
        except Exception as exc:  # noqa: BLE001 - progress events are best effort, never fail the work
            ok = False
            log.debug("progress event %s not sent: %s", tag, exc)
        if ok is False:  # the bus went away: stop trying (each try could wait up to 1 s)
            self.skipped = f"the event bus did not take {tag}"
            return False
        self.sent += 1
        return True

    def _sender(self, outbox: Outbox) -> None:
        try:
            while (item := outbox.get()) is not None:
                if not self.skipped:
                    self._deliver(*item, self._fire)
        finally:
            bus, self._bus = self._bus, None
            if bus is not None:
                try:
                    bus.destroy()
                except Exception as exc:  # noqa: BLE001 - closing a best-effort connection
                    log.debug("closing the progress event connection: %s", exc)

    def _fire(self, tag: str, payload: Data) -> Any:
        if self._bus is None:
            import salt.utils.event  # noqa: PLC0415 - only with a bus to fire on

            self._bus = salt.utils.event.get_event("minion", opts=self.opts, listen=False)
        if self.route == "local":
            return self._bus.fire_event(payload, tag)
        # what a running salt-minion forwards to its master (as event.fire_master does)
        return self._bus.fire_event({"data": payload, "tag": tag, "events": None, "pretag": None}, "fire_master")

    def close(self) -> None:
        """Wait (bounded) until every queued event is sent, then close the connection."""
        running, self._running = self._running, None
        if running is not None:
            thread, outbox = running
            outbox.put(None)
            thread.join(self._close_timeout)
            if thread.is_alive():
                log.debug("progress events of %s still being sent after %s s", self.prefix, self._close_timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
