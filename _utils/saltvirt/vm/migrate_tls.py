"""What a migration encrypts, and the operator's opt-in for what it does not (minion config, the source's).

A live migration has two channels: the source libvirtd's connection to the target's (``qemu+tls://``,
port 16514, with the client certificate ``virt.keys`` writes: :func:`choose_transport`), and QEMU's own
stream of the VM's memory and disks (``tcp://<target>``, NBD for a disk copy). That stream is encrypted
either by tunnelling it through the libvirtd connection (``tunnel``, no disk copy) or by QEMU's own TLS
(libvirt's ``VIR_MIGRATE_TLS``, with the certificates ``virt.keys qemu: True`` writes to QEMU's directory,
qemu.conf ``default_tls_x509_cert_dir``, ``/etc/pki/qemu`` by default). :func:`streams` decides: QEMU's
TLS whenever its files are there (``virt:migration:qemu_tls``: unset), and anything in clear only with
the loudly named ``virt:migration:allow_cleartext: True``; otherwise the migration is refused before
anything moves, saying how to fix it::

    virt:
      migration:
        qemu_tls_dir: /etc/pki/qemu   # QEMU's TLS directory (qemu.conf default_tls_x509_cert_dir)
        qemu_tls: True                # True: always (refused without its files); False: never (clear)
        allow_cleartext: False        # True: a migration may send what it cannot encrypt in clear
"""

import os
import urllib.parse

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.host import conn

TRANSPORTS = ("tcp", "tls")
DEFAULT_PKI = {  # libvirt's client files for root when no pkipath is given (what virt.keys writes)
    "cacert.pem": "/etc/pki/CA/cacert.pem",
    "clientcert.pem": "/etc/pki/libvirt/clientcert.pem",
    "clientkey.pem": "/etc/pki/libvirt/private/clientkey.pem",
}
QEMU_TLS_DIR = "/etc/pki/qemu"  # qemu.conf's default_tls_x509_cert_dir; virt.keys qemu: True writes it
QEMU_CLIENT_FILES = ("ca-cert.pem", "client-cert.pem", "client-key.pem")  # what the source's QEMU opens
OPT_IN = "virt:migration:allow_cleartext: True"
PLAINTEXT_WARNING = (
    "plaintext migration (transport tcp, asked for by name): the libvirtd connection (port 16509) is neither "
    "encrypted nor authenticated; the default is TLS (16514) with the certificates virt.keys writes"
)


def tls_missing(pkipath: str | None = None) -> list[str]:
    """The TLS client files libvirt needs for ``qemu+tls://`` that are missing (empty: all there)."""
    files = {n: os.path.join(pkipath, n) for n in DEFAULT_PKI} if pkipath else DEFAULT_PKI
    return [path for path in files.values() if not os.path.isfile(path)]


def plaintext_uri(uri: str) -> bool:
    """A ``qemu+tcp`` URI, its scheme in any case: libvirt reads ``qemu+TCP://`` as TCP (in clear) too."""
    return urllib.parse.urlsplit(str(uri)).scheme == "qemu+tcp"


def pkipath_param(pkipath: str) -> str:
    """``pkipath=<dir>`` for a ``qemu+tls`` URI's query: the operator's ``virt:migration:pkipath``, checked."""
    validate.absolute_path(pkipath, "virt:migration:pkipath")
    return "pkipath=" + urllib.parse.quote(pkipath, safe="/")


def operator_uri(target_uri: str, pkipath: str | None = None) -> str:
    """A caller's target URI (Salt's ``virt.migrate web1 qemu+tls://hv2/system``) with the operator's TLS
    settings, as ``saltvirt.vm.migrate.destination_uri`` gives them for a host name: a ``qemu+tls`` URI gets
    ``?pkipath=`` (``pkipath``, ``virt:migration:pkipath``) when it is set; other schemes stay as they are.
    A query of the URI's own is refused (``conn.peer_uri``'s wording) unless it is that same ``pkipath=``
    (libvirt reads parameter names in any case, percent-encoded: so does this check), and then replaced by
    the operator's: a directory of the caller's would have this hypervisor's libvirtd read its files as root."""
    parts = urllib.parse.urlsplit(target_uri)
    given = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if any(key.lower() != "pkipath" or not pkipath or value != pkipath for key, value in given):
        raise SaltInvocationError(conn.PEER_URI_REFUSED.format(what="virt.migrate target URI"))
    operators = pkipath if parts.scheme == "qemu+tls" else None
    if not given and not operators:
        return target_uri
    return urllib.parse.urlunsplit(parts._replace(query=pkipath_param(operators) if operators else ""))


def choose_transport(
    transport: str | None = None, pkipath: str | None = None, target_uri: str | None = None
) -> tuple[str | None, list[str]]:
    """``(transport, warnings)``: TLS unless ``tcp`` is asked for by name (which :func:`streams` allows only
    with the operator's opt-in); TLS without the client files is refused before anything moves, for a
    ``qemu+tls`` ``target_uri`` too (its client files are the operator's: :func:`operator_uri`)."""
    if target_uri:
        if urllib.parse.urlsplit(str(target_uri)).scheme == "qemu+tls":
            _need_client_files(pkipath)
        return None, [PLAINTEXT_WARNING] if plaintext_uri(target_uri) else []
    transport = transport or "tls"
    if transport not in TRANSPORTS:
        raise SaltInvocationError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    if transport == "tcp":
        return "tcp", [PLAINTEXT_WARNING]
    _need_client_files(pkipath)
    return "tls", []


def _need_client_files(pkipath: str | None) -> None:
    missing = tls_missing(pkipath)
    if missing:
        raise CommandExecutionError(
            f"migration over TLS needs this host's libvirt client certificate: {', '.join(missing)} missing. "
            "Apply the virt.keys state (see salt-virt.example.sls) or set virt:migration:pkipath; plaintext "
            f"only when asked for by name (transport=tcp) and allowed by {OPT_IN} in the minion config"
        )


def setting(value: object) -> bool | None:
    """``virt:migration:qemu_tls``: None (unset or ``auto``: when its files are there), True or False."""
    return None if value in (None, "", "auto") else validate.to_bool(value)


def qemu_tls_missing(tls_dir: str | None = None) -> list[str]:
    """The files the source's QEMU needs for TLS that ``tls_dir`` (default :data:`QEMU_TLS_DIR`) lacks."""
    folder = tls_dir or QEMU_TLS_DIR
    validate.absolute_path(folder, "virt:migration:qemu_tls_dir")
    return [os.path.join(folder, n) for n in QEMU_CLIENT_FILES if not os.path.isfile(os.path.join(folder, n))]


def streams(
    active: bool,
    tunnel: bool,
    transport: str | None,
    target_uri: str | None = None,
    qemu_tls: bool | None = None,
    qemu_tls_dir: str | None = None,
    allow_cleartext: bool = False,
) -> tuple[bool, list[str]]:
    """``(QEMU's TLS on, warnings)`` for a migration: its libvirtd connection is in clear with ``transport``
    tcp (or a ``qemu+tcp://`` ``target_uri``); a running VM's memory and disks go tunnelled through that
    connection, over QEMU's TLS (``qemu_tls`` True, or None and its files in ``qemu_tls_dir``), or in clear.
    Anything in clear needs ``allow_cleartext`` (the operator's ``virt:migration:allow_cleartext``): else
    refused with what to do, before anything moves. ``qemu_tls`` True without its files is always refused."""
    plain = plaintext_uri(target_uri) if target_uri else transport == "tcp"
    clear = ["the libvirtd connection (qemu+tcp)"] if plain else []
    use_tls = False
    if active and tunnel and plain:
        clear.append("the VM's memory (tunnelled through that connection)")
    elif active and not tunnel:
        missing = qemu_tls_missing(qemu_tls_dir) if qemu_tls is not False else []
        if qemu_tls and missing:
            raise CommandExecutionError(
                f"virt:migration:qemu_tls is True, but QEMU's TLS files are missing: {', '.join(missing)}. Apply the "
                "virt.keys state with qemu: True on every hypervisor (or set virt:migration:qemu_tls_dir to QEMU's "
                "directory, qemu.conf default_tls_x509_cert_dir)"
            )
        use_tls = not missing and qemu_tls is not False
        if not use_tls:
            why = "virt:migration:qemu_tls is False" if qemu_tls is False else f"{', '.join(missing)} missing"
            clear.append(f"the VM's memory and disks (QEMU's stream: {why})")
    if clear and not validate.to_bool(allow_cleartext):
        raise CommandExecutionError(
            f"this migration would send {' and '.join(clear)} in clear: refused. Keep transport tls (the default) "
            "and give every hypervisor QEMU's TLS certificates (the virt.keys state with qemu: True, into "
            f"virt:migration:qemu_tls_dir, default {QEMU_TLS_DIR}), or set {OPT_IN} in this hypervisor's minion "
            "config to migrate in clear"
        )
    data_clear = [part for part in clear if part.startswith("the VM's")]
    warnings = [f"cleartext migration ({OPT_IN}): {data_clear[0]} went unencrypted"] if data_clear else []
    return use_tls, warnings
