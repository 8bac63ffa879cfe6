"""libvirt connections: URI resolution from config, connect/close, libvirt errors -> Salt errors."""

import contextlib
import functools

from salt.exceptions import CommandExecutionError

from saltvirt.spec import DEFAULT_IMAGES_DIR

try:
    import libvirt
except ImportError:  # the loader modules report this through __virtual__
    libvirt = None

if libvirt is not None:
    # libvirt prints every error to stderr by default; we raise them as exceptions instead.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def resolve_uri(config_get, connection=None):
    """Per-call ``connection`` > config/pillar ``virt:connection:uri`` > libvirt's default (None)."""
    if connection:
        return connection
    return config_get("virt:connection:uri", None) or None


def salt_config(salt):
    """``config.get`` of a loader module's ``__salt__`` as a ``(key, default)`` function."""
    return lambda key, default=None: salt["config.get"](key, default)


def salt_connect(salt, connection=None):
    """The connection a loader module's function uses: ``connection=`` or the configured URI."""
    return connect(resolve_uri(salt_config(salt), connection))


def salt_images_dir(salt):
    """The configured ``virt:images`` directory (default ``/srv/salt-images``)."""
    return salt["config.get"]("virt:images", DEFAULT_IMAGES_DIR) or DEFAULT_IMAGES_DIR


def describe(uri):
    return uri or "the default libvirt URI"


@contextlib.contextmanager
def connect(uri=None, readonly=False):
    """Open a libvirt connection for the duration of a ``with`` block."""
    if libvirt is None:
        raise CommandExecutionError("the libvirt python bindings are not installed (pip install libvirt-python)")
    try:
        conn = libvirt.openReadOnly(uri) if readonly else libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise CommandExecutionError(
            f"cannot connect to libvirt at {describe(uri)}: {exc.get_error_message()}. "
            "Check that libvirtd is running and that virt:connection:uri is right."
        ) from None
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def lv_errors(action):
    """Decorator/context: turn libvirtError into CommandExecutionError('<action>: <message>')."""

    class _Ctx(contextlib.ContextDecorator):
        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            if exc_type is not None and libvirt is not None and issubclass(exc_type, libvirt.libvirtError):
                raise CommandExecutionError(f"{action}: {exc.get_error_message()}") from None
            return False

    return _Ctx()


def get_domain(conn, name):
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            raise CommandExecutionError(f"VM {name!r} is not defined on {conn.getHostname()}") from None
        raise CommandExecutionError(f"looking up VM {name!r}: {exc.get_error_message()}") from None


def domain_exists(conn, name):
    try:
        conn.lookupByName(name)
        return True
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return False
        raise CommandExecutionError(f"looking up VM {name!r}: {exc.get_error_message()}") from None


def with_conn(func):
    """For library functions taking ``conn`` first: accept a URI string instead and open/close it."""

    @functools.wraps(func)
    def wrapper(conn, *args, **kwargs):
        if conn is None or isinstance(conn, str):
            with connect(conn) as real:
                return func(real, *args, **kwargs)
        return func(conn, *args, **kwargs)

    return wrapper
