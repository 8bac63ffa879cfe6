"""libvirt connections: URI resolution from config, connect/close, libvirt errors -> Salt errors.

A hung libvirtd (stopped, deadlocked, its host unreachable) must fail a call, not hang the minion's
job: opening a connection is bounded (``open_timeout``), and every connection sends keepalive probes
(``virt:connection:keepalive``; libvirt then closes it and the pending call fails), which needs
libvirt's event loop: one daemon thread per process runs it. Any libvirt error escaping a
``with connect(...)`` block becomes a CommandExecutionError naming the URI.

Config (minion config only: operator settings; grains and pillar are written by callers and never read)::

    virt:
      connection:
        uri: qemu:///system
        open_timeout: 30            # seconds to wait for libvirtd to accept the connection
        keepalive: {interval: 5, count: 5}   # declared dead after ~interval * (count + 1) s of silence
      connections:                  # optional: other libvirt URIs a call may pick by name (connection=<name>)
        session: qemu:///session

A call never passes a URI: ``connection=`` is one of the names in ``virt:connections`` (or the
configured ``virt:connection:uri`` itself, for Salt-compatible SLS files). A URI reaches libvirt as root
on the hypervisor (``qemu+ext://?command=`` runs a program, ``test:///<file>`` reads a file, ``?socket=``,
``?keyfile=`` and ``+ssh`` reach other sockets or root's keys), so only the operator may write one.
"""

import contextlib
import logging
import os
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import config, install, validate
from saltvirt.base.salttypes import ConfigGet, Conn, Domain, SaltFunctions
from saltvirt.model import compat
from saltvirt.model.vmspec import DEFAULT_IMAGES_DIR

try:
    import libvirt
except ImportError:  # the loader modules report this through __virtual__
    libvirt = None

if libvirt is not None:
    # libvirt prints every error to stderr by default; we raise them as exceptions instead.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


log = logging.getLogger(__name__)
DEFAULT_OPEN_TIMEOUT = 30
DEFAULT_KEEPALIVE = {"interval": 5, "count": 5}
# libvirt's event loop is the process's, not this module's: its state lives on the libvirt module, so a new import
# of the library (a hypervisor minion's main process after an upgrade, _grains/virt_hypervisor.py) neither
# registers libvirt's loop a second time nor starts a second thread running it
_loop: dict[str, int | bool | None] = (
    libvirt.__dict__.setdefault("_saltvirt_event_loop", {"pid": None, "registered": False})
    if libvirt is not None
    else {"pid": None, "registered": False}
)  # the loop thread's process id
_loop_lock: threading.Lock = (
    libvirt.__dict__.setdefault("_saltvirt_event_loop_lock", threading.Lock())
    if libvirt is not None
    else threading.Lock()
)


def _event_loop():
    """libvirt's default event loop, running in a daemon thread of this process (keepalive needs it).
    Registered once, started once per process. A child forked while the loop runs cannot run it (GLib's
    default context stays owned by the parent's loop thread), so a forking process must not connect
    before it forks: Salt's minion forks its jobs from a main process that never connects."""
    if libvirt is None or _loop["pid"] == os.getpid():
        return
    with _loop_lock:
        if _loop["pid"] == os.getpid():
            return
        if not _loop["registered"]:
            libvirt.virEventRegisterDefaultImpl()
            _loop["registered"] = True

        def run():
            while True:
                try:
                    libvirt.virEventRunDefaultImpl()
                except Exception:
                    log.debug("libvirt event loop iteration failed", exc_info=True)

        threading.Thread(target=run, name="salt-virt-libvirt-events", daemon=True).start()
        _loop["pid"] = os.getpid()


def event_loop() -> None:
    """Make sure libvirt's event loop runs in this process (before opening a connection whose domain
    events or close callback are wanted: libvirt delivers them only through a registered loop)."""
    _event_loop()


def keepalive_settings(value: Any) -> tuple[float, float]:
    """``virt:connection:keepalive`` -> (interval, count); ``False``/0 interval turns it off."""
    if value in (False, 0, "off"):
        return 0, 0
    conf = dict(DEFAULT_KEEPALIVE, **(value if isinstance(value, dict) else {}))
    if value not in (None, True) and not isinstance(value, dict):
        raise SaltInvocationError(f"virt:connection:keepalive must be a mapping {{interval, count}}, not {value!r}")
    return (
        validate.int_in(conf["interval"], "virt:connection:keepalive:interval", 0),
        validate.int_in(conf["count"], "virt:connection:keepalive:count", 1),
    )


def _open(uri, readonly, timeout):
    """``libvirt.open`` bounded by ``timeout`` seconds: a libvirtd that accepts the socket but never
    answers (stopped, deadlocked) otherwise blocks forever. The abandoned attempt closes its
    connection if it ever completes."""
    opener = libvirt.openReadOnly if readonly else libvirt.open
    if not timeout:
        return opener(uri)
    box, gave_up = {}, threading.Event()

    def attempt():
        try:
            conn = opener(uri)
        except Exception as exc:  # noqa: BLE001 - handed to the caller below
            box["error"] = exc
            return
        box["conn"] = conn
        if gave_up.is_set():
            with contextlib.suppress(Exception):
                conn.close()

    worker = threading.Thread(target=attempt, name="salt-virt-libvirt-open", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        gave_up.set()
        raise CommandExecutionError(
            f"libvirt at {describe(uri)} did not answer within {timeout} s (virt:connection:open_timeout): "
            "libvirtd is hung or overloaded. Check it (e.g. 'virsh list', its log), restart it if needed"
        )
    if "error" in box:
        raise box["error"]
    return box["conn"]


CONNECTION_REFUSED = (
    "connection= must name a libvirt connection the operator configured: URIs come from the minion config only "
    "(virt:connection:uri, or a name listed in virt:connections{names}); drop connection= or pass one of those names"
)
PEER_SCHEMES = ("qemu+tls", "qemu+tcp")
PEER_URI_REFUSED = (
    "{what} must be qemu+tls://<host>/system or qemu+tcp://<host>/system with no user, query or "
    "fragment (transport options come from the operator's virt:migration config)"
)


def resolve_uri(config_get: ConfigGet, connection: str | None = None) -> str | None:
    """The URI a call uses: the configured ``virt:connection:uri`` (None: libvirt's default), or the
    operator's ``virt:connections[<connection>]``. Anything else in ``connection=`` (a URI, a path) is
    refused without echoing it (it may carry credentials)."""
    configured = config_get("virt:connection:uri", None) or None
    if not connection or connection == configured:
        return configured
    named = config_get("virt:connections", None) or {}
    if not isinstance(named, dict):
        raise SaltInvocationError("virt:connections must map connection names to libvirt URIs")
    if isinstance(connection, str) and connection in named and named[connection]:
        return named[connection]
    names = f": {', '.join(sorted(map(str, named)))}" if named else ""
    raise SaltInvocationError(CONNECTION_REFUSED.format(names=names))


def peer_uri(uri: Any, what: str) -> str:
    """Check a URI naming another hypervisor's libvirtd (migration target, recovery probe) that a call
    supplied: ``qemu+tls``/``qemu+tcp`` to a host's ``/system``, nothing else (no query: ``?command=``,
    ``?socket=``, ``?keyfile=``, ``?pkipath=`` come from configuration; no user; no ssh: root's keys).
    Returns ``uri``."""
    parts = urllib.parse.urlsplit(uri) if isinstance(uri, str) else None
    if (
        parts is None
        or any(c.isspace() or ord(c) < 32 for c in uri)
        or parts.scheme not in PEER_SCHEMES
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("/system", "/system/")
        or parts.query
        or parts.fragment
    ):
        raise SaltInvocationError(PEER_URI_REFUSED.format(what=what))
    return uri


def salt_config(salt: SaltFunctions) -> ConfigGet:
    """Operator configuration of a loader module, the one way the minion side reads ``virt:`` settings:
    the minion config only (``config.get`` without grains, pillar or the master's pillar: callers write
    grains with ``grains.setval`` and pillar, and a URI or path from them would reach libvirt as root),
    as a ``(key, default)`` function; ``virt:x`` also finds the old flat spelling ``virt.x`` (with a
    deprecation warning in the log)."""
    return config.getter(_salt_get(salt))


def _salt_get(salt: SaltFunctions) -> ConfigGet:
    """Salt's ``config.get`` over the minion config alone (and Salt's defaults), as ``(key, default)``."""
    return lambda key, default=None: salt["config.get"](
        key, default, omit_grains=True, omit_pillar=True, omit_master=True
    )


_plain_keys: dict[str, bool] = {}  # a key part -> whether Salt's YAML re-read of a missed key leaves it as it is


def _plain(part: str) -> bool:
    """Whether ``traverse_dict_and_list`` gives up on ``part`` when it is missing (it retries a missed key
    YAML-loaded: ``"1"`` finds an ``int`` key; a word stays a word). Asked once per part and process."""
    if part not in _plain_keys:
        import salt.utils.args  # noqa: PLC0415 - Salt's own rule, as config.get applies it

        try:
            _plain_keys[part] = salt.utils.args.yamlify_arg(part) == part
        except Exception:  # noqa: BLE001 - traverse_dict_and_list gives up on such a key too
            _plain_keys[part] = True
    return _plain_keys[part]


def _walk(data: Any, parts: list[str]) -> Any:
    """``data[a][b]...`` through mappings only: the value, ``_MISSED`` when a word is missing, or
    ``_UNSURE`` where Salt's traversal would do more (a list on the way, a key it would YAML-load)."""
    for part in parts:
        if not isinstance(data, dict):
            return _UNSURE if isinstance(data, list) else _MISSED
        if part in data:
            data = data[part]
        elif _plain(part):
            return _MISSED
        else:
            return _UNSURE
    return data


_UNSURE, _MISSED = object(), object()


def opts_config(opts: Mapping[str, Any], salt: SaltFunctions) -> ConfigGet:
    """:func:`salt_config` answered from the minion config ``opts`` itself (the loader module's ``__opts__``,
    what ``config.get`` reads first), then Salt's ``config.DEFAULTS``: the same answers without a loader call
    and a YAML re-read per missed key (28 of them made ~1 ms of every ``virt.init``). Grains and pillar are
    not read, as there. Where Salt would do more than walk mappings (a list in the path, a key it YAML-loads,
    an ``sdb://`` value to resolve) the key goes to :func:`salt_config`'s ``config.get``."""
    slow = _salt_get(salt)
    defaults = None

    def get(key, default=None):
        nonlocal defaults
        parts = key.split(":")
        value = _walk(opts, parts)
        if value is _MISSED:
            if defaults is None:
                import salt.modules.config  # noqa: PLC0415 - its DEFAULTS: what config.get falls back to

                defaults = salt.modules.config.DEFAULTS
            value = _walk(defaults, parts)
        if value is _UNSURE or (isinstance(value, str) and value.startswith("sdb://")):
            return slow(key, default)
        return default if value is _MISSED else value

    return config.getter(get)


def configured_connect(get: ConfigGet, connection: str | None = None) -> AbstractContextManager[Conn]:
    """The connection the operator's ``virt:`` settings (``get``: a :func:`salt_config`-like reader) name: the
    configured URI (or one ``connection=`` names from ``virt:connections``), with the configured open timeout and
    keepalive."""
    return connect(
        resolve_uri(get, connection),
        open_timeout=get("virt:connection:open_timeout", DEFAULT_OPEN_TIMEOUT),
        keepalive=get("virt:connection:keepalive", None),
    )


def salt_connect(salt: SaltFunctions, connection: str | None = None) -> AbstractContextManager[Conn]:
    """The connection a loader module's function uses (:func:`configured_connect` over :func:`salt_config`)."""
    return configured_connect(salt_config(salt), connection)


def salt_connect_compat(
    salt: SaltFunctions, connection: str | None = None, kwargs: Mapping[str, Any] | None = None, fun: str = "virt"
) -> AbstractContextManager[Conn]:
    """Like salt_connect, for functions taking Salt's ``**kwargs`` (username/password, ...): a
    username/password is refused (salt-virt reaches libvirt through its TLS certificates or the local
    socket, never a password) and so is any other unknown argument, naming the nearest known one."""
    given = {k: v for k, v in (kwargs or {}).items() if not k.startswith("__")}
    validate.no_credentials(given.get("username"), given.get("password"), fun)
    compat.refuse_unknown(given, ("connection", "username", "password"), fun)
    return salt_connect(salt, connection)


def salt_images_dir(salt: SaltFunctions) -> str:
    """The configured ``virt:images`` directory (default ``/srv/salt-images``)."""
    return configured_images_dir(salt_config(salt))


def configured_images_dir(get: ConfigGet) -> str:
    """:func:`salt_images_dir` from a :func:`salt_config`-like reader."""
    return get("virt:images", DEFAULT_IMAGES_DIR) or DEFAULT_IMAGES_DIR


DEFAULT_URI_ENV = "LIBVIRT_DEFAULT_URI"
_exported: dict[str, str | None] = {"uri": None}


def export_default_uri(config_get: ConfigGet) -> str | None:
    """Make the configured ``virt:connection:uri`` libvirt's default URI in this process
    (``LIBVIRT_DEFAULT_URI``), so libvirt clients that open "the default connection" in the minion reach
    the libvirtd that ``virt.*`` manages: other products' loader modules (Uyuni's
    ``virt_utils.vm_definition`` calls ``libvirt.open()``, then ``virt.get_xml``: both must see the same
    daemon) and the ``virsh`` a state runs (subprocesses inherit it). A different value the minion was
    started with is replaced in the minion's process only (logged); with no URI configured, ``virt.*``
    itself uses libvirt's default, and an inherited value stays. Returns the URI exported, or None."""
    uri = config_get("virt:connection:uri", None) or None
    current = os.environ.get(DEFAULT_URI_ENV)
    if uri is None:
        if current is not None and current == _exported["uri"]:  # ours, and the configuration dropped it
            del os.environ[DEFAULT_URI_ENV]
        _exported["uri"] = None
        return None
    if current not in (None, uri, _exported["uri"]):
        log.info(
            "%s from the minion's environment replaced by virt:connection:uri in the minion's process, so that "
            "libvirt clients opening the default connection (virsh, other modules) reach the libvirtd virt.* uses",
            DEFAULT_URI_ENV,
        )
    os.environ[DEFAULT_URI_ENV] = _exported["uri"] = uri
    return uri


def describe(uri: str | None) -> str:
    return uri or "the default libvirt URI"


def _lost(exc):
    """True when a libvirtError means the connection itself is gone (keepalive timeout, daemon died)."""
    msg = exc.get_error_message() or ""
    return exc.get_error_code() in (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_INTERNAL_ERROR) and (
        "keepalive" in msg or "connection closed" in msg or "End of file" in msg or "Cannot write data" in msg
    )


@contextlib.contextmanager
def connect(
    uri: str | None = None, readonly: bool = False, open_timeout: Any = DEFAULT_OPEN_TIMEOUT, keepalive: Any = None
) -> Iterator[Conn]:
    """Open a libvirt connection for the duration of a ``with`` block (bounded open, keepalive); a
    libvirt error escaping the block becomes a CommandExecutionError that names the URI."""
    if libvirt is None:
        raise CommandExecutionError(f"the libvirt python bindings are not installed: {install.HYPERVISOR_HINT}")
    open_timeout = validate.int_in(open_timeout or 0, "virt:connection:open_timeout", 0)
    interval, count = keepalive_settings(keepalive)
    if interval:
        _event_loop()
    try:
        conn = _open(uri, readonly, open_timeout)
    except libvirt.libvirtError as exc:
        raise CommandExecutionError(
            f"cannot connect to libvirt at {describe(uri)}: {exc.get_error_message()}. "
            "Check that libvirtd is running and that virt:connection:uri is right."
        ) from None
    if interval:
        try:
            conn.setKeepAlive(interval, count)
        except libvirt.libvirtError as exc:  # local drivers (test://) have no keepalive: nothing can hang
            log.debug("no keepalive on %s: %s", describe(uri), exc.get_error_message())
    try:
        yield conn
    except libvirt.libvirtError as exc:
        if _lost(exc):
            raise CommandExecutionError(
                f"lost the connection to libvirt at {describe(uri)}: {exc.get_error_message()}. libvirtd stopped "
                "answering (hung, restarted or unreachable): check it, then retry"
                + ("" if not interval else f" (keepalive: {interval} s x {count})")
            ) from None
        raise CommandExecutionError(f"libvirt at {describe(uri)}: {exc.get_error_message()}") from None
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def lv_errors(action: str) -> Any:
    """Decorator/context: turn libvirtError into CommandExecutionError('<action>: <message>')."""

    class _Ctx(contextlib.ContextDecorator):
        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            if exc_type is not None and libvirt is not None and issubclass(exc_type, libvirt.libvirtError):
                raise CommandExecutionError(f"{action}: {exc.get_error_message()}") from None
            return False

    return _Ctx()


def lookup_domain(conn: Conn, name: str) -> Domain | None:
    """VM ``name``, or None when it is not defined here (any other libvirt error is raised)."""
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise CommandExecutionError(f"looking up VM {name!r}: {exc.get_error_message()}") from None


def get_domain(conn: Conn, name: str) -> Domain:
    dom = lookup_domain(conn, name)
    if dom is None:
        raise CommandExecutionError(f"VM {name!r} is not defined on {conn.getHostname()}")
    return dom


def domain_exists(conn: Conn, name: str) -> bool:
    return lookup_domain(conn, name) is not None


# kind -> (the call taking flags, its schema-check flag's name, the call without flags)
_DEFINE = {
    "domain": ("defineXMLFlags", "VIR_DOMAIN_DEFINE_VALIDATE", lambda conn, xml: conn.defineXML(xml)),
    "network": ("networkDefineXMLFlags", "VIR_NETWORK_DEFINE_VALIDATE", lambda conn, xml: conn.networkDefineXML(xml)),
    "pool": (
        "storagePoolDefineXML",
        "VIR_STORAGE_POOL_DEFINE_VALIDATE",
        lambda conn, xml: conn.storagePoolDefineXML(xml, 0),
    ),
}


def define(conn: Conn, kind: str, xml: str) -> Any:
    """Define a ``domain``, ``network`` or ``pool`` with libvirt's schema check (``*_DEFINE_VALIDATE``): without
    it libvirt drops what its parser does not know and the definition silently lacks it. A driver without
    the check (an older libvirtd: VIR_ERR_NO_SUPPORT or "unsupported flags") gets the plain define.
    libvirt's errors are raised as they are (callers wrap them in :func:`lv_errors`)."""
    flagged, flag, plain = _DEFINE[kind]
    call = getattr(conn, flagged, None)
    if call is not None and hasattr(libvirt, flag):
        try:
            return call(xml, getattr(libvirt, flag))
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            unsupported = code == libvirt.VIR_ERR_INVALID_ARG and "unsupported flags" in (exc.get_error_message() or "")
            if code != libvirt.VIR_ERR_NO_SUPPORT and not unsupported:
                raise
            log.debug("define %s without libvirt's schema check: %s", kind, exc.get_error_message())
    return plain(conn, xml)
