"""Process identity: a pid alone is reused by the kernel, a pid with its start time is not; and the
command lines of this host's processes."""

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


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def exited(pid: int) -> bool:
    """Whether process ``pid`` has finished exiting: gone, or a zombie (its files, memory and namespaces
    are released already; only its parent's wait is missing)."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


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
