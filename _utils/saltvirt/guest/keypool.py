"""New minions' key pairs made ahead of the ``virt.init`` that seeds them.

An RSA 2048 pair takes 14-80 ms of CPU on a quiet host and several times that on a busy one, and the
seeding waits for it: it was most of what seeding added to ``virt.init`` (issue #40). The hypervisor
keeps ``size`` pairs ready in ``<cachedir>/saltvirt/keypool`` (a directory of its own, mode 0700; each
pair one file, mode 0600). :func:`take` claims one by an atomic rename (two inits never get the same
pair), reads it and removes it, then starts a detached refill (this file run as a script, one at a
time under a lock) that tops the pool up while the init goes on; with none ready, the caller makes a
pair itself as before. A pair never leaves this host but into the image of the VM it was taken for,
which is as root-only as the pool. ``size`` 0 keeps no pool.
"""

import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable

from salt.exceptions import SaltInvocationError

from saltvirt.base import fsutil

log = logging.getLogger(__name__)

SUFFIX = ".pair"  # a ready pair; a claimed one is renamed away from it first
LOCK = ".refill.lock"  # held by the one refill that runs


def ready(pool: str) -> list[str]:
    """The ready pairs' file names (oldest first: names start with a nanosecond clock)."""
    if not fsutil.ours_alone(pool, 0o077):
        return []
    return sorted(n for n in os.listdir(pool) if n.endswith(SUFFIX))


DEFAULT_SIZE = 2  # a size to opt in with: one pair for the next init and one for a second right after it
MAX_SIZE = 64


def location(cache_dir: str | None) -> str | None:
    """The pool in a minion's salt-virt cache directory (``<cachedir>/saltvirt``)."""
    return os.path.join(cache_dir, "keypool") if cache_dir else None


def pool_size(value: object) -> int:
    """``virt:insecure_seed_key_pool``, checked: how many pairs to keep ready (0: none)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise SaltInvocationError(
            f"virt:insecure_seed_key_pool must be a whole number from 0 to {MAX_SIZE}, not {value!r}"
        )
    return value


def take(pool: str | None, size: int) -> tuple[str, str] | None:
    """A ready pair ``(public PEM, private PEM)`` claimed for this caller alone, or None (none ready, no
    pool). The caller starts the :func:`refill` once its own work is done."""
    if not pool or size <= 0:
        return None
    pair = None
    for name in ready(pool):
        claimed = os.path.join(pool, f"{name}.taken-{os.getpid()}")
        try:
            os.rename(os.path.join(pool, name), claimed)  # atomic: only one claimer succeeds
        except OSError:
            continue  # another init took it first
        try:
            fd = os.open(claimed, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as fh:
                st = os.fstat(fh.fileno())
                data = json.load(fh) if st.st_uid == os.geteuid() and not st.st_mode & 0o077 else None
        except (OSError, ValueError) as exc:
            log.warning("keypool: unreadable pair %s skipped: %s", claimed, exc)
            data = None
        finally:
            try:
                os.unlink(claimed)
            except OSError as exc:
                log.warning("keypool: cannot remove the claimed pair %s: %s", claimed, exc)
        if isinstance(data, dict) and isinstance(data.get("pub"), str) and isinstance(data.get("priv"), str):
            pair = (data["pub"], data["priv"])
            break
    return pair


def refill(pool: str | None, size: int) -> subprocess.Popen | None:
    """Start the detached refill of ``pool`` to ``size`` pairs (it outlives a minion's job process); None
    when it is full, not kept or cannot be made."""
    if not pool or size <= 0:
        return None
    try:
        os.makedirs(pool, mode=0o700, exist_ok=True)
    except OSError as exc:
        log.warning("keypool: cannot make %s: %s", pool, exc)
        return None
    if not fsutil.ours_alone(pool, 0o077):
        log.warning("keypool: %s is not this user's alone: no pairs kept there", pool)
        return None
    if len(ready(pool)) >= size:
        return None
    here = os.path.abspath(__file__)
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # where this copy of saltvirt lives
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        return subprocess.Popen(
            [sys.executable, here, pool, str(size)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not the job's: it finishes after the job
            env=env,
        )
    except OSError as exc:
        log.warning("keypool: cannot start a refill of %s: %s", pool, exc)
        return None


def fill(pool: str, size: int, make: Callable[[], tuple[str, str]]) -> int:
    """Make pairs with ``make`` until ``pool`` holds ``size``, unless another fill runs: how many were made."""
    if not fsutil.ours_alone(pool, 0o077):
        return 0
    fd = os.open(os.path.join(pool, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # the one running fills it
        for name in os.listdir(pool):  # a claimer that died between its claim and the removal
            pid = name.rpartition(".taken-")[2]
            if ".taken-" in name and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                os.unlink(os.path.join(pool, name))
        made = 0
        while len(ready(pool)) < size:
            pub, priv = make()
            name = f"{time.time_ns()}-{os.getpid()}{SUFFIX}"  # sorts oldest first
            fsutil.atomic_write(os.path.join(pool, name), json.dumps({"pub": pub, "priv": priv}).encode(), 0o600)
            made += 1
        return made
    finally:
        os.close(fd)


if __name__ == "__main__":
    from saltvirt.pki import envelope

    fill(sys.argv[1], int(sys.argv[2]), envelope.new_keypair)
