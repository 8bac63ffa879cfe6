"""saltvirt.base.procs on real processes."""

import os
import signal
import subprocess
import time

from saltvirt.base import procs


def test_a_mark_names_one_process_and_outlives_it():
    me = procs.mark()
    assert procs.alive(me) is True
    child = subprocess.Popen(["sleep", "30"])
    theirs = f"{child.pid} {procs.start_time(child.pid)}"
    assert procs.alive(theirs) is True
    child.kill()
    child.wait()
    assert procs.alive(theirs) is False and procs.start_time(child.pid) is None
    pid = me.split()[0]
    assert procs.alive(f"{pid} 1") is False  # same pid, another start: another process
    assert procs.alive("garbage") is None and procs.alive("") is None


def test_cmdlines_show_a_running_process():
    child = subprocess.Popen(["sleep", "31"])
    try:
        # Popen returns once exec has begun (its close-on-exec pipe closed); the kernel sets the new
        # program's arguments a moment later, and /proc shows an empty cmdline until then
        deadline = time.monotonic() + 10
        while _cmdline(child.pid) in ("", None) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (child.pid, ["sleep", "31", ""]) in list(procs.cmdlines())
    finally:
        child.kill()
        child.wait()


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return None


def test_a_killed_process_counts_as_exited_once_a_zombie():
    """What virt.cleanup waits for before detaching a loop device: the process (and its mount namespace) gone,
    even while nobody has reaped it yet."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not procs.exited(child.pid) and not procs.wait_exited(child.pid, 0.05)
        os.kill(child.pid, signal.SIGKILL)  # not reaped: a zombie
        assert procs.wait_exited(child.pid, 10) and os.path.exists(f"/proc/{child.pid}")
    finally:
        child.kill()
        child.wait()
    assert procs.exited(child.pid)


def test_kernel_state_says_what_a_stopped_process_waits_on():
    """What seeding logs of a qemu-storage-daemon that will not stop: its state and wchan."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not procs.kernel_state(child.pid).startswith("state T") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procs.kernel_state(child.pid).startswith("state T, wchan ")
    finally:
        child.kill()
        child.wait()
    assert procs.kernel_state(child.pid) == "state ?, wchan ?"


def test_started_at_is_when_a_process_began():
    import subprocess
    import time

    before = time.time()
    proc = subprocess.Popen(["sleep", "30"])
    try:
        started = procs.started_at(proc.pid)
        assert started is not None and before - 1 <= started <= time.time() + 1  # to a clock tick
    finally:
        proc.kill()
        proc.wait()
    assert procs.started_at(proc.pid) is None  # reaped: no such process
