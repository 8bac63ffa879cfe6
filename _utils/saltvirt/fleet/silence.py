"""Hypervisors the runner found down, remembered across calls (master side, a file per host in the master's
cachedir).

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
import os
import time
from collections.abc import Iterable

from saltvirt.base.salttypes import SaltOpts

log = logging.getLogger(__name__)


def _folder(opts: SaltOpts) -> str:
    # a file per host in this master's own cachedir, not Salt's cache backend: when that is the shared store
    # (redis, multi-master), a store that is down must not slow or break the wait it only shortens
    return os.path.join(opts["cachedir"], "salt-virt", "down")


def _file(opts: SaltOpts, minion: str) -> str | None:
    if not minion or os.sep in minion or minion.startswith("."):
        return None  # never a path outside the folder (accepted minion ids never look like this)
    return os.path.join(_folder(opts), minion)


def recent(opts: SaltOpts, minions: Iterable[str], memory: float) -> dict[str, float]:
    """``{minion: seconds since it was reported down}`` for those of ``minions`` reported down within
    ``memory`` seconds (none when ``memory`` is 0)."""
    if not memory:
        return {}
    try:
        listed = set(os.listdir(_folder(opts)))
    except OSError:
        return {}  # nothing remembered yet
    now = time.time()
    found = {}
    for minion in sorted(set(minions) & listed):
        path = _file(opts, minion)
        if path is None:  # a name remember() never writes (a file put there by hand): not a suspect
            continue
        with contextlib.suppress(OSError, ValueError):  # unreadable: not a suspect (a full wait is the safe side)
            with open(path) as fh:
                age = now - float(fh.read())
            if 0 <= age <= memory:
                found[minion] = age
    return found


def remember(opts: SaltOpts, minion: str) -> None:
    """``minion`` was reported down now."""
    path = _file(opts, minion)
    if path is None:
        return
    try:
        os.makedirs(_folder(opts), exist_ok=True)
        with open(f"{path}.tmp", "w") as fh:
            fh.write(repr(time.time()))
        os.replace(f"{path}.tmp", path)
    except OSError as exc:  # not remembered: the next call waits in full
        log.debug("virt runner: %s not remembered as down: %s", minion, exc)


def forget(opts: SaltOpts, minion: str) -> None:
    """``minion`` signed a reply: no longer a suspect."""
    path = _file(opts, minion)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
