"""saltvirt.fleet.fleetstate: locks and reservations through salt.cache, on localfs (one master) and on a
real redis-server (several masters). "Masters" here are opts with different ids sharing the store."""

import os
import signal
import subprocess
import threading
import time

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import procs
from saltvirt.fleet import fleetstate, placement


@pytest.fixture
def redis_backend(request, tmp_path):
    """``make(master_id) -> opts`` on the real redis-server only."""
    import salt.config

    server = request.getfixturevalue("redis_server")
    server.client().flushdb()

    def make(mid="m1"):
        opts = salt.config.master_config(None)
        opts.update({"id": mid, "cachedir": str(tmp_path / "cache"), "virt": {}}, **server.master_opts())
        return opts

    return make


def record(opts, name, **over):
    """Write a lock entry as another holder would have left it."""
    now = time.time()
    rec = {
        "token": "other",
        "kind": "init",
        "name": name,
        "owner": {"master": "m2", "host": "elsewhere", "pid": 4242, "pid_start": 1, "job": "2026"},
        "taken": now,
        "renewed": now,
        "expires": now + 60,
        "ttl": 60,
        "detail": {},
    }
    rec.update(over)
    fleetstate.Store(opts).transact(fleetstate.LOCKS, name, lambda old: rec)
    return rec


def test_one_holder_and_the_refusal_says_who(backend):
    m1, m2 = backend("m1"), backend("m2")
    with fleetstate.lock(m1, ["web1", "web1"], job="20261123") as lease:
        assert lease.names == ["web1"] and not lease.taken_over
        with pytest.raises(fleetstate.HeldError) as err:
            with fleetstate.lock(m2, ["db1", "web1"]):
                pass
        msg = str(err.value)
        assert "'web1' is held: init by master m1 (host " in msg and "job 20261123" in msg, msg
        # the refused call gave back what it took (db1) and left web1 alone
        held = fleetstate.holders(m2)
        assert sorted(held) == ["web1"] and held["web1"]["token"] == lease.token
    assert fleetstate.holders(m1) == {}
    with fleetstate.lock(m2, ["web1"]):
        pass


def hold_until(decided, wait=30):
    """Keep a lock until every racer ``decided()`` (bounded: ``wait`` s): a fixed 0.3-0.5 s hold was the whole
    test's time, and one a loaded machine could outlast (a racer starting after the release would win too)."""
    deadline = time.monotonic() + wait
    while not decided() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_racing_masters_exactly_one_wins(backend):
    winners, refused, start = [], [], threading.Barrier(8)

    def contend(i):
        opts = backend(f"m{i}")
        start.wait()
        try:
            with fleetstate.lock(opts, ["web1"]):
                winners.append(i)
                hold_until(lambda: len(winners) + len(refused) == 8)  # the others decide while it is held
        except fleetstate.HeldError as exc:
            refused.append(exc.record["owner"]["master"])

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(refused) == 7, (winners, refused)
    assert set(refused) == {f"m{winners[0]}"}  # every loser names the winner


def test_dead_local_owner_is_taken_over_at_once_and_reported(backend):
    opts = backend("m1")
    gone = subprocess.Popen(["true"])
    gone.wait()
    me = fleetstate.me(opts)
    record(opts, "web1", owner=dict(me, pid=gone.pid, pid_start=12345, job="J1"))  # lease still valid
    with fleetstate.lock(opts, ["web1"]) as lease:
        (over,) = lease.taken_over
        assert over["name"] == "web1" and over["why"] == "its process is gone" and "job J1" in over["was"]


def test_live_local_owner_is_never_broken_even_expired(backend):
    opts = backend("m1")
    alive = subprocess.Popen(["sleep", "30"])
    try:
        owner = dict(fleetstate.me(opts), pid=alive.pid, pid_start=procs.start_time(alive.pid))
        record(opts, "web1", owner=owner, expires=time.time() - 600)
        with pytest.raises(fleetstate.HeldError, match="its lease expired, but the process is alive"):
            with fleetstate.lock(opts, ["web1"]):
                pass
    finally:
        alive.kill()
        alive.wait()
    with fleetstate.lock(opts, ["web1"]) as lease:  # now gone: taken over
        assert lease.taken_over[0]["why"] == "its process is gone"


def test_other_masters_lock_waits_for_its_expiry(backend):
    opts = backend("m1")
    record(opts, "web1")  # m2's, valid
    with pytest.raises(fleetstate.HeldError, match="by master m2 .*pid 4242, job 2026"):
        with fleetstate.lock(opts, ["web1"]):
            pass
    record(opts, "web1", expires=time.time() - 1)
    with fleetstate.lock(opts, ["web1"]) as lease:
        assert lease.taken_over[0]["why"] == "expired" and lease.taken_over[0]["stale"]["owner"]["master"] == "m2"


def test_lease_is_renewed_while_held_and_a_lost_lease_stops_the_holder(backend):
    m1, m2 = backend("m1", lock_ttl=3), backend("m2")
    with fleetstate.lock(m1, ["web1"]) as lease:
        first = fleetstate.holders(m1)["web1"]["expires"]
        time.sleep(4)  # longer than the ttl: only the renewals keep it
        assert fleetstate.holders(m1)["web1"]["expires"] > first
        with pytest.raises(fleetstate.HeldError):
            with fleetstate.lock(m2, ["web1"]):
                pass
        lease.check()
        record(m1, "web1")  # somebody broke it (an operator, or a master with a skewed clock)
        lease.renew()
        with pytest.raises(CommandExecutionError, match="lost the lock of 'web1' while working .*master m2"):
            lease.check()
    assert fleetstate.holders(m1)["web1"]["token"] == "other"  # release never removes another's lock


def test_redis_entries_are_the_cache_drivers_own(redis_backend):
    import salt.cache

    opts = redis_backend("m1")
    with fleetstate.lock(opts, ["web1"]) as lease:
        cache = salt.cache.Cache(opts)
        assert cache.fetch(fleetstate.LOCKS, "web1")["token"] == lease.token  # Salt's driver reads it
        assert "web1" in cache.list(fleetstate.LOCKS) and cache.updated(fleetstate.LOCKS, "web1")
        store = fleetstate.Store(opts)  # and salt-virt's own reads (its client has timeouts) read the driver's
        assert store.fetch(fleetstate.LOCKS, "web1") == cache.fetch(fleetstate.LOCKS, "web1")
        assert store.entries(fleetstate.LOCKS) == {"web1": cache.fetch(fleetstate.LOCKS, "web1")}
    assert not salt.cache.Cache(opts).contains(fleetstate.LOCKS, "web1")
    assert fleetstate.Store(opts).fetch(fleetstate.LOCKS, "web1") is None
    assert fleetstate.Store(opts).entries(fleetstate.LOCKS) == {}


def test_a_hung_store_fails_reads_and_updates_within_the_timeout(redis_backend, redis_server, monkeypatch):
    """redis stopped (SIGSTOP: it accepts nothing, refuses nothing, like a cut network): every call fails
    after REDIS_TIMEOUT instead of waiting for it."""
    monkeypatch.setattr(fleetstate, "REDIS_TIMEOUT", 0.5)
    store = fleetstate.Store(redis_backend("m1"))
    store.transact(fleetstate.LOCKS, "web1", lambda old: {"token": "t"})  # connected before the fault
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(CommandExecutionError, match=r"redis \(127\.0\.0\.1:\d+\)\) cannot be read: Timeout"):
            store.fetch(fleetstate.LOCKS, "web1")
        with pytest.raises(CommandExecutionError, match=r"redis \(127\.0\.0\.1:\d+\)\) cannot be updated: Timeout"):
            store.transact(fleetstate.LOCKS, "web1", lambda old: None)
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert store.fetch(fleetstate.LOCKS, "web1") == {"token": "t"}  # answers again: the same client works


def test_redis_cluster_mode_is_refused(redis_backend):
    opts = redis_backend("m1")
    opts["cache.redis.cluster_mode"] = True
    with pytest.raises(CommandExecutionError, match="cluster_mode is not supported"):
        fleetstate.Store(opts)


def test_unreachable_store_is_a_clear_error(redis_backend):
    opts = redis_backend("m1")
    opts["cache.redis.port"] = 1  # nothing listens there
    with pytest.raises(
        CommandExecutionError, match=r"shared runner state \(redis \(127\.0\.0\.1:1\)\) cannot be updated"
    ):
        with fleetstate.lock(opts, ["web1"]):
            pass


def test_bad_settings_are_refused(backend):
    with pytest.raises(SaltInvocationError, match="unknown key"):
        fleetstate.config(backend("m1", lock_tll=3))
    with pytest.raises(SaltInvocationError, match="lock_ttl is too small"):
        fleetstate.config(backend("m1", lock_ttl=0))


# reservations ---------------------------------------------------------------------------------------
GIB = 1024


def host(mem=4 * GIB, vms=None):
    return {
        "status": "up",
        "host": {"mem_total": mem, "mem_used_by_vms": 0, "vcpus_total": 16, "vcpus_used_by_vms": 0, "disk_free": 9999},
        "vm_info": vms or {},
    }


def test_concurrent_reservations_never_overcommit_a_host(backend):
    """12 creations from 3 masters race for a host with room for exactly 5 (512 MiB each)."""
    answer = host(mem=1024 + 5 * 512)
    pol = placement.make_policy()
    req = placement.make_request(1, 512)
    since = time.time()
    got, refused, start = [], [], threading.Barrier(12)

    def one(i):
        opts = backend(f"m{i % 3}")
        start.wait()
        with fleetstate.lock(opts, [f"vm{i}"]) as lease:
            try:
                fleetstate.reserve(
                    lease.store, lease, "h1", f"vm{i}", req, answer, since,
                    fits=lambda a, load: placement.fits("h1", a, req, pol, load),
                )  # fmt: skip
                got.append(i)
            except fleetstate.NoRoomError as exc:
                refused.append(exc.reasons)
            hold_until(lambda: len(got) + len(refused) == 12)  # hold while the others decide

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 5 and len(refused) == 7, (got, refused)
    assert refused[0] == [
        "memory: needs 512 MiB, 0 MiB free (3584 total - 0 used by running VMs - 2560 reserved by 5 in-flight "
        "init(s) - 1024 reserve)"
    ]


def test_reservation_lifecycle_and_what_counts(backend):
    opts = backend("m1")
    store = fleetstate.Store(opts)
    req = placement.make_request(2, 1024, 100, group="web")
    since = time.time() - 1
    with fleetstate.lock(opts, ["web1"]) as lease:
        fleetstate.reserve(store, lease, "h1", "web1", req, host(), since)
        load = fleetstate.reserved(store, {"h1": host(), "h2": host()}, since)
        assert load["h1"] == {"cpu": 2, "mem": 1024, "disk_mib": 100, "vms": ["web1"], "groups": {"web1": "web"}}
        assert load["h2"]["vms"] == []
        # placement sees it: anti-affinity and capacity
        plan = placement.rank({"h1": host(), "h2": host()}, req, None, reserved=load)
        assert plan["host"] == "h2" and plan["excluded"]["h1"] == [
            "anti-affinity: group 'web' already has web1 (in flight) here"
        ]
        fleetstate.finish(store, lease, "settled")
    ledger = store.fetch(fleetstate.RESERVATIONS, "h1")
    now = time.time()
    # settled: counts for a snapshot taken before it settled, not for a later one, nor once running
    assert fleetstate.tally(ledger, host(), since, now)["vms"] == ["web1"]
    assert fleetstate.tally(ledger, host(), now + 60, now)["vms"] == []
    running = host(vms={"web1": {"state": "running"}})
    assert fleetstate.tally(ledger, running, since, now)["vms"] == []
    # an active reservation counts until it expires (its master died: nobody renews it)
    with fleetstate.lock(opts, ["web2"]) as lease:
        fleetstate.reserve(store, lease, "h1", "web2", req, host(), since)
        fleetstate.finish(store, lease, "unknown", keep_for=1)
    ledger = store.fetch(fleetstate.RESERVATIONS, "h1")
    assert fleetstate.tally(ledger, host(), now + 60, time.time())["vms"] == ["web2"]
    assert fleetstate.tally(ledger, host(), now + 60, time.time() + 2)["vms"] == []
    # a failed call drops its reservation; the last one gone removes the host's entry
    with fleetstate.lock(opts, ["web3"]) as lease:
        fleetstate.reserve(store, lease, "h3", "web3", req, host(), since)
        fleetstate.finish(store, lease, "failed")
    assert store.fetch(fleetstate.RESERVATIONS, "h3") is None


def test_the_runner_does_not_import_redis_until_it_is_used():
    """``salt-run virt.*`` imports fleetstate on every start-up: the redis client (~0.2 s) only with cache: redis."""
    import sys

    from tests.support.paths import ROOT

    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / '_utils')!r}); "
        "from saltvirt.fleet import fleetstate, vmcreate; print('redis' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
