"""saltvirt.vm.migrate_watch: a migration's progress and convergence. The libvirt test driver has no
migration jobs, so the watchdog's decisions are checked on domains that answer jobInfo() as a real
migration's job does (tests/integration/test_faults.py and bench/bench_migrate.py run real ones)."""

import threading

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.vm import migrate, migrate_watch
from tests.support.saltloader import make_minion_mods


def conf_get(mig):
    return lambda key, default=None: mig if key == "virt:migration" else default


def test_convergence_settings_default_and_are_checked():
    got = migrate.settings(conf_get({}))
    assert (got["converge"], got["converge_timeout"], got["max_downtime"]) == ("auto", 300.0, None)
    got = migrate.settings(conf_get({"converge": "postcopy", "converge_timeout": "45", "max_downtime": 200}))
    assert (got["converge"], got["converge_timeout"], got["max_downtime"]) == ("postcopy", 45.0, 200)
    for bad, match in (
        ({"converge": "forever"}, "virt:migration:converge must be one of auto, postcopy, none"),
        ({"converge_timeout": 0}, "virt:migration:converge_timeout must be"),
        ({"max_downtime": "soon"}, "virt:migration:max_downtime"),
    ):
        with pytest.raises(SaltInvocationError, match=match):
            migrate.settings(conf_get(bad))


def test_converge_flags_per_mode():
    auto, postcopy = libvirt.VIR_MIGRATE_AUTO_CONVERGE, libvirt.VIR_MIGRATE_POSTCOPY
    assert migrate_watch.converge_flags("auto", True, True, False, None) == (auto, "auto", [])
    assert migrate_watch.converge_flags("postcopy", True, True, False, None) == (postcopy, "postcopy", [])
    assert migrate_watch.converge_flags("none", True, True, False, None) == (0, "none", [])
    # a stopped or paused VM has no memory to converge
    assert migrate_watch.converge_flags("auto", False, True, False, None) == (0, "none", [])
    assert migrate_watch.converge_flags("postcopy", True, False, False, None) == (0, "none", [])
    # libvirt has no post-copy with a disk copy or a tunnel: auto-converge instead, said
    for tunnel, copy in ((False, "all"), (True, None)):
        flags, mode, warnings = migrate_watch.converge_flags("postcopy", True, True, tunnel, copy)
        assert (flags, mode) == (auto, "auto") and "auto-converge used" in warnings[0]


def test_max_downtime_stays_within_the_operators_cap():
    assert migrate_watch.downtime_ms(None, None) is None  # QEMU's own default (300 ms)
    assert migrate_watch.downtime_ms(None, 250) == 250  # the operator's default
    assert migrate_watch.downtime_ms(100, 250) == 100
    assert migrate_watch.downtime_ms("500", None) == 500
    with pytest.raises(SaltInvocationError, match=r"max_downtime=900 ms is above .*max_downtime: 250 ms"):
        migrate_watch.downtime_ms(900, 250)


def test_module_refuses_a_downtime_above_the_cap_before_anything_moves(tmp_path):
    mods = make_minion_mods(tmp_path, "test:///default", migration={"allow_cleartext": True, "max_downtime": 100})
    with pytest.raises(SaltInvocationError, match="is above what this hypervisor allows"):
        mods["virt.migrate"]("test", "hv2", transport="tcp", max_downtime=5000)
    assert mods["virt.vm_state"]("test") == {"test": "running"}


class BusyGuest:
    """A migration job that keeps moving memory and never ends: a guest dirtying memory faster than the
    link copies it (pre-copy's endless loop)."""

    def __init__(self):
        self.processed, self.aborted, self.postcopy = 0, threading.Event(), threading.Event()

    def jobInfo(self):
        self.processed += 1 << 20
        p = self.processed
        return [libvirt.VIR_DOMAIN_JOB_UNBOUNDED, 1000, 0, 1 << 30, p, 1 << 29, 1 << 30, p, 1 << 29, 0, 0, 0]

    def abortJob(self):
        self.aborted.set()

    def migrateStartPostCopy(self, flags):
        assert flags == 0
        self.postcopy.set()

    def UUIDString(self):
        return "00000000-0000-0000-0000-00000000beef"


def test_a_migration_that_never_converges_is_aborted():
    dom = BusyGuest()
    with migrate_watch.Watchdog(dom, 30, poll=0.02, converge="auto", converge_timeout=0.2) as dog:
        asked = dom.aborted.wait(10)  # a bound, not a speed: the old watchdog saw progress and never aborted
    assert asked and not dom.postcopy.is_set()
    assert dog.aborted.startswith("the guest's memory did not converge within 0.2 s (virt:migration:converge_timeout")
    assert "set virt:migration:converge: postcopy" in dog.aborted


def test_a_postcopy_migration_that_never_converges_is_switched_once():
    dom = BusyGuest()
    with migrate_watch.Watchdog(dom, 30, poll=0.02, converge="postcopy", converge_timeout=0.2) as dog:
        switched = dom.postcopy.wait(10)
        seen = dom.processed
        while dom.processed < seen + (20 << 20):  # it keeps watching (stalls) after the switch
            threading.Event().wait(0.02)
    assert switched and not dom.aborted.is_set() and dog.aborted is None
    assert dog.postcopy_after is not None and dog.postcopy_after >= 0.2


def test_the_convergence_clock_starts_with_the_memory_phase():
    """A disk copy (NBD, before any memory moves) may take long: it is not a failure to converge."""
    dom, asked, enough = BusyGuest(), iter(range(1, 1 << 30)), threading.Event()

    def disk_copy_only():  # data moves, memory does not (jobInfo()[7], memProcessed, stays 0)
        done = next(asked)
        if done >= 30:  # 30 samples: 15 times converge_timeout of watching
            enough.set()
        return [libvirt.VIR_DOMAIN_JOB_UNBOUNDED, 1000, 0, 1 << 30, done << 20, 1 << 29, 1 << 30, 0, 0, 0, 0, 0]

    dom.jobInfo = disk_copy_only
    with migrate_watch.Watchdog(dom, 30, poll=0.01, converge="auto", converge_timeout=0.02) as dog:
        assert enough.wait(30)  # a bound, not a speed
    assert not dom.aborted.is_set() and dog.aborted is None and dog.memory_since is None


class StuckMonitor:
    """A domain whose QEMU monitor blocks after one answer, as while QEMU copies a disk to an NBD peer
    behind a cut link (tests/integration/test_faults.py runs the real thing; here the watchdog's own
    bookkeeping, in milliseconds: the test driver has no migration jobs)."""

    def __init__(self):
        self.answered, self.release, self.abort_asked = 0, threading.Event(), threading.Event()

    def jobInfo(self):
        self.answered += 1
        if self.answered > 1:
            self.release.wait(30)  # blocked until the streams are cut
        return [libvirt.VIR_DOMAIN_JOB_UNBOUNDED, 1000, 0, 64, 16, 48, 0, 0, 0, 64, 16, 48]

    def abortJob(self):
        self.abort_asked.set()
        self.release.wait(30)  # queued behind the blocked query

    def UUIDString(self):
        return "00000000-0000-0000-0000-00000000dead"  # no QEMU has it: nothing to cut


def test_watchdog_aborts_when_the_job_query_itself_hangs(monkeypatch):
    monkeypatch.setattr(migrate_watch, "ABORT_GRACE", 0.05)
    dom = StuckMonitor()
    with migrate_watch.Watchdog(dom, 0.3, poll=0.02) as dog:
        asked = dom.abort_asked.wait(10)  # a bound, not a speed: a watchdog stuck on the query never asks
    dom.release.set()
    assert asked, "the watchdog waited on the blocked job query and never aborted"
    assert dog.aborted == "no progress for 0.3 s (virt:migration:stall_timeout): aborted"


class LibvirtSaid:
    """A libvirt error as migrateToURI3 raises it (the test driver cannot migrate)."""

    def __init__(self, msg):
        self.msg = msg

    def get_error_code(self):
        return libvirt.VIR_ERR_INTERNAL_ERROR

    def get_error_message(self):
        return self.msg


def test_a_hypervisor_without_postcopy_is_explained():
    """What this lab's QEMU said (bench/bench_migrate.py --proof): unprivileged, no userfaultfd."""
    said = "internal error: unable to execute QEMU command 'migrate-set-capabilities': Postcopy is not supported"
    hint = migrate._hint(LibvirtSaid(said), "hv2")
    assert "vm.unprivileged_userfaultfd = 1" in hint and "converge: auto" in hint


def test_the_sockets_to_cut_are_read_from_ss_with_listening_ones_among_them():
    """``ss -tanei`` as it prints a QEMU's sockets (this machine's ss, iproute2 6.1): a listening socket's peer is
    ``0.0.0.0:*``, which the stall watchdog's abort read as a port and died on (run K5: ValueError in the
    watchdog thread, the migration never aborted); only the outgoing migration stream is cut."""
    listing = (
        "State  Recv-Q Send-Q Local Address:Port Peer Address:PortProcess\n"
        "LISTEN 0      1            0.0.0.0:5900      0.0.0.0:*    ino:7001 sk:1 cgroup:/ <->\n"
        "LISTEN 0      1               [::]:5901         [::]:*    ino:7002 sk:2 cgroup:/ v6only:1 <->\n"
        "ESTAB  0      0        10.252.0.11:41234 10.252.0.15:49152 ino:7003 sk:3 cgroup:/ <->\n"
        "\t bbr wscale:7,7 rto:204 rtt:0.1/0.05 cwnd:10\n"
        "ESTAB  0      0        10.252.0.11:41235 10.252.0.15:49153 ino:9999 sk:4 cgroup:/ <->\n"
    )
    assert migrate_watch.migration_sockets(listing, {"7001", "7002", "7003"}) == [
        ("LISTEN", ("0.0.0.0", 5900), ("0.0.0.0", None)),
        ("LISTEN", ("::", 5901), ("::", None)),
        ("ESTAB", ("10.252.0.11", 41234), ("10.252.0.15", 49152)),
    ]


# The adaptive switch-over target (no max_downtime set). Samples shaped as libvirt's jobStats() answers during
# a live migration: memory_iteration is QEMU's dirty-sync-count, 1 during the first pass; an idle guest converges
# at the end of it (bench/bench_migrate.py's lab: its finished job says 3: setup, pass 1, final sync).
UNBOUNDED, NONE = libvirt.VIR_DOMAIN_JOB_UNBOUNDED, libvirt.VIR_DOMAIN_JOB_NONE


def stats(iteration, processed, remaining, kind=UNBOUNDED):
    got = {"type": kind, "memory_total": 128 << 20, "memory_processed": processed, "memory_remaining": remaining}
    return got if iteration is None else {**got, "memory_iteration": iteration}


IDLE = [stats(1, 20 << 20, 100 << 20), stats(1, 90 << 20, 30 << 20), {"type": NONE}]
BUSY = [stats(1, 40 << 20, 80 << 20), stats(1, 110 << 20, 10 << 20), stats(2, 130 << 20, 18 << 20)]
BUSY += [stats(2, 140 << 20, 9 << 20), stats(3, 150 << 20, 17 << 20)]


def observed(samples, **kw):
    adapt = migrate_watch.AdaptiveDowntime(**kw)
    return adapt, [adapt.observe(s) for s in samples]


def test_an_idle_guest_keeps_the_low_target():
    adapt, said = observed(IDLE)
    assert said == [None, None, None] and adapt.raised_at is None
    assert adapt.report() == {"max_downtime_ms": 50, "adaptive_downtime": {"start_ms": 50, "raised_at_pass": None}}


def test_a_guest_that_did_not_converge_in_its_first_pass_gets_qemus_target_once():
    adapt, said = observed(BUSY)
    assert said == [None, None, 300, None, None] and adapt.raised_at == 2
    assert adapt.report()["max_downtime_ms"] == 300
    _, said = observed(BUSY, raise_at=3)
    assert said == [None, None, None, None, 300]


def test_without_memory_iteration_a_rise_of_the_remaining_bytes_is_a_new_pass():
    """An older libvirt has no memory_iteration: QEMU's remaining bytes grow when a pass begins."""
    plain = [{k: v for k, v in s.items() if k != "memory_iteration"} for s in BUSY]
    before_memory = stats(None, 0, 128 << 20)  # a disk copy first: no memory moved, no pass yet
    _, said = observed([before_memory, *plain])
    assert said == [None, None, None, 300, None, None]
    _, said = observed([{k: v for k, v in s.items() if k != "memory_iteration"} for s in IDLE])
    assert said == [None, None, None]


def test_the_adaptive_target_only_without_max_downtime_and_for_a_live_migration():
    got, adapt = migrate_watch.downtime_plan(None, None, True, True)
    assert got == 50 and adapt is not None and adapt.full == 300
    assert migrate_watch.downtime_plan(None, 250, True, True) == (250, None)  # the operator's: fixed
    assert migrate_watch.downtime_plan("100", 250, True, True) == (100, None)  # the caller's: fixed
    assert migrate_watch.downtime_plan(None, None, True, False) == (None, None)  # paused: no switch-over race
    assert migrate_watch.downtime_plan(None, None, False, True) == (None, None)  # offline
    with pytest.raises(SaltInvocationError, match="is above what this hypervisor allows"):
        migrate_watch.downtime_plan(900, 250, True, True)


class PassingGuest(BusyGuest):
    """A job that answers ``samples`` in turn (then the last again), and records the targets set."""

    def __init__(self, samples):
        super().__init__()
        self.samples, self.asked, self.targets, self.set = samples, 0, [], threading.Event()

    def jobStats(self):
        self.asked += 1
        return self.samples[min(self.asked, len(self.samples)) - 1]

    def migrateSetMaxDowntime(self, ms, flags):
        assert flags == 0
        self.targets.append(ms)
        self.set.set()


def test_the_watchdog_raises_the_target_of_a_busy_guest_once():
    dom = PassingGuest(BUSY)
    with migrate_watch.Watchdog(dom, 30, poll=0.01, adapt=migrate_watch.AdaptiveDowntime()):
        raised = dom.set.wait(10)  # a bound, not a speed
        asked = dom.asked
        while dom.processed < (40 << 20):  # 40 more samples: it stops asking for stats once raised
            threading.Event().wait(0.01)
    assert raised and dom.targets == [300] and dom.asked == asked


def test_the_watchdog_leaves_an_idle_guest_at_the_low_target():
    dom = PassingGuest(IDLE[:2])
    with migrate_watch.Watchdog(dom, 30, poll=0.01, adapt=migrate_watch.AdaptiveDowntime()):
        while dom.asked < 20:
            threading.Event().wait(0.01)
    assert dom.targets == []


def test_a_refused_adaptive_start_leaves_qemus_target_and_a_refused_fixed_one_fails():
    """The test driver has no migration parameters: libvirt refuses migrateSetMaxDowntime, as an older one may."""
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    start, adapt = migrate_watch.downtime_plan(None, None, True, True)
    assert migrate_watch.set_downtime(dom, start, adapt) == (None, None)  # the default: migrate anyway
    with pytest.raises(libvirt.libvirtError):
        migrate_watch.set_downtime(dom, 100, None)  # the operator's or caller's: not silently dropped
    assert migrate_watch.set_downtime(dom, None, None) == (None, None)
