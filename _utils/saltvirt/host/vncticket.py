"""One-time tickets to a VM's VNC console over websocket (the web console's noVNC, docs/topics/console.md).

Why this shape: the master's event bus (readable by any salt-api token through ``/events``) carries a runner's
arguments and return, and every minion decrypts every publication, so the VNC password may never travel in
clear. The browser makes an ephemeral RSA-OAEP key pair and sends only its public key (``salt-run
virt.console <vm> pubkey=...``); the hypervisor that runs the VM, the only place a password is set, sets a
fresh random password on the live console (libvirt ``passwd`` + ``passwdValidTo``: :data:`DEFAULT_LIFETIME`
seconds) and answers with that password encrypted to the browser's key (RSA-OAEP, SHA-256: WebCrypto's
``RSA-OAEP``), signed as every answer (:mod:`saltvirt.pki.answers`). Only that browser tab can read it.

One use: the ``virt_console`` engine (:func:`watch`) sets a new random password nobody knows as soon as QEMU
reports a VNC client authenticated (libvirt's graphics event, phase ``initialize``); the session that
authenticated stays. :func:`issue` refuses while the engine's heartbeat (:func:`beat`) is stale: without the
engine a ticket would be reusable until it expires. Each VM has its own password; a ticket names its VM and
its websocket port, and the password is valid for nothing else.

Where the websocket listens (the console's ``listen`` address, a free port libvirt picks) and whether it is TLS
(QEMU's ``vnc_tls``) is the operator's (``virt:console`` in the minion config), never the caller's.
"""

import base64
import contextlib
import datetime
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import section
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import event_loop, get_domain, lv_errors
from saltvirt.model import checks, vmspec
from saltvirt.xml.domain import definition, devices
from saltvirt.xml.etree import read

log = logging.getLogger(__name__)

DEFAULT_LIFETIME = 60  # seconds a ticket's password opens the console for (virt:console:lifetime)
MAX_LIFETIME = 600
HEARTBEAT_EVERY = 10  # the engine touches its heartbeat file this often ...
HEARTBEAT_STALE = 45  # ... and virt.console refuses when it is older than this
AFFECT_LIVE = 1  # libvirt.VIR_DOMAIN_AFFECT_LIVE
GRAPHICS_INITIALIZE = 1  # libvirt.VIR_DOMAIN_EVENT_GRAPHICS_INITIALIZE: a client passed authentication
EVENT_ID_GRAPHICS = 5  # libvirt.VIR_DOMAIN_EVENT_ID_GRAPHICS
NOT_RUNNING = "{name} is not running: start it to open its console"
NO_CONSOLE = "{name} has no VNC console: give it one (salt-run virt.update {name} enable_vnc=True) and restart it"
OLD_CONSOLE = (
    "{name}'s VNC console {why} (defined by an older salt-virt): an operator gives it a new one "
    "(virt.update {name} graphics=none, then enable_vnc=True) and restarts it"
)
NO_ENGINE = (
    "the virt_console engine is not running on this hypervisor: a console ticket would not be one-time "
    "(docs/topics/console.md: engines: [virt_console] in the minion config)"
)
PLAIN_OPT_IN = "insecure_plain_websocket"  # virt:console:<this>: ws:// (keystrokes in clear) instead of wss://


def settings(get: Callable[[str, Any], Any], grains: Any = None) -> Data:
    """The operator's ``virt:console`` (minion config): ``address`` browsers reach this hypervisor's
    websockets by (default: its ``fqdn`` grain), ``lifetime`` of a ticket, ``tls`` (False only with
    ``insecure_plain_websocket: True``)."""
    conf = section(get("virt:console", None), "virt:console")
    address = conf.get("address") or (grains or {}).get("fqdn") or "localhost"
    return {
        "address": checks.listen_address(address, "virt:console:address"),
        "lifetime": validate.positive_int(
            conf.get("lifetime", DEFAULT_LIFETIME), "virt:console:lifetime", MAX_LIFETIME
        ),
        "tls": not validate.to_bool(conf.get(PLAIN_OPT_IN, False)),
    }


def browser_key(pubkey: Any) -> rsa.RSAPublicKey:
    """The browser's public key as WebCrypto exports it (``spki``, base64) or PEM: RSA, 2048 bits or more."""
    if not isinstance(pubkey, str) or not 0 < len(pubkey) < 4096:
        raise SaltInvocationError("pubkey must be the browser's RSA-OAEP public key (SPKI, base64 or PEM)")
    try:
        if pubkey.lstrip().startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(pubkey.encode())
        else:
            key = serialization.load_der_public_key(base64.b64decode(pubkey, validate=True))
    except ValueError:
        raise SaltInvocationError("pubkey is not a public key (SPKI, base64 or PEM)") from None
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
        raise SaltInvocationError("pubkey must be an RSA key of at least 2048 bits")
    return key


def seal_for(key: rsa.RSAPublicKey, secret: str) -> str:
    """``secret`` encrypted to ``key`` with RSA-OAEP/SHA-256 (what WebCrypto's ``RSA-OAEP`` decrypts), base64."""
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    return base64.b64encode(key.encrypt(secret.encode(), oaep)).decode("ascii")


def _utc(when: float) -> str:
    return datetime.datetime.fromtimestamp(int(when), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def set_password(dom: Any, password: str, valid_until: float) -> int:
    """Set the running VM's VNC password, valid until ``valid_until`` (epoch); its websocket port. Raises
    CommandExecutionError (never with the password) when it has no such console."""
    name = dom.name()
    if not dom.isActive():
        raise CommandExecutionError(NOT_RUNNING.format(name=name))
    root = read(dom.XMLDesc(0))
    live = devices.vnc_websocket(root)
    if live is None:
        if any(g["type"] == "vnc" for g in definition.parse(root)["graphics"]):
            raise CommandExecutionError(OLD_CONSOLE.format(name=name, why="has no websocket"))
        raise CommandExecutionError(NO_CONSOLE.format(name=name))
    try:
        with lv_errors(f"setting the console password of {name}"):
            dom.updateDeviceFlags(devices.graphics_password(live, password, _utc(valid_until)), AFFECT_LIVE)
    except CommandExecutionError as exc:
        if "Could not set password" in str(exc):  # QEMU: its VNC started without password authentication
            why = "started without password authentication"
            raise CommandExecutionError(OLD_CONSOLE.format(name=name, why=why)) from None
        raise
    return int(live.get("websocket") or 0)


def rotate(dom: Any) -> None:
    """A new random password nobody knows, already expired: the console opens for no one until the next
    ticket; connected clients stay."""
    set_password(dom, vmspec.console_password(), time.time())


def issue(conn: Conn, name: str, pubkey: Any, conf: Data, alive: str | None) -> Data:
    """A ticket to VM ``name``'s console for the holder of ``pubkey``: ``{vm, host, port, tls, valid_until,
    password}``, the password encrypted to ``pubkey`` (:func:`seal_for`). ``alive``: the
    engine's heartbeat file (None: not checked, for tests)."""
    key = browser_key(pubkey)
    if alive is not None and not fresh(alive):
        raise CommandExecutionError(NO_ENGINE)
    dom = get_domain(conn, name)
    password = vmspec.console_password()
    valid_until = int(time.time()) + conf["lifetime"]
    port = set_password(dom, password, valid_until)
    return {
        "vm": name,
        "host": conf["address"],
        "port": port,
        "tls": conf["tls"],
        "valid_until": valid_until,
        "password": seal_for(key, password),
    }


# the engine: one use per ticket -------------------------------------------------------------------
def heartbeat_path(cachedir: str) -> str:
    return os.path.join(cachedir, "saltvirt", "virt_console.alive")


def beat(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "a"):
        os.utime(path)


def fresh(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < HEARTBEAT_STALE
    except OSError:
        return False


def watch(connect: Callable[[], Any], alive: str, stop: threading.Event, retry: float = 5) -> None:
    """Until ``stop``: on every VNC client that authenticates on this hypervisor, :func:`rotate` that VM's
    password; the heartbeat file ``alive`` is touched while the watch runs (and left to go stale while
    libvirtd is unreachable: virt.console then refuses)."""
    event_loop()
    inbox: queue.Queue = queue.Queue()
    on_graphics = graphics_callback(inbox)
    while not stop.is_set():
        try:
            with connect() as conn:
                cb = conn.domainEventRegisterAny(None, EVENT_ID_GRAPHICS, on_graphics, None)
                try:
                    _serve(conn, inbox, alive, stop)
                finally:
                    with contextlib.suppress(Exception):
                        conn.domainEventDeregisterAny(cb)
        except Exception as exc:  # noqa: BLE001 - libvirtd down: the heartbeat goes stale, retry
            log.warning("virt_console: libvirt unavailable (%s); retrying in %.0f s", exc, retry)
        stop.wait(retry)


def graphics_callback(inbox: queue.Queue) -> Callable[..., None]:
    """libvirt's graphics event callback: the VM's name queued when a client passed authentication (it is
    rotated by :func:`_serve`, not in libvirt's event thread); a mere connection or a disconnection is not."""

    def on_graphics(_conn: Any, dom: Any, phase: int, *_rest: Any) -> None:
        if phase == GRAPHICS_INITIALIZE:
            inbox.put(dom.name())

    return on_graphics


def _serve(conn: Any, inbox: queue.Queue, alive: str, stop: threading.Event) -> None:
    last = 0.0
    while not stop.is_set():
        if time.monotonic() - last >= HEARTBEAT_EVERY:
            if not conn.isAlive():
                return
            beat(alive)
            last = time.monotonic()
        try:
            name = inbox.get(timeout=1)
        except queue.Empty:
            continue
        try:
            rotate(get_domain(conn, name))
            log.info("virt_console: %s: a console client authenticated; its password is spent", name)
        except Exception as exc:  # noqa: BLE001 - logged: the ticket still expires at its time
            log.error("virt_console: could not spend the console password of %s: %s", name, exc)
