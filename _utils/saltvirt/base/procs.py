"""Process identity: a pid alone is reused by the kernel, a pid with its start time is not; and the
command lines of this host's processes."""

import functools
import os
import time
from collections.abc import Iterator


def cmdlines() -> Iterator[tuple[int, list[str]]]:
    """``(pid, argv)`` of every process this host shows in /proc (those gone meanwhile are skipped)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and args[0]:
            yield int(pid), args


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]``: the state), or None without the process."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if there is no such process."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


@functools.cache
def _boot_time() -> int | None:
    """When this host booted (seconds since the epoch, /proc/stat's ``btime``): read once, it cannot change while
    this process runs."""
    try:
        with open("/proc/stat") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, to a clock tick), or None if there is no such process
    (or /proc/stat has no boot time)."""
    ticks, boot = start_time(pid), _boot_time()
    if ticks is None or boot is None:
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def exited(pid: int) -> bool:
    """Whether process ``pid`` has finished exiting: gone, or a zombie (its files, memory and namespaces
    are released already; only its parent's wait is missing)."""
    fields = _stat(pid)
    return not fields or fields[0] == "Z"


def kernel_state(pid: int) -> str:
    """What process ``pid`` waits on, from /proc (its state and wchan): for the log when it will not stop."""
    fields = _stat(pid)
    try:
        with open(f"/proc/{int(pid)}/wchan", encoding="ascii", errors="replace") as fh:
            wchan = fh.read().strip()
    except OSError:
        wchan = ""
    return f"state {fields[0] if fields else '?'}, wchan {wchan or '?'}"


def wait_exited(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has :func:`exited` within ``seconds`` (polled every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not exited(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def mark() -> str:
    """``"<pid> <start time>"`` of this process, for :func:`alive` to check later."""
    return f"{os.getpid()} {start_time(os.getpid())}"


def alive(marked: str) -> bool | None:
    """Whether the process a :func:`mark` names still runs (same pid, same start time); None when
    ``marked`` is not a mark."""
    try:
        pid, start = (int(x) for x in str(marked).split())
    except ValueError:
        return None
    return start_time(pid) == start
