"""Continuous balancing on real daemons (issue 38): ``salt-run virt.balance``, ``virt.balance_log`` and the master
engine ``virt_balance`` on a master of its own with two hypervisor minions, each managing its own namespaced libvirtd,
and two small TCG guests on shared storage (tests/support/fleetlab.py), both started on hv16:

* balancing off (no ``virt:balance``): the runner says so and how to turn it on, and nothing moves;
* on (``metric: vms``, threshold 1, a short hold time): the first committed round holds hv16 back, a round after
  ``hold_seconds`` live-migrates one guest to hv17 (it beats on there without a new boot), the next one finds the
  fleet balanced; the decision log has them in order and each round fired ``salt/virt/balance/round``;
* the engine: the master restarted with ``virt_balance`` configured while balancing is off runs no round; turned on
  in the config file (no restart) its rounds run, logged and fired, and turned off again they stop.

The hypervisors' migration setting names plaintext TCP (this lab has no TLS): a round's moves take the
hypervisor's transport, as ``virt.migrate`` without ``transport=`` does.
"""

import json
import pathlib
import time

import pytest

from tests.support.fleetlab import (
    beating,
    beats_on,
    console,
    fleet_minions,
    hypervisors,
    local_client,
    minion_configs,
    run,
    shared_store,
    shared_vm,
    where,
)
from tests.support.saltd import master_config, presync

HVS = ("hv16", "hv17")  # lab indexes 16, 17: used by no other module
SRC, DST = HVS
GUESTS = ("bal-a", "bal-b")  # same size: the first by name leaves first
TAG = "salt/virt/balance/round"
HOLD = 5
POLICY = {
    "metric": "vms",
    "threshold": 1,
    "hold_seconds": HOLD,
    "margin": 1,
    "max_moves_per_round": 1,
}
INTERVAL = 2  # the engine's seconds between rounds
WAIT = 180  # bound on what a loaded machine makes slow (an engine round, an event reaching the listener)


def master_virt(balance=None):
    virt = {
        "hypervisors": {"tgt": "hv1[67]", "tgt_type": "glob", "timeout": 5, "gather_job_timeout": 15},
        "placement": {"mem_reserve_mib": 256, "disk_reserve_mib": 0},
    }
    if balance is not None:
        virt["balance"] = balance
    return virt


def configure(master, name, config):
    """Write ``master.d/<name>.conf`` (an include replaces top-level keys: the whole ``virt`` mapping)."""
    conf = pathlib.Path(master.config_dir) / "master.d" / f"{name}.conf"
    conf.parent.mkdir(exist_ok=True)
    conf.write_text(json.dumps(config))


def set_balance(master, **balance):
    configure(master, "balance", {"virt": master_virt(dict(POLICY, **balance))})


@pytest.fixture(scope="module")
def store(lab_dir, guest):
    with shared_store(lab_dir, guest, "bal-store") as root:
        yield root


@pytest.fixture(scope="module")
def lab_hvs(lab_dir, fabric):
    with hypervisors(lab_dir, fabric, (16, 17)) as hvs:
        yield hvs


@pytest.fixture(scope="module")
def bmaster(salt_factories, state_tree):
    config = master_config(state_tree, virt=master_virt())
    factory = presync(salt_factories.salt_master_daemon("bal-master", overrides=config))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def minions(bmaster, lab_hvs, lab_dir, store):
    # a round's moves take the hypervisor's transport: plaintext TCP here, allowed (this lab has no TLS)
    configs = minion_configs(lab_hvs, lab_dir, store, migration={"transport": "tcp", "allow_cleartext": True})
    with fleet_minions(bmaster, lab_hvs, configs) as factories:
        yield factories


@pytest.fixture(scope="module")
def local(bmaster, minions):
    with local_client(bmaster) as client:
        yield client


@pytest.fixture(scope="module")
def guests(local, lab_hvs, store, guest):
    for name in GUESTS:
        shared_vm(local, store, guest, SRC, name)
    for name in GUESTS:
        beating(lab_hvs[SRC], name)
    return GUESTS


def placed(local):
    return {name: where(local, name, HVS) for name in GUESTS}


def balance_log(master, last=50):
    ret = run(master, "virt.balance_log", last=last)
    assert ret.returncode == 0, ret
    return ret.data["entries"]


def rounds_fired(event_listener, master, after):
    return sorted(
        (e for e in event_listener.get_events([(master.id, TAG)], after_time=after)), key=lambda e: e.data["round"]
    )


def ping(master):
    ret = master.salt_cli(timeout=20).run("test.ping", minion_tgt="hv*")
    return [m for m, up in (ret.data or {}).items() if up is True] if isinstance(ret.data, dict) else []


def wait_for(what, check, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(1)
    return found


def test_balancing_off_says_how_to_turn_it_on_and_moves_nothing(bmaster, local, guests, event_listener):
    t0 = time.time()
    for args in ((), ("dry_run=False",)):
        ret = run(bmaster, "virt.balance", *args)
        assert ret.returncode == 0, ret
        assert ret.data["enabled"] is False and ret.data["ran"] is False, ret.data
        assert "continuous balancing is off: set virt:balance:enabled: True in the master config" in ret.data["reason"]
    assert placed(local) == {name: {SRC: "running"} for name in GUESTS}  # two on hv16, none on hv17: left so
    assert balance_log(bmaster) == []
    time.sleep(2)  # what the master fired has reached the listener by now
    assert rounds_fired(event_listener, bmaster, t0) == []


def test_rounds_hold_then_move_one_guest_live_then_find_it_balanced(bmaster, local, lab_hvs, guests, event_listener):
    t0 = time.time()
    set_balance(bmaster, enabled=True)

    ret = run(bmaster, "virt.balance")  # a dry run: decided, nothing committed
    assert ret.returncode == 0 and ret.data["dry_run"] is True and ret.data["committed"] is False, ret
    assert [d["decision"] for d in ret.data["decisions"]] == ["hold"] and ret.data["moves"] == [], ret.data
    assert balance_log(bmaster) == []

    ret = run(bmaster, "virt.balance", dry_run=False)
    assert ret.returncode == 0, ret
    first = ret.data
    assert (first["ran"], first["committed"], first["round"], first["moves"]) == (True, True, 1, []), first
    assert first["load_before"] == {SRC: 2, DST: 0}, first
    [held] = first["decisions"]
    assert held["decision"] == "hold" and held["host"] == SRC, held
    assert f"for 0 s of hold_seconds {HOLD}: waiting" in held["reason"], held
    assert placed(local) == {name: {SRC: "running"} for name in GUESTS}  # held: nothing moved

    time.sleep(max(0.0, first["at"] + HOLD - time.time()))  # hv16 has been over for hold_seconds now
    before = len(console(lab_hvs[DST], "bal-a"))
    ret = run(bmaster, "virt.balance", dry_run=False)
    assert ret.returncode == 0, ret
    second = ret.data
    assert (second["round"], second["committed"], second["failed"]) == (2, True, {}), second
    assert [(m["vm"], m["from"], m["to"]) for m in second["moves"]] == [("bal-a", SRC, DST)], second
    assert list(second["moved"]) == ["bal-a"] and second["moved"]["bal-a"]["live"] is True, second
    print(f"virt.balance round 2 (1 live migration): {second['moved']['bal-a']['seconds']} s")
    assert placed(local) == {"bal-a": {DST: "running"}, "bal-b": {SRC: "running"}}  # exactly one moved
    beats_on(lab_hvs[DST], "bal-a", before)  # beating on, without a new boot

    ret = run(bmaster, "virt.balance", dry_run=False)
    assert ret.returncode == 0, ret
    third = ret.data
    assert (third["round"], third["committed"], third["moves"], third["moved"]) == (3, True, [], {}), third
    assert [d["decision"] for d in third["decisions"]] == ["balanced"], third
    assert placed(local) == {"bal-a": {DST: "running"}, "bal-b": {SRC: "running"}}

    log = balance_log(bmaster)
    assert [(e["round"], e["decision"]) for e in log] == [(1, "hold"), (2, "move"), (2, "moved"), (3, "balanced")]
    assert log[1]["vm"] == "bal-a" and (log[1]["host"], log[1]["to"]) == (SRC, DST), log
    assert log[2]["reason"].startswith(f"bal-a moved from {SRC} to {DST} in "), log

    fired = wait_for("3 rounds fired", lambda: len(found := rounds_fired(event_listener, bmaster, t0)) >= 3 and found)
    assert [e.data["round"] for e in fired] == [1, 2, 3], [e.data for e in fired]
    assert list(fired[1].data["moved"]) == ["bal-a"] and "state" not in fired[1].data


def test_the_engine_runs_rounds_while_balancing_is_on(bmaster, minions, event_listener):
    """The master restarted with the engine, balancing off: no round; turned on in the config file, the engine's
    rounds run (each reads the config again: no restart), logged and fired; off again, they stop."""
    set_balance(bmaster, enabled=False)
    configure(bmaster, "engine", {"engines": ["pytest", {"virt_balance": {"interval": INTERVAL}}]})
    bmaster.terminate()
    bmaster.start()
    # the minions are back: a minion that had not authenticated again with the restarted master missed a job
    wait_for("both minions answering", lambda: sorted(ping(bmaster)) == sorted(HVS))
    master_log = pathlib.Path(bmaster.config["log_file"])
    wait_for("the engine's first round", lambda: "virt_balance: continuous balancing is off" in master_log.read_text())
    logged = len(balance_log(bmaster))  # rounds 1-3 of the test above
    time.sleep(3 * INTERVAL)
    assert len(balance_log(bmaster)) == logged  # off: the engine ran no round

    t0 = time.time()
    set_balance(bmaster, enabled=True)
    fired = wait_for(
        "2 engine rounds fired", lambda: len(found := rounds_fired(event_listener, bmaster, t0)) >= 2 and found
    )
    assert [e.data["round"] for e in fired[:2]] == [4, 5], [e.data for e in fired]
    assert all(e.data["committed"] and e.data["moved"] == {} for e in fired), [e.data for e in fired]
    log = balance_log(bmaster)
    assert [(e["round"], e["decision"]) for e in log[logged : logged + 2]] == [(4, "balanced"), (5, "balanced")], log
    assert "virt_balance: round 4: balanced; committed True, moved none" in master_log.read_text()

    set_balance(bmaster, enabled=False)
    time.sleep(3 * INTERVAL)  # a round that started before the change has ended
    stopped = len(balance_log(bmaster))
    time.sleep(3 * INTERVAL)
    assert len(balance_log(bmaster)) == stopped  # off again: no more rounds, without a restart
