"""What the CA (:mod:`saltvirt.pki.ca`) and its revocation list (:mod:`saltvirt.pki.crl`) share below
``ca_dir``: the clock, private directories, atomic writes with their final mode, one lock per directory,
and whether a certificate was signed by a CA. Below both, so neither imports the other's private names."""

import contextlib
import datetime
import fcntl
import os
from collections.abc import Iterator

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from saltvirt.base.fsutil import atomic_write

SKEW = datetime.timedelta(minutes=5)  # not_before slack for hosts whose clocks lag a little


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def mkdir_private(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_mode & 0o777 != 0o700:
        os.chmod(path, 0o700)


def write(path: str, data: bytes, mode: int) -> None:
    """Atomic write with the final mode from the start (no window where a key is world-readable)."""
    mkdir_private(os.path.dirname(path))
    atomic_write(path, data, mode)


def read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """Exclusive lock on ``directory`` (master worker processes compile pillars concurrently)."""
    mkdir_private(directory)
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """True when ``ca_cert`` signed ``cert`` (issuer name and signature)."""
    if cert.issuer != ca_cert.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True
