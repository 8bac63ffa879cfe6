"""A hypervisor's answer "job <jid> is not running here" made true for good.

Salt's job check (``saltutil.find_job``) looks for the job's proc file, which the job's process writes only
after it loaded its modules: on a loaded minion a check can run in that gap and say "not running" of a job
that then runs. The runner falls over to another hypervisor on that answer, and the job would create the VM
a second time. So every job ``virt.answer`` runs registers here first (:func:`running_job`), and a check that
finds a job neither registered and alive nor in Salt's proc files fences its jid (:func:`still_running`):
a fenced job that starts later refuses to run. Both steps hold one lock, so a check and a start never cross.

Files in ``<cachedir>/salt-virt/jobs``: ``<jid>`` holds the job's :func:`saltvirt.base.procs.mark` while it
runs, or ``fenced``; fenced entries older than a day go (a job is published once)."""

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator

from salt.exceptions import CommandExecutionError

from saltvirt.base import fsutil, procs

FENCED = "fenced"
KEEP_FENCED = 86400  # seconds a fenced jid is remembered
_JID = re.compile(r"^[0-9A-Za-z_.-]{1,64}$")


def jobs_dir(cachedir: str) -> str:
    return os.path.join(cachedir, "salt-virt", "jobs")


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    os.makedirs(path, mode=0o700, exist_ok=True)
    with open(os.path.join(path, ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _entry(path: str, jid: str) -> str:
    if not _JID.match(jid):
        raise CommandExecutionError(f"not a job id: {jid!r}")
    return os.path.join(path, jid)


def _prune(path: str) -> None:
    """Fenced entries older than :data:`KEEP_FENCED` (the lock is held)."""
    cutoff = time.time() - KEEP_FENCED
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        with contextlib.suppress(OSError):
            if not name.startswith(".") and os.path.getmtime(entry) < cutoff and fsutil.read_text(entry) == FENCED:
                os.unlink(entry)


@contextlib.contextmanager
def running_job(cachedir: str, jid: str | None) -> Iterator[None]:
    """The block runs as job ``jid`` (registered for :func:`still_running`); raises CommandExecutionError,
    running nothing, when a check fenced the job before it started. No jid (a direct call): no fence."""
    if not jid:
        yield
        return
    path = jobs_dir(cachedir)
    entry = _entry(path, str(jid))
    with _locked(path):
        if fsutil.read_text(entry, None) == FENCED:
            raise CommandExecutionError(
                f"job {jid} did nothing: the master was told it was not running here and may have run it "
                "elsewhere (it started late: a loaded minion). Check where it ran before running it again"
            )
        fsutil.atomic_write(entry, procs.mark().encode(), 0o600)
    try:
        yield
    finally:
        with _locked(path), contextlib.suppress(FileNotFoundError):
            os.unlink(entry)


def still_running(cachedir: str, jid: str, salt_says: bool) -> bool:
    """Whether job ``jid`` runs here: registered by a live process, or not registered yet but in Salt's
    proc files (``salt_says``: about to register). Otherwise (never started, died, or ended) it is fenced:
    from now on it never starts here."""
    path = jobs_dir(cachedir)
    entry = _entry(path, str(jid))
    with _locked(path):
        mark = fsutil.read_text(entry, None)
        if mark == FENCED:
            return False
        if mark is not None:
            if procs.alive(mark):
                return True
        elif salt_says:
            return True
        _prune(path)
        fsutil.atomic_write(entry, FENCED.encode(), 0o600)
        return False
