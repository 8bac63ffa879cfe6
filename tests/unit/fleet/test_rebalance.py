"""saltvirt.fleet.rebalance: the plan is a pure function over ``virt.full_info``-shaped host facts."""

import copy

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import placement, rebalance
from tests.support.fleetfacts import GIB, host

POL = placement.make_policy(mem_reserve_mib=0)


def test_moves_the_biggest_vms_off_the_loaded_host_until_within_the_threshold():
    hosts = {
        "a": host([("v1", 4 * GIB), ("v2", 2 * GIB), ("v3", 2 * GIB)]),
        "b": host([("v4", 1 * GIB)]),
        "c": host(),
        "d": host(status="down"),
    }
    before = copy.deepcopy(hosts)
    out = rebalance.plan(hosts, POL, "mem", 0.13)
    assert hosts == before  # pure
    assert out["load_before"] == {"a": 0.5, "b": 0.0625, "c": 0.0}  # d is down: not counted
    assert out["spread_before"] == 0.5
    assert [(m["vm"], m["from"], m["to"]) for m in out["moves"]] == [("v1", "a", "c"), ("v2", "a", "b")]
    assert out["load_after"] == {"a": 0.125, "b": 0.1875, "c": 0.25}
    assert out["balanced"] is True and out["spread_after"] == 0.125
    assert "within the threshold" in out["reason"]


def test_vms_metric_and_already_balanced():
    hosts = {"a": host([("v1", 512), ("v2", 512), ("v3", 512)]), "b": host()}
    out = rebalance.plan(hosts, POL, "vms", 1)
    assert out["spread_before"] == 3 and out["spread_after"] == 1
    assert [m["vm"] for m in out["moves"]] == ["v1"]
    again = rebalance.plan({"a": host([("v1", 512)]), "b": host()}, POL, "vms", 1)
    assert again["moves"] == [] and again["balanced"] is True


def test_placement_rules_bound_the_moves():
    # anti-affinity: b already has a VM of group web; maintenance keeps c out entirely
    hosts = {"a": host([("w1", 512), ("w2", 512)], group="web"), "b": host([("w3", 512)], group="web"), "c": host()}
    pol = placement.make_policy(mem_reserve_mib=0, maintenance=["c"])
    out = rebalance.plan(hosts, pol, "vms", 0)
    assert out["moves"] == [] and out["balanced"] is False
    assert "no live migration makes the spread" in out["reason"]
    assert "c" not in out["load_before"]


def test_max_moves_and_stopped_vms_stay():
    hosts = {"a": host([(f"v{i}", 512) for i in range(6)]), "b": host()}
    hosts["a"]["vm_info"]["off"] = {"state": "shutoff", "cpu": 1, "mem": 8 * GIB}
    out = rebalance.plan(hosts, POL, "vms", 0, max_moves=2)
    assert len(out["moves"]) == 2 and "off" not in [m["vm"] for m in out["moves"]]
    assert out["reason"].startswith("stopped after max_moves=2")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"metric": "cpu"}, "metric must be"), ({"threshold": -1}, ">= 0"), ({"max_moves": 0}, "positive")],
)
def test_bad_input(kwargs, message):
    with pytest.raises(SaltInvocationError, match=message):
        rebalance.plan({"a": host()}, POL, **kwargs)
