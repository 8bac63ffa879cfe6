"""RUN_TESTS_TIMELINE's CPU columns: each xdist worker moves itself into a cgroup (v1 ``cpuacct``) of its own,
so the daemons, CLIs and tools its tests start are charged to it, short-lived ones included (a scan of
/proc misses every process that lives less than its period). Here the guests' QEMU stays in the group of the
libvirtd that started it, the worker's, so ``cpu`` includes them; where libvirt makes its own ``machine`` group,
QEMU is charged there instead and read on its own (``qemu``). A machine without the controller gets no CPU
columns; nothing else changes."""

import os
import pathlib

CPUACCT = pathlib.Path("/sys/fs/cgroup/cpuacct")
_mine: pathlib.Path | None = None


def enter(worker: str) -> None:
    """Move this process into ``cpuacct/salt-virt-tests/<controller pid>-<worker>`` (children follow)."""
    global _mine
    group = CPUACCT / "salt-virt-tests" / f"{os.getppid()}-{worker}"
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    _mine = group


def _seconds(path: pathlib.Path) -> float | None:
    try:
        return int(path.read_text()) / 1e9
    except (OSError, ValueError):
        return None


def readings() -> dict[str, float]:
    """CPU-seconds so far: this worker's group (``cpu``) and every libvirt guest's (``qemu``)."""
    out = {}
    if _mine is not None and (cpu := _seconds(_mine / "cpuacct.usage")) is not None:
        out["cpu"] = cpu
    if (qemu := _seconds(CPUACCT / "machine" / "cpuacct.usage")) is not None:
        out["qemu"] = qemu
    return out
