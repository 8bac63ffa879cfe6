"""saltvirt.fleet.balance: one balancing round is a pure function of the snapshot (virt.full_info-shaped host
facts, as in test_rebalance), the policy, the previous rounds' state and now; its state is kept in the shared
store under compare-and-set (localfs file lock, real redis WATCH/MULTI)."""

import copy
import random

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import balance, fleetstate, placement, rebalance, tenants
from tests.support.fleetfacts import GIB, host

T0 = 1_800_000_000.0
HOLD = 300


def policy(**overrides):
    pol = placement.make_policy(mem_reserve_mib=0, maintenance=overrides.pop("maintenance", None))
    return balance.make_policy({"hold_seconds": HOLD}, pol, **overrides)


def held(hosts, pol, now=T0):
    """The state of a fleet whose over hosts have been over for hold_seconds already."""
    over = balance.decide(hosts, pol, None, now - pol["hold_seconds"])["state"]["over_since"]
    return {"round": 1, "over_since": over, "moved": {}}


def kinds(result):
    return [d["decision"] for d in result["decisions"]]


def vms_of(n, prefix="v", size=GIB):
    return [(f"{prefix}{i}", size) for i in range(n)]


def test_a_host_must_stay_over_for_hold_seconds_before_anything_moves():
    hosts = {"a": host(vms_of(8)), "b": host()}
    pol = policy()
    first = balance.decide(hosts, pol, None, T0)
    assert first["moves"] == [] and kinds(first) == [balance.HOLD]
    assert first["decisions"][0]["reason"] == (
        "a: load 0.5 is above b's 0 by more than the threshold 0.1 for 0 s of hold_seconds 300: waiting"
    )
    assert first["state"]["over_since"] == {"a": T0}
    early = balance.decide(hosts, pol, first["state"], T0 + HOLD - 1)
    assert early["moves"] == [] and early["state"]["over_since"] == {"a": T0}  # since when, not reset
    due = balance.decide(hosts, pol, early["state"], T0 + HOLD)
    assert [(m["vm"], m["from"], m["to"]) for m in due["moves"]] == [("v0", "a", "b")]
    assert due["state"]["round"] == 3
    # a spike: over for one round, then not: the hold starts again from scratch
    calm = balance.decide({"a": host(vms_of(1)), "b": host()}, pol, first["state"], T0 + 60)
    assert calm["state"]["over_since"] == {} and kinds(calm) == [balance.BALANCED]
    again = balance.decide(hosts, pol, calm["state"], T0 + HOLD)
    assert again["moves"] == [] and again["state"]["over_since"] == {"a": T0 + HOLD}


def test_a_move_must_shrink_the_spread_by_the_margin():
    # a: v1 2 GiB + v2 1 GiB (0.1875), b: 0.5 GiB (0.03125); moving v1 shrinks the spread by 0.0625, v2 by 0.125
    hosts = {"a": host([("v1", 2 * GIB), ("v2", GIB)]), "b": host([("x", GIB // 2)])}
    loose = balance.decide(hosts, policy(), held(hosts, policy()), T0)
    assert [m["vm"] for m in loose["moves"]] == ["v1"]  # the biggest, with the default margin 0.02
    pol = policy(margin=0.1)
    out = balance.decide(hosts, pol, held(hosts, pol), T0)
    move = out["moves"][0]
    assert (move["vm"], move["gain"], move["spread"]) == ("v2", 0.1251, [0.1563, 0.0312])
    assert move["load"] == {"a": [0.1875, 0.125], "b": [0.0312, 0.0938]}
    assert move["why_vm"] == "the biggest running VM of a not cooling down whose move helps; bigger ones stay: v1"
    assert move["why_target"] == "placement rank 1 (score 0.8977) of 1 host(s) that fit"
    pol = policy(margin=0.2)
    none = balance.decide(hosts, pol, held(hosts, pol), T0)
    assert none["moves"] == [] and kinds(none) == [balance.STAY]
    stay = none["decisions"][0]
    assert stay["reason"] == "a: no running VM can leave it (2 margin)"
    assert stay["vms"]["v1"]["reason"] == (
        "v1: its best move (to b) makes the spread smaller by 0.0626, below the margin 0.2"
    )


def test_at_most_max_moves_per_round():
    hosts = {"a": host(vms_of(6, size=512)), "b": host()}
    pol = policy(metric="vms", threshold=0, max_moves_per_round=2)
    out = balance.decide(hosts, pol, held(hosts, pol), T0)
    assert len(out["moves"]) == 2 and kinds(out) == [balance.MOVE, balance.MOVE, balance.LIMIT]
    assert out["decisions"][-1]["reason"] == "stopped after max_moves_per_round=2; spread still 2 (over: a)"
    assert out["load_after"] == {"a": 4, "b": 2}


def test_a_vm_moved_recently_stays_for_its_cooldown():
    hosts = {"a": host([("big", 4 * GIB), ("small", GIB)]), "b": host()}
    pol = policy()
    state = held(hosts, pol)
    state["moved"] = {"big": {"at": T0 - 60, "from": "c", "to": "a"}}
    out = balance.decide(hosts, pol, state, T0)
    assert [m["vm"] for m in out["moves"]] == ["small"]  # big would go first without its cool-down
    assert out["moves"][0]["why_vm"].endswith("bigger ones stay: big")
    assert out["state"]["moved"] == {
        "big": {"at": T0 - 60, "from": "c", "to": "a"},
        "small": {"at": T0, "from": "a", "to": "b"},
    }
    only = {"a": host([("big", 4 * GIB), ("mate", 4 * GIB)]), "b": host()}
    state["moved"]["mate"] = {"at": T0 - 60, "from": "c", "to": "a"}
    stay = balance.decide(only, pol, dict(state, over_since={"a": T0 - HOLD}), T0)
    assert stay["moves"] == [] and stay["decisions"][0]["reason"] == "a: no running VM can leave it (2 cooldown)"
    assert stay["decisions"][0]["vms"]["big"] == {
        "why": balance.COOLDOWN,
        "reason": "big moved 60 s ago (c -> a), within cooldown_seconds 1800: it stays",
    }
    later = balance.decide(only, pol, dict(state, over_since={"a": T0 - HOLD}), T0 + 1800)
    assert [m["vm"] for m in later["moves"]] == ["big"] and later["state"]["moved"]["big"]["at"] == T0 + 1800


def test_a_vm_does_not_go_back_to_the_host_it_left():
    """v0 went a -> b 2000 s ago (its cool-down is over); b is over now: v0 stays off a, w0 goes instead, and
    with a third host v0 may go there."""
    hosts = {"a": host(), "b": host([("v0", GIB), ("w0", GIB), ("w1", GIB)])}
    pol = policy()
    state = dict(held(hosts, pol), moved={"v0": {"at": T0 - 2000, "from": "a", "to": "b"}})
    out = balance.decide(hosts, pol, state, T0)
    assert [(m["vm"], m["to"]) for m in out["moves"]] == [("w0", "a")]
    assert out["moves"][0]["why_vm"].endswith("bigger ones stay: v0")
    alone = {"a": host(), "b": host([("v0", 2 * GIB)])}
    stay = balance.decide(alone, pol, dict(state, over_since={"b": T0 - HOLD}), T0)
    assert stay["decisions"][0]["vms"]["v0"]["reason"] == (
        "v0: no other host can take it (a: the VM left it 2000 s ago, within no_return_seconds 86400; "
        "b: the VM is here)"
    )
    third = {"a": host(), "b": host([("v0", 2 * GIB), ("y", 2 * GIB)]), "c": host([("x", GIB // 2)])}
    moves = balance.decide(third, pol, dict(state, over_since={"b": T0 - HOLD}), T0)["moves"]
    assert [(m["vm"], m["to"]) for m in moves] == [("v0", "c")]
    gone = balance.decide(hosts, pol, dict(state, over_since={"b": T0}), T0 + 86400)  # forgotten: it may go back
    assert [(m["vm"], m["to"]) for m in gone["moves"]] == [("v0", "a")]


def test_hosts_in_maintenance_never_receive():
    hosts = {"a": host(vms_of(4)), "b": host(vms_of(2, "w")), "c": host()}
    pol = policy(metric="vms", threshold=1, maintenance=["c"])
    out = balance.decide(hosts, pol, held(hosts, pol), T0)
    assert "c" not in out["load_before"]
    assert [(m["vm"], m["to"]) for m in out["moves"]] == [("v0", "b")]  # c (empty) would rank first
    only = {"a": host(vms_of(4)), "b": host(vms_of(4, "w"), mem=4 * GIB), "c": host()}
    pol = policy(metric="vms", threshold=0, maintenance=["c"])
    stay = balance.decide(dict(only, a=host(vms_of(5))), pol, held(dict(only, a=host(vms_of(5))), pol), T0)
    assert stay["moves"] == []
    assert "c: in maintenance (virt:placement:maintenance: 'c')" in stay["decisions"][0]["vms"]["v0"]["reason"]


def test_anti_affinity_is_respected():
    hosts = {"a": host(vms_of(3, "w"), group="web"), "b": host([("w9", GIB)], group="web")}
    pol = policy(metric="vms", threshold=0)
    out = balance.decide(hosts, pol, held(hosts, pol), T0)
    assert out["moves"] == [] and kinds(out) == [balance.STAY]
    assert out["decisions"][0]["vms"]["w0"] == {
        "why": balance.NO_TARGET,
        "reason": "w0: no other host can take it (a: the VM is here; "
        "b: anti-affinity: group 'web' already has w9 here)",
    }
    hosts["b"] = host([("x", GIB)], group="db")
    assert [m["to"] for m in balance.decide(hosts, pol, held(hosts, pol), T0)["moves"]] == ["b"]


def tenancy(groups_quota=None, hypervisors=None):
    conf = {"quota": {"vcpus": 100}}
    if groups_quota:
        conf["group_quotas"] = {"gpu": groups_quota}
    if hypervisors:
        conf["hypervisors"] = hypervisors
    opts = {"virt": {"hypervisor_groups": {"gpu": ["h2"]}, "tenants": {"acme": conf}}}
    return balance.Tenancy(tenants.config(opts)["tenants"], {}, T0)


def test_a_tenants_hypervisor_group_quota_and_hypervisors_are_respected():
    """acme runs a1..a3 (2 vCPUs each) on h1 and a4 on h2, the one hypervisor of group gpu."""
    hosts = {"h1": host(vms_of(3, "a"), owner="acme", cpu=2), "h2": host([("a9", GIB)], owner="acme", cpu=2)}
    pol = policy(metric="vms", threshold=0)
    state = held(hosts, pol)
    free = balance.decide(hosts, pol, state, T0, tenancy({"vcpus": 4}))
    assert [(m["vm"], m["to"]) for m in free["moves"]] == [("a0", "h2")]
    full = balance.decide(hosts, pol, state, T0, tenancy({"vcpus": 2}))
    assert full["moves"] == [] and full["decisions"][0]["vms"]["a0"]["reason"] == (
        "a0: no other host can take it (h1: the VM is here; "
        "h2: tenant acme on hypervisor group gpu: 2 of 2 vCPUs used, asked 2)"
    )
    outside = balance.decide(hosts, pol, state, T0, tenancy(hypervisors=["h1"]))
    assert outside["moves"] == [] and outside["decisions"][0]["vms"]["a0"]["reason"].endswith(
        "h2: tenant acme may not use this hypervisor (virt:tenants:acme:hypervisors))"
    )
    # an operator's VM (no owner) is bound by placement only
    hosts["h1"] = host(vms_of(3, "o"), cpu=2)
    assert len(balance.decide(hosts, pol, state, T0, tenancy({"vcpus": 2}))["moves"]) == 1


def test_no_oscillation_over_fifty_rounds_of_changing_load():
    """Two hosts, a round a minute for 50 minutes; each round's moves are made on the snapshot, and load comes
    and goes: bursts (a VM for one or two rounds, shorter than hold_seconds) on either host, and at round 20 a
    lasting load on b. The moves stay few, and no VM ever goes back to the host it left."""
    rng = random.Random(38)
    pol = policy(max_moves_per_round=2, cooldown_seconds=600)
    fleet = {"a": host(vms_of(7)), "b": host([("x0", GIB)])}
    state, bursts, moves, path = None, [], [], {}
    for rnd in range(50):
        now = T0 + 60 * rnd
        for name, where, until in list(bursts):
            if rnd >= until and name in fleet[where]["vm_info"]:
                fleet = _remove(fleet, name)
                bursts.remove((name, where, until))
        if rng.random() < 0.5:
            where = rng.choice("ab")
            fleet = _add(fleet, where, f"burst{rnd}", 3 * GIB)
            bursts.append((f"burst{rnd}", where, rnd + rng.choice((1, 2))))
        if rnd == 20:
            for i in range(4):  # named after the v* that went to b: biggest first, then by name
                fleet = _add(fleet, "b", f"w{i}", GIB)
        result = balance.decide(fleet, pol, state, now)
        state = result["state"]
        for move in result["moves"]:
            rebalance.book_move(fleet, move["vm"], move["from"], move["to"])
            path.setdefault(move["vm"], []).append((move["from"], move["to"]))
            bursts = [(n, move["to"] if n == move["vm"] else w, u) for n, w, u in bursts]
            moves.append((rnd, move["vm"]))
    assert not any(vm.startswith("burst") for _r, vm in moves), moves  # a burst is over before its hold
    assert 2 <= len(moves) <= 6, moves
    for vm, hops in path.items():
        assert all(later != (back[1], back[0]) for i, back in enumerate(hops) for later in hops[i + 1 :]), (vm, hops)
    final = rebalance.loads(fleet, "mem", pol["placement"])
    assert rebalance.spread(final) <= pol["threshold"] + 3 * GIB / (16 * GIB), final  # within one burst


def _add(fleet, where, name, mem):
    fleet = copy.deepcopy(fleet)
    fleet[where]["vm_info"][name] = {"state": "running", "cpu": 1, "mem": mem, "group": None}
    facts = fleet[where]["host"]
    facts.update(mem_used_by_vms=facts["mem_used_by_vms"] + mem, vms_defined=facts["vms_defined"] + 1)
    facts["vcpus_used_by_vms"] += 1
    return fleet


def _remove(fleet, name):
    fleet = copy.deepcopy(fleet)
    where = next(h for h, ans in fleet.items() if name in ans["vm_info"])
    vm = fleet[where]["vm_info"].pop(name)
    facts = fleet[where]["host"]
    facts.update(mem_used_by_vms=facts["mem_used_by_vms"] - vm["mem"], vms_defined=facts["vms_defined"] - 1)
    facts["vcpus_used_by_vms"] -= 1
    return fleet


def test_pure_and_explained():
    hosts = {"a": host(vms_of(4)), "b": host()}
    pol = policy()
    state = held(hosts, pol)
    before, state_before = copy.deepcopy(hosts), copy.deepcopy(state)
    out = balance.decide(hosts, pol, state, T0)
    assert hosts == before and state == state_before
    assert out["decisions"][0] == {
        "round": 2,
        "at": T0,
        "decision": balance.MOVE,
        "reason": "move v0 from a (0.25 -> 0.1875) to b (0 -> 0.0625): spread 0.25 -> 0.125, smaller by 0.125 "
        "(margin 0.02)",
        "host": "a",
        "vm": "v0",
        "to": "b",
        "load": {"a": [0.25, 0.1875], "b": [0, 0.0625]},
        "spread": [0.25, 0.125],
        "gain": 0.125,
    }
    assert "state" not in balance.event_data(out) and balance.event_data(out)["moves"] == out["moves"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"metric": "cpu"}, "virt:balance:metric must be one of mem, vms"),
        ({"threshold": -1}, "virt:balance:threshold must be >= 0"),
        ({"margin": 0}, "virt:balance:margin must be a number above 0"),
        ({"hold_seconds": "soon"}, "virt:balance:hold_seconds must be a number of seconds"),
        ({"max_moves_per_round": 0}, "virt:balance:max_moves_per_round must be a positive integer"),
        ({"interval": 60}, "virt:balance: unknown key"),
    ],
)
def test_bad_policy(overrides, message):
    with pytest.raises(SaltInvocationError, match=message):
        balance.make_policy(None, None, **overrides)


def test_policy_defaults_follow_the_metric():
    pol = balance.make_policy({"metric": "vms"})
    assert (pol["threshold"], pol["margin"], pol["max_moves_per_round"]) == (2.0, 1.0, 1)
    assert pol["placement"] == placement.make_policy()


def test_rounds_are_committed_once_across_masters_and_the_log_is_bounded(backend):
    hosts = {"a": host(vms_of(4)), "b": host()}
    pol = policy()
    one, two = fleetstate.Store(backend("m1")), fleetstate.Store(backend("m2"))
    assert balance.load_state(one) == {}
    first = balance.decide(hosts, pol, balance.load_state(one), T0)
    rival = balance.decide(hosts, pol, balance.load_state(two), T0 + 1)
    assert balance.commit(one, first, keep=3) is True
    assert balance.commit(two, rival, keep=3) is False  # m1 ran round 1: m2 makes none of its moves
    assert balance.load_state(two) == first["state"]
    state = balance.load_state(two)
    for i in range(1, 4):
        result = balance.decide(hosts, pol, state, T0 + HOLD * i)
        assert balance.commit(two, result, keep=3) is True
        state = result["state"]
    log = balance.JOURNAL.history(one)
    assert len(log) == 3 and [d["round"] for d in log] == [3, 4, 4]  # the last 3 decisions, oldest first
    assert balance.JOURNAL.history(one, last=1) == log[-1:]
