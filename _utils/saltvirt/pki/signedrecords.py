"""Authenticate what the master keeps in a shared store (e.g. recovery records in redis): an HMAC-SHA256
with a key kept in the master's pki dir. Backup manifests in a shared backup directory are signed the same
way by the hypervisors, with their backup key (:mod:`saltvirt.vm.backupstore`: :func:`sign_with`).

Why: ``salt-run virt.recover`` defines a down hypervisor's recorded domain XML on another hypervisor.
The shared store (``cache: redis``) is reachable by whoever can write to it, which is not the
operator's tier: without a MAC, write access to the store would be root on a hypervisor. The key
(``<pki_dir>/salt-virt-records.key``, 32 random bytes, mode 0600, made on first use) never leaves the
master; several masters sharing one store need the same key file (copy it with ``master.pem``).
"""

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

from salt.exceptions import CommandExecutionError

KEY_FILE = "salt-virt-records.key"
FIELD = "mac"


def key_path(pki_dir: str, key_file: str = KEY_FILE) -> str:
    return os.path.join(pki_dir, key_file)


def load_key(path: str, create: bool = True) -> bytes:
    """The key in ``path`` (32 random bytes or more); ``create``: made on first use (mode 0600)."""
    if create:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(32))
    try:
        with open(path, "rb") as fh:
            key = fh.read()
    except OSError as exc:
        raise CommandExecutionError(
            f"the key {path} cannot be read ({exc.strerror}): the operator puts it there (32 random bytes, mode 0600)"
        ) from None
    if len(key) < 32:
        raise CommandExecutionError(f"the key {path} is too short: remove it (a new one is made) and sign again")
    return key


def _key(pki_dir: str) -> bytes:
    return load_key(key_path(pki_dir))


def _digest(key: bytes, kind: str, name: str, record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != FIELD}
    text = json.dumps([kind, name, body], sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign_with(key: bytes, kind: str, name: str, record: Mapping[str, Any]) -> dict:
    """``record`` with its MAC under ``key`` (bound to ``kind`` and ``name``)."""
    return dict(record, **{FIELD: _digest(key, kind, name, record)})


def verified_with(key: bytes, kind: str, name: str, record: Any) -> bool:
    """True only when ``record`` carries the MAC ``key`` makes for ``kind``/``name``."""
    if not isinstance(record, Mapping) or not isinstance(record.get(FIELD), str):
        return False
    return hmac.compare_digest(record[FIELD], _digest(key, kind, name, record))


def sign(pki_dir: str, kind: str, name: str, record: Mapping[str, Any]) -> dict:
    """``record`` with its MAC (bound to ``kind``, e.g. ``host-record``, and ``name``, e.g. the host)."""
    return sign_with(_key(pki_dir), kind, name, record)


def verified(pki_dir: str, kind: str, name: str, record: Any) -> bool:
    """True only when ``record`` carries this master's MAC for ``kind``/``name``."""
    return verified_with(_key(pki_dir), kind, name, record)
