"""Hypervisors the runner found down, remembered across calls (master side, in the master's cache).

A stopped hypervisor costs every call that asks it ``timeout + down_after`` seconds before it is reported
down: an operator who runs ``virt.query``, ``virt.recover`` and ``virt.next_host`` during an outage waited that
long on each. A hypervisor reported down (silent: no signed answer, nor to its job checks) within the last
``virt:hypervisors:down_memory`` seconds (default 300; 0 turns it off) is therefore a suspect: it is still
published to and asked, and any reply it signs clears it at once, but it is given up after one unanswered job
check (``timeout + gather_job_timeout``) instead of the whole ``down_after``.

Only the runner writes here, from what it saw itself (the absence of a signed reply); nothing a minion says or
fires on the bus puts a host in or out. A hypervisor whose job ended without an answer is not silent (it signed
that its job is gone) and is not remembered.
"""

import contextlib
import logging
import time
from collections.abc import Iterable

import salt.cache

from saltvirt.base.salttypes import SaltOpts

log = logging.getLogger(__name__)

BANK = "salt-virt/down"


def recent(opts: SaltOpts, minions: Iterable[str], memory: float) -> dict[str, float]:
    """``{minion: seconds since it was reported down}`` for those of ``minions`` reported down within
    ``memory`` seconds (none when ``memory`` is 0)."""
    if not memory:
        return {}
    try:
        cache = salt.cache.factory(opts)
        listed = set(cache.list(BANK))
    except Exception as exc:  # noqa: BLE001 - the memory only shortens waits: without it, wait in full
        log.debug("virt runner: down hypervisors not read from the cache: %s", exc)
        return {}
    now = time.time()
    found = {}
    for minion in sorted(set(minions) & listed):
        with contextlib.suppress(Exception):  # unreadable: not a suspect (the full wait is the safe side)
            at = (cache.fetch(BANK, minion) or {}).get("at")
            if isinstance(at, (int, float)) and not isinstance(at, bool) and 0 <= now - at <= memory:
                found[minion] = now - at
    return found


def remember(opts: SaltOpts, minion: str) -> None:
    """``minion`` was reported down now."""
    try:
        salt.cache.factory(opts).store(BANK, minion, {"at": time.time()})
    except Exception as exc:  # noqa: BLE001 - not remembered: the next call waits in full
        log.debug("virt runner: %s not remembered as down: %s", minion, exc)


def forget(opts: SaltOpts, minion: str) -> None:
    """``minion`` signed a reply: no longer a suspect."""
    try:
        salt.cache.factory(opts).flush(BANK, minion)
    except Exception as exc:  # noqa: BLE001 - a stale entry expires after down_memory
        log.debug("virt runner: %s not forgotten as down: %s", minion, exc)
