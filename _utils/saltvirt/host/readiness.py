"""A hypervisor's "ready" event that the master can check: ``virt.ready`` fires it with a fresh nonce and
keeps the nonce in the minion's cachedir; ``salt-run virt.provision_assigned`` (the reactor example) asks
the named hypervisor, through a job only it answers, whether it sent that nonce (``virt.ready_confirm``).

Why: Salt 3008 lets any minion put any tag and any data on the master's bus (the batch ``events`` form of
``_minion_event``: neither ``data['id']`` nor a ``salt/minion/<id>/...`` tag is authenticated there), so
a VM's root could make the reactor act for a hypervisor. A nonce opens once and for ``MAX_AGE`` seconds.
"""

import hmac
import json
import os
import secrets
import time

from saltvirt.base import fsutil

MAX_AGE = 600  # seconds between the event and the master's question
FILE = "salt-virt-ready.json"


def _path(cachedir: str) -> str:
    return os.path.join(cachedir, FILE)


def announce(cachedir: str) -> str:
    """A new nonce for one ready event, kept (mode 0600) in ``cachedir`` until confirmed or replaced."""
    nonce = secrets.token_hex(16)
    os.makedirs(cachedir, mode=0o700, exist_ok=True)
    data = json.dumps({"nonce": nonce, "time": time.time()}).encode()
    fsutil.atomic_write(_path(cachedir), data, 0o600)
    return nonce


def confirm(cachedir: str, nonce: object, max_age: float = MAX_AGE) -> bool:
    """True once if ``nonce`` is the one :func:`announce` made here less than ``max_age`` seconds ago (it
    is removed then: it opens nothing twice). A wrong nonce leaves the kept one alone, so a forged event
    cannot spoil the real one."""
    path = _path(cachedir)
    try:
        with open(path, encoding="utf-8") as fh:
            kept = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(nonce, str) or not isinstance(kept, dict) or not isinstance(kept.get("nonce"), str):
        return False
    if not hmac.compare_digest(kept["nonce"].encode(), nonce.encode()):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False  # a concurrent question took it
    return 0 <= time.time() - float(kept.get("time", 0)) <= max_age


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id(path: str = BOOT_ID) -> str:
    """This host's boot id (Linux: new at every boot); a rolled host's reboot is proven by a new one."""
    with open(path, encoding="ascii") as fh:
        return fh.read().strip()
