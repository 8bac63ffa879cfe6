"""saltvirt.fleet.balancer: a balancing round end to end through the master's real signed transport (hypervisors
that sign their answers with their own keys, tests/support/signedfleet.py; the moves are real relocate.migrate
runs against their canned answers), the real shared store (localfs) and the real quota path. Real hypervisors
and a real master: tests/integration."""

import threading

import pytest

from saltvirt.fleet import balance, balancer, fleetstate, quota
from tests.support import signedfleet
from tests.support.enginecheck import logged
from tests.support.fleetfacts import GIB, HVS, answers, fleet, held, host, master

T0 = 1_800_000_000.0


def published(client, fun):
    return [tgt for f, tgt in client.published if f == fun]


def run(opts, client, fired=None, **kwargs):
    return balancer.run_round(opts, client=client, fire=([] if fired is None else fired).append, **kwargs)


def test_disabled_gathers_nothing(tmp_path):
    client = signedfleet.SigningClient(answers(fleet()))
    fired = []
    out = run(master(tmp_path, enabled=False), client, fired)
    assert out == {"enabled": False, "dry_run": False, "ran": False, "reason": balancer.DISABLED}
    assert client.published == [] and fired == []
    assert run(signedfleet.fleet_opts(tmp_path, HVS), client)["enabled"] is False  # no virt:balance: off too
    assert client.published == []


def test_a_dry_run_decides_and_commits_logs_moves_and_fires_nothing(tmp_path):
    opts, client, fired = held(master(tmp_path), T0), signedfleet.SigningClient(answers(fleet())), []
    out = run(opts, client, fired, dry_run=True, now=T0)
    assert (out["dry_run"], out["ran"], out["committed"], out["round"]) == (True, True, False, 2)
    assert [(m["vm"], m["from"], m["to"]) for m in out["moves"]] == [("v0", "hv1", "hv2")]
    assert "state" not in out
    store = fleetstate.Store(opts)
    assert balance.load_state(store)["round"] == 1 and balance.JOURNAL.history(store) == []
    assert published(client, "virt.full_info") == [HVS] and published(client, "virt.migrate") == [] and fired == []


def test_a_committed_round_moves_through_virt_migrates_checks(tmp_path):
    opts, client, fired = held(master(tmp_path), T0), signedfleet.SigningClient(answers(fleet())), []
    out = run(opts, client, fired, now=T0)
    assert (out["ran"], out["committed"], out["round"], sorted(out["moved"]), out["failed"]) == (
        True,
        True,
        2,
        ["v0"],
        {},
    )
    assert published(client, "virt.migrate") == [["hv1"]]
    assert published(client, "virt.capacity") == [HVS]  # virt.migrate's placement checks on the target
    store = fleetstate.Store(opts)
    room = store.fetch(fleetstate.RESERVATIONS, "hv2")["entries"]["v0"]
    assert (room["mem"], room["state"]) == (2 * GIB, "settled")
    assert balance.load_state(store)["moved"]["v0"] == {"at": T0, "from": "hv1", "to": "hv2"}
    log = balance.JOURNAL.history(store)
    assert [e["decision"] for e in log] == [balance.MOVE, balance.LIMIT, balancer.MOVED]
    assert log[-1]["reason"].startswith("v0 moved from hv1 to hv2 in ")
    assert store.fetch(balance.BANK, balancer.MOVING) is None  # its moves ended
    assert fired == [out] and "state" not in fired[0]
    assert fleetstate.holders(opts) == {}  # the round lock and the VM's lock given back


def test_a_tenants_vm_moves_through_its_group_quota(tmp_path):
    opts = master(
        tmp_path,
        hypervisor_groups={"big": ["hv2"]},
        tenants={"acme": {"members": ["alice"], "group_quotas": {"big": {"vms": 1}}}},
    )
    client = signedfleet.SigningClient(answers(fleet(owner="acme")))
    out = run(held(opts, T0), client, now=T0)
    assert sorted(out["moved"]) == ["v0"], out
    entry = fleetstate.Store(opts).fetch(quota.QUOTAS, "acme")["entries"]["v0" + quota.MOVES]
    assert (entry["moves"], entry["host"], entry["state"]) == ("v0", "hv2", "settled")


def test_a_round_another_master_committed_first_moves_nothing(tmp_path):
    """m2 commits round 2 while m1's round gathers the fleet: m1's commit fails, and it moves nothing."""
    opts = held(master(tmp_path), T0)
    other = master(tmp_path, mid="m2")

    class Rival(signedfleet.SigningClient):
        def run_job(self, tgt, fun, arg, tgt_type, **kwargs):
            if kwargs["kwarg"]["fun"] == "virt.full_info" and not self.published:
                store = fleetstate.Store(other)
                pol = balance.make_policy(other["virt"]["balance"])
                theirs = balance.decide(fleet(), pol, balance.load_state(store), T0)
                assert balance.commit(store, theirs)
            return super().run_job(tgt, fun, arg, tgt_type, **kwargs)

    client, fired = Rival(answers(fleet())), []
    out = run(opts, client, fired, now=T0)
    assert (out["ran"], out["committed"], out["moved"]) == (True, False, {})
    assert out["reason"].startswith("round 2 was committed by another master first: nothing moved here")
    assert published(client, "virt.migrate") == [] and published(client, "virt.capacity") == []
    assert fired == [out]


def test_a_round_at_work_elsewhere_makes_this_one_busy(tmp_path):
    opts, client = master(tmp_path), signedfleet.SigningClient(answers(fleet()))
    other = master(tmp_path, mid="m2")
    with fleetstate.lock(other, [balancer.ROUND_LOCK], kind="virt.balance"):
        out = run(opts, client, now=T0)
    assert (out["ran"], client.published) == (False, [])
    assert out["reason"].startswith("another round is at work: 'virt.balance:round' is held: virt.balance by master m2")


def test_no_round_moves_while_a_timed_out_migration_may_still_run(tmp_path):
    """hv1 is still migrating v0 when virt:migration_timeout ends: the next rounds gather nothing until that
    migration must have ended (another virt:migration_timeout)."""
    opts = held(master(tmp_path, migration_timeout=0.5), T0)
    # hv1 answers its job checks ("still running") until the migration times out: under load a check answered
    # later than QUICK_WAITS' 0.1 s down_after made it "down" instead (a loaded run's failure)
    opts["virt"]["hypervisors"].update(gather_job_timeout=1, down_after=5)
    client = signedfleet.SigningClient(answers(fleet(), silent_migrate=True), busy=["hv1"])
    out = run(opts, client, now=T0)
    assert out["committed"] is True and out["moved"] == {}
    assert out["failed"]["v0"]["status"] == "timeout"
    store = fleetstate.Store(opts)
    moving = store.fetch(balance.BANK, balancer.MOVING)
    assert moving["vms"] == ["v0"] and T0 + 0.5 < moving["until"] < T0 + 60
    assert balance.JOURNAL.history(store)[-1]["decision"] == balancer.MOVE_FAILED
    client.published.clear()
    waiting = run(opts, client, now=T0 + 0.6)
    assert waiting["ran"] is False and "round 2's moves (v0), started by master master" in waiting["reason"]
    assert client.published == []
    later = run(opts, client, now=moving["until"] + 1)
    assert later["ran"] is True and later["round"] == 3  # v0 cools down: the next biggest goes
    assert store.fetch(balance.BANK, balancer.MOVING)["round"] == 3


def test_the_log_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(balance.JOURNAL, "size", 3)
    opts, client = held(master(tmp_path), T0), signedfleet.SigningClient(answers(fleet()))
    for i in range(3):
        run(opts, client, now=T0 + 10000 * i)  # past each round's cool-down
    log = balance.JOURNAL.history(fleetstate.Store(opts))
    assert len(log) == 3 and log[-1]["round"] == 4


def test_serve_runs_rounds_until_stopped(tmp_path):
    opts, client = master(tmp_path), signedfleet.SigningClient(answers({h: host() for h in HVS}))
    stop = threading.Event()

    class Once:
        def __enter__(self):
            stop.set()  # this round is the last
            return client

        def __exit__(self, *exc):
            return False

    balancer.serve(opts, 0.01, stop, Once)
    assert published(client, "virt.full_info") == [HVS]
    assert balance.JOURNAL.history(fleetstate.Store(opts))[-1]["decision"] == balance.BALANCED


def test_serve_reads_the_config_again_each_round(tmp_path):
    """The engine's rounds see virt:balance as the master config has it now: off, then turned on without a
    restart (``reload``), the next round runs."""
    client = signedfleet.SigningClient(answers({h: host() for h in HVS}))
    stop, seen = threading.Event(), []
    configs = iter([master(tmp_path, enabled=False), master(tmp_path)])

    def reload(opts):
        seen.append(opts["id"])
        fresh = next(configs)
        if fresh["virt"]["balance"]["enabled"]:
            stop.set()  # this round is the last
        return fresh

    class Client:
        def __enter__(self):
            return client

        def __exit__(self, *exc):
            return False

    balancer.serve(dict(master(tmp_path, enabled=False), id="started"), 0.01, stop, Client, reload)
    assert seen == ["started", "started"]  # each round from the opts the engine started with
    assert published(client, "virt.full_info") == [HVS]  # the first round was off: only the second gathered
    assert balance.JOURNAL.history(fleetstate.Store(master(tmp_path)))[-1]["decision"] == balance.BALANCED


@pytest.mark.parametrize("bad", ["soon", 0, -1])
def test_serve_idles_on_a_bad_interval(tmp_path, caplog, bad):
    stop = threading.Event()
    thread = threading.Thread(target=balancer.serve, args=(master(tmp_path), bad, stop), daemon=True)
    with caplog.at_level("ERROR"):
        thread.start()
        logged(caplog, thread, "engine not started")
    assert thread.is_alive()
    stop.set()
    thread.join(5)
    assert "virt_balance engine not started: virt_balance engine: interval must be a number of seconds" in caplog.text
