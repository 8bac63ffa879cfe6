"""A hypervisor's "ready" event that the master can check: ``virt.ready`` fires it with a fresh nonce and
keeps the nonce in the minion's cachedir; ``salt-run virt.provision_assigned`` (the reactor example) asks
the named hypervisor, through a job only it answers, whether it sent that nonce (``virt.ready_confirm``).
Also what ``salt-run virt.roll`` asks after a reboot: the boot id (:func:`boot_id`) and whether the events
engine runs again (:func:`engine_beat`, written by the engine; :func:`engine_state`).

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


ENGINE_FILE = "salt-virt-engine.json"
BEAT_EVERY = 10.0  # seconds between two beats of an events engine connected to libvirt
BEAT_STALE = 3 * BEAT_EVERY  # an older beat: the engine stopped, hangs, or this minion is not the one that wrote it


def engine_beat(cachedir: str, engine: str, connected: bool, path: str = BOOT_ID) -> None:
    """The events engine's heartbeat in ``cachedir`` (mode 0600): written when it connects to libvirt or loses it,
    and every :data:`BEAT_EVERY` seconds while connected; the boot id tells a beat of this boot from one before."""
    data = {"engine": engine, "pid": os.getpid(), "boot_id": boot_id(path), "connected": connected, "time": time.time()}
    os.makedirs(cachedir, mode=0o700, exist_ok=True)
    fsutil.atomic_write(os.path.join(cachedir, ENGINE_FILE), json.dumps(data).encode(), 0o600)


def engine_state(cachedir: str, now: float | None = None, path: str = BOOT_ID) -> dict[str, object]:
    """``{ok, why}``: whether the events engine beat since this boot, connected to libvirt, within
    :data:`BEAT_STALE` seconds."""
    try:
        with open(os.path.join(cachedir, ENGINE_FILE), encoding="utf-8") as fh:
            beat = json.load(fh)
        age = (time.time() if now is None else now) - float(beat["time"])
        this_boot, connected = beat["boot_id"] == boot_id(path), beat["connected"] is True
    except (OSError, ValueError, KeyError, TypeError):
        return {"ok": False, "why": "the events engine has not beaten yet (not started, or not since it was updated)"}
    if not this_boot:
        return {"ok": False, "why": "the events engine has not beaten since this boot"}
    if not connected:
        return {"ok": False, "why": f"the events engine ({beat.get('engine')}) runs but has lost libvirt"}
    if not 0 <= age <= BEAT_STALE:
        return {"ok": False, "why": f"the events engine's last beat is {age:.0f} s old (stopped or hung?)"}
    return {"ok": True, "why": f"the events engine ({beat.get('engine')}) beat {age:.0f} s ago, connected to libvirt"}
