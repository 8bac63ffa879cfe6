"""Process identity: a pid alone is reused by the kernel, a pid with its start time is not."""

import os


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


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
