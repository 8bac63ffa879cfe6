"""Authenticate what the master keeps in a shared store (e.g. recovery records in redis): an HMAC-SHA256
with a key kept in the master's pki dir.

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


def key_path(pki_dir: str) -> str:
    return os.path.join(pki_dir, KEY_FILE)


def _key(pki_dir: str) -> bytes:
    path = key_path(pki_dir)
    os.makedirs(pki_dir, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(32))
    with open(path, "rb") as fh:
        key = fh.read()
    if len(key) < 32:
        raise CommandExecutionError(f"the record key {path} is too short: remove it (a new one is made) and re-record")
    return key


def _digest(key: bytes, kind: str, name: str, record: Mapping[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != FIELD}
    text = json.dumps([kind, name, body], sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def sign(pki_dir: str, kind: str, name: str, record: Mapping[str, Any]) -> dict:
    """``record`` with its MAC (bound to ``kind``, e.g. ``host-record``, and ``name``, e.g. the host)."""
    return dict(record, **{FIELD: _digest(_key(pki_dir), kind, name, record)})


def verified(pki_dir: str, kind: str, name: str, record: Any) -> bool:
    """True only when ``record`` carries this master's MAC for ``kind``/``name``."""
    if not isinstance(record, Mapping) or not isinstance(record.get(FIELD), str):
        return False
    return hmac.compare_digest(record[FIELD], _digest(_key(pki_dir), kind, name, record))
