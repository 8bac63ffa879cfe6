"""A running migration's progress and convergence: the watchdog :func:`saltvirt.vm.migrate.migrate` runs
beside libvirt's ``migrateToURI3``.

* no progress (no data moved for ``virt:migration:stall_timeout`` seconds: a cut link, a hung target):
  the job is aborted, and its connections closed when QEMU blocks on the dead peer; the VM stays here;
* no convergence (a guest that dirties its memory faster than the link copies it: pre-copy would run
  forever): QEMU's auto-converge throttles the guest's vCPUs (``converge: auto``, the default); once the
  memory phase ran ``virt:migration:converge_timeout`` seconds the migration is switched to post-copy
  (``converge: postcopy``: the VM runs on the target from then on, fetching the rest of its memory from
  here) or aborted (``auto`` / ``none``: the VM stays here, the error says which setting to change).

Settings (minion config only, ``virt:migration``)::

    stall_timeout: 60        # seconds without progress -> aborted
    converge: auto           # auto (QEMU auto-converge) | postcopy | none
    converge_timeout: 300    # seconds of memory copying -> post-copy (converge: postcopy) or aborted
    max_downtime: 300        # ms the guest may pause at the switch-over: default and cap of a caller's
                             # (unset: adaptive, see below)

Adaptive switch-over target (neither the operator nor the caller set ``max_downtime``): QEMU's switch-over
runs longer than its estimate on a loaded host (an idle TCG guest paused up to 0.9 s against the 300 ms
target), so a live migration starts at :data:`ADAPTIVE_START` ms, where an idle guest converges after one
memory pass with a short pause, and the watchdog raises the target to QEMU's :data:`QEMU_DOWNTIME` once
the job's ``memory_iteration`` reaches :data:`ADAPTIVE_RAISE_AT` (it did not converge at the low target).
Passes shorter than the watchdog's poll may end before it sees them: such a busy guest converges at the low
target after a few more short passes. An explicit ``max_downtime`` is a fixed target.
"""

import contextlib
import logging
import os
import subprocess
import threading
import time
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import procs, validate
from saltvirt.base.salttypes import Data, Domain
from saltvirt.host.conn import libvirt

log = logging.getLogger(__name__)

STALL_TIMEOUT = 60.0  # seconds a migration may move no data before it is aborted (virt:migration:stall_timeout)
ABORT_GRACE = 10.0  # seconds an aborted migration may take to end before its streams are cut
MIGRATION_PORTS = range(49152, 49216)  # libvirt's migration_port_min..max: the target's migration and NBD ports
CONVERGE_MODES = ("auto", "postcopy", "none")
CONVERGE_TIMEOUT = 300.0  # seconds of memory copying before post-copy or an abort (virt:migration:converge_timeout)
QEMU_DOWNTIME = 300  # ms: QEMU's own switch-over target (downtime-limit)
ADAPTIVE_START = 50  # ms: the adaptive target's start (bench: idle gaps ~66 ms at 50, up to 0.9 s at 300)
# libvirt's memory_iteration (QEMU's dirty-sync-count) from which the target is QEMU_DOWNTIME: it is 1 during
# the first pass, 2 once that pass did not converge (a finished job counts the final sync too: an idle guest
# that converged after the first pass ends at 3): a busy guest's later passes run at QEMU's target
ADAPTIVE_RAISE_AT = 2


def converge_settings(mig: Data) -> Data:
    """``converge``, ``converge_timeout`` and ``max_downtime`` of ``virt:migration``, checked."""
    mode = mig.get("converge") or "auto"
    if mode not in CONVERGE_MODES:
        raise SaltInvocationError(f"virt:migration:converge must be one of {', '.join(CONVERGE_MODES)}, not {mode!r}")
    timeout = mig.get("converge_timeout")
    downtime = mig.get("max_downtime")
    return {
        "converge": mode,
        "converge_timeout": CONVERGE_TIMEOUT
        if timeout is None
        else validate.seconds(timeout, "virt:migration:converge_timeout"),
        "max_downtime": None if downtime is None else validate.positive_int(downtime, "virt:migration:max_downtime"),
    }


def downtime_ms(asked: Any, cap: int | None) -> int | None:
    """The switch-over pause to set: the caller's ``max_downtime`` (ms) within the operator's
    ``virt:migration:max_downtime``, which is also the default (None: QEMU's own, 300 ms)."""
    if not asked:
        return cap
    asked = validate.positive_int(asked, "max_downtime (ms)")
    if cap is not None and asked > cap:
        raise SaltInvocationError(
            f"max_downtime={asked} ms is above what this hypervisor allows (virt:migration:max_downtime: {cap} ms)"
        )
    return asked


class AdaptiveDowntime:
    """The adaptive switch-over target's decision, fed one job sample at a time (``jobStats()``'s dict):
    :meth:`observe` returns the target to set once (``full``) when the memory phase reached pass
    ``raise_at`` without converging at ``start``, else None. The pass is libvirt's ``memory_iteration``;
    without it (an older libvirt), each rise of ``memory_remaining`` counts as a new pass (QEMU adds the
    pages dirtied during a pass when the next one begins)."""

    def __init__(self, start=ADAPTIVE_START, full=QEMU_DOWNTIME, raise_at=ADAPTIVE_RAISE_AT):
        self.start, self.full, self.raise_at = start, full, raise_at
        self.raised_at: int | None = None  # the pass at which it was raised
        self._passes, self._remaining = 0, None

    def observe(self, stats: Data) -> int | None:
        if self.raised_at is not None or stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) == libvirt.VIR_DOMAIN_JOB_NONE:
            return None
        passes = stats.get("memory_iteration")
        if passes is None:
            remaining = stats.get("memory_remaining")
            if remaining is not None and stats.get("memory_processed"):
                if self._remaining is None or remaining > self._remaining:
                    self._passes += 1
                self._remaining = remaining
            passes = self._passes
        if int(passes) < self.raise_at:
            return None
        self.raised_at = int(passes)
        return self.full

    def report(self) -> Data:
        """What a migration's answer says of it (``converge``): the target in force at the end."""
        return {
            "max_downtime_ms": self.full if self.raised_at else self.start,
            "adaptive_downtime": {"start_ms": self.start, "raised_at_pass": self.raised_at},
        }


def downtime_plan(asked: Any, cap: int | None, active: bool, live: bool) -> tuple[int | None, Any]:
    """The switch-over target to set before the migration and its :class:`AdaptiveDowntime` (None: fixed):
    adaptive only for a live migration of a running VM with no ``max_downtime`` from caller or operator."""
    downtime = downtime_ms(asked, cap) if active else None
    if downtime is not None or not (active and live):
        return downtime, None
    adapt = AdaptiveDowntime()
    return adapt.start, adapt


def set_downtime(dom: Domain, downtime: int | None, adapt: Any) -> tuple[int | None, Any]:
    """Set the switch-over target before the migration; returns the target and the adaptation in force. A
    fixed target libvirt refuses fails the migration (the caller's libvirtError); the adaptive start is a
    default, so a refusal leaves QEMU's own target, logged, and nothing to adapt."""
    if not downtime:
        return None, None
    try:
        dom.migrateSetMaxDowntime(downtime, 0)
    except libvirt.libvirtError as exc:
        if adapt is None:
            raise
        log.warning("salt-virt: no adaptive switch-over target (%s): QEMU's own used", exc.get_error_message())
        return None, None
    return downtime, adapt


def converge_flags(
    mode: str, active: bool, live: bool, tunnel: bool, copy_storage: str | None
) -> tuple[int, str, list]:
    """libvirt flags for ``converge`` ``mode``, the mode in effect and warnings. Post-copy needs a live
    migration without a tunnel or a disk copy (libvirt refuses those): there it gives way to auto-converge."""
    if not (active and live):
        return 0, "none", []
    warnings = []
    if mode == "postcopy" and (tunnel or copy_storage):
        why = "a tunnelled migration" if tunnel else "a disk copy (copy_storage)"
        warnings.append(f"virt:migration:converge postcopy: libvirt has no post-copy with {why}: auto-converge used")
        mode = "auto"
    flags = {"auto": libvirt.VIR_MIGRATE_AUTO_CONVERGE, "postcopy": libvirt.VIR_MIGRATE_POSTCOPY}.get(mode, 0)
    return flags, mode, warnings


def stall_bound(value: Any) -> float:
    """``virt:migration:stall_timeout`` checked: seconds (default :data:`STALL_TIMEOUT`)."""
    return STALL_TIMEOUT if value is None else validate.seconds(value, "virt:migration:stall_timeout")


def _qemu_pid(uuid):
    """The pid of the QEMU running the domain ``uuid`` on this host, or None."""
    for pid, args in procs.cmdlines():
        qemu = os.path.basename(args[0]).startswith("qemu-system") and "-uuid" in args[:-1]
        if qemu and args[args.index("-uuid") + 1] == uuid:
            return pid
    return None


def _split_addr(text):
    """``(host, port)`` of an ``ss`` address; port None for ``*`` (a listening socket's peer: ``0.0.0.0:*``)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), None if port == "*" else int(port)


def migration_sockets(listing: str, inodes: set[str]) -> list[tuple[str, tuple, tuple]]:
    """``(state, (host, port), (peer host, peer port))`` of the sockets in ``ss -tanei``'s ``listing`` whose inode
    is in ``inodes`` (one process's): what :func:`cut_migration_streams` chooses from."""
    mine = []
    for line in listing.splitlines():
        fields = line.split()
        ino = next((f[4:] for f in fields if f.startswith("ino:")), None)
        if len(fields) > 4 and ino in inodes:
            mine.append((fields[0], _split_addr(fields[3]), _split_addr(fields[4])))
    return mine


def cut_migration_streams(uuid: str) -> list[str]:
    """Close (``ss -K``, in QEMU's own network namespace) the TCP connections the QEMU of domain
    ``uuid`` opened to a migration port (:data:`MIGRATION_PORTS`): its migration stream and its NBD disk
    copies. An aborted migration whose peer vanished otherwise waits for TCP to give up (minutes) before
    QEMU lets go. Returns the connections closed (``local -> peer``)."""
    pid = _qemu_pid(uuid)
    if pid is None:
        return []
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ns = ["nsenter", "-t", str(pid), "-n", "--"]
    listing = subprocess.run([*ns, "ss", "-tanei"], capture_output=True, text=True, check=False).stdout
    mine = migration_sockets(listing, inodes)
    listening = {local[1] for state, local, _peer in mine if state == "LISTEN"}
    closed = []
    for state, local, peer in mine:
        if state == "LISTEN" or local[1] in listening or peer[1] not in MIGRATION_PORTS:
            continue  # not an outgoing migration connection (a VNC client, a listening socket)
        filt = ["src", local[0], "sport", "=", f":{local[1]}", "dst", peer[0], "dport", "=", f":{peer[1]}"]
        if subprocess.run([*ns, "ss", "-K", "-tn", *filt], capture_output=True, check=False).returncode == 0:
            closed.append(f"{local[0]}:{local[1]} -> {peer[0]}:{peer[1]}")
    return closed


class Watchdog:
    """Aborts a domain's migration job once it moved no data for ``bound`` seconds (a peer that stopped
    answering: a cut link, a hung target), so the call returns without waiting for the network; the VM
    keeps running on the source. Progress: libvirt's job counters (data, memory and disk bytes). A job
    query that does not answer counts as no progress: while QEMU copies a disk to a dead NBD peer its
    monitor blocks, and libvirt's jobInfo() and abortJob() wait on it. So both run in threads of their
    own, and an aborted job that does not end within :data:`ABORT_GRACE` gets its migration connections
    closed (:func:`cut_migration_streams`), which unblocks QEMU.

    Convergence: once the memory phase (memory bytes processed) has run ``converge_timeout`` seconds, a
    ``postcopy`` migration is switched to post-copy (once), any other is aborted: pre-copy of a guest that
    dirties memory faster than the link copies it never ends by itself.

    ``adapt`` (an :class:`AdaptiveDowntime`): the job's ``jobStats()`` is read beside its ``jobInfo()`` and
    the switch-over target raised (``migrateSetMaxDowntime``) when it says so."""

    def __init__(self, dom, bound, poll=1.0, converge="none", converge_timeout=None, adapt=None):
        self.dom, self.bound, self.poll, self.adapt = dom, bound, poll, adapt
        self.converge, self.converge_timeout = converge, converge_timeout
        self.aborted, self._stop, self.moved = None, threading.Event(), 0  # moved: bytes seen processed (metrics)
        self.memory_since: float | None = None  # when the memory phase began (monotonic)
        self.postcopy_after: float | None = None  # seconds into the memory phase it was switched to post-copy
        self._pending: tuple[Data, threading.Event] | None = None  # (answer box, done event) of a waiting jobInfo()
        self._last_stats: Data | None = None  # jobStats() of the last answered sample (adapt only)
        self._thread = threading.Thread(target=self._watch, name="salt-virt-migration-watchdog", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(self.poll * 2 + 30)

    def _watch(self):
        seen, since = None, time.monotonic()
        while not self._stop.wait(self.poll):
            info = self._sample()
            self._adapt()
            if info is not None and info[0] != libvirt.VIR_DOMAIN_JOB_NONE:
                self.moved = max(self.moved, int(info[4]))  # jobInfo()[4]: dataProcessed
                if self.memory_since is None and int(info[7]) > 0:  # jobInfo()[7]: memProcessed
                    self.memory_since = time.monotonic()
            if self._converged_or_acted():
                return
            if info is not None and (info[0] == libvirt.VIR_DOMAIN_JOB_NONE or tuple(info[3:]) != seen):
                seen, since = tuple(info[3:]), time.monotonic()
                continue
            if time.monotonic() - since >= self.bound:
                self._abort(f"no progress for {self.bound:g} s (virt:migration:stall_timeout): aborted")
                return

    def _converged_or_acted(self):
        """Past ``converge_timeout`` in the memory phase: switch to post-copy (then keep watching for
        stalls: False) or abort (True: the watch is over)."""
        if self.memory_since is None or self.converge_timeout is None or self.postcopy_after is not None:
            return False
        running = time.monotonic() - self.memory_since
        if running < self.converge_timeout:
            return False
        if self.converge == "postcopy":
            self.postcopy_after = round(running, 3)
            _in_thread(lambda: self.dom.migrateStartPostCopy(0), "salt-virt-migration-postcopy")
            return False
        hint = "converge: postcopy" if self.converge == "auto" else "converge: auto or postcopy"
        self._abort(
            f"the guest's memory did not converge within {self.converge_timeout:g} s "
            f"(virt:migration:converge_timeout, converge: {self.converge}): aborted; the guest dirties memory "
            f"faster than the link copies it: set virt:migration:{hint}, a longer converge_timeout, or more bandwidth"
        )
        return True

    def _adapt(self):
        """Raise the switch-over target if the adaptive decision says so (the last sample's stats)."""
        stats = self._last_stats
        self._last_stats = None
        if self.adapt is None or stats is None:
            return
        target = self.adapt.observe(stats)
        if target is not None:
            _in_thread(lambda: self.dom.migrateSetMaxDowntime(target, 0), "salt-virt-migration-downtime")

    def _sample(self):
        """The job's counters if libvirt answers within ``poll`` seconds, else None (no news: a refused
        query while the job changes phase, or a monitor blocked on a dead peer: asked again once it answers)."""
        if self._pending is None:
            box: Data = {}
            done = threading.Event()
            self._pending = (box, done)
            _in_thread(lambda: self._query(box), "salt-virt-migration-jobinfo", done)
        box, done = self._pending
        if not done.wait(self.poll):
            return None
        self._pending = None
        self._last_stats = box.get("stats")
        return box.get("info")

    def _query(self, box):
        box["info"] = self.dom.jobInfo()
        if self.adapt is not None and self.adapt.raised_at is None:
            box["stats"] = self.dom.jobStats()

    def _abort(self, why):
        self.aborted = why
        _in_thread(self.dom.abortJob, "salt-virt-migration-abort")
        if self._stop.wait(ABORT_GRACE):
            return
        closed = cut_migration_streams(self.dom.UUIDString())
        if closed:
            self.aborted += f", its connections to the unreachable target closed ({', '.join(closed)})"


def _in_thread(call, name, done=None):
    """Run libvirt ``call`` in a daemon thread (it may block on a QEMU monitor); ``done`` (an Event), if
    given, is set when it returned or failed (a libvirt error is the job changing phase or already gone:
    ignored)."""

    def run():
        try:
            call()
        except libvirt.libvirtError:
            pass
        finally:
            if done is not None:
                done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
