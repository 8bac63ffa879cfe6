"""saltvirt.fleet.placement: pure host choice. Facts are shaped exactly like ``virt.full_info`` answers."""

import random

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import placement

GIB = 1024


def host(mem=16 * GIB, mem_used=0, cpus=8, cpus_used=0, disk=100 * GIB, vms=None, status="up", error=None):
    """One hypervisor as the runner's query reports it (``virt.full_info`` + status)."""
    if status != "up":
        return {"status": status, "error": error or "did not answer within 10 s"}
    vms = vms or {}
    return {
        "status": "up",
        "host": {
            "mem_total": mem,
            "mem_used_by_vms": mem_used,
            "vcpus_total": cpus,
            "vcpus_used_by_vms": cpus_used,
            "disk_free": disk,
            "images_dir": "/srv/salt-images",
            "vms_defined": len(vms),
        },
        "vm_info": {name: {"state": "running", "group": group} for name, group in vms.items()},
    }


def req(cpu=1, mem=512, disk_mib=0, group=None):
    return placement.make_request(cpu, mem, disk_mib, group)


def test_chooses_by_fit_and_explains_every_host():
    hosts = {
        "small": host(mem=4 * GIB),
        "big": host(mem=64 * GIB, cpus=32),
        "full": host(mem=8 * GIB, mem_used=7 * GIB),
        "gone": host(status="down"),
        "broken": host(status="error", error="cannot connect to libvirt"),
    }
    out = placement.rank(hosts, req(2, 6 * GIB))
    assert out["host"] == "big"
    assert [r["host"] for r in out["ranking"]] == ["big"]
    assert set(out["excluded"]) == {"small", "full", "gone", "broken"}  # nobody silently dropped
    assert out["excluded"]["small"] == [
        "memory: needs 6144 MiB, 3072 MiB free (4096 total - 0 used by running VMs - 1024 reserve)"
    ]
    assert out["excluded"]["full"][0].startswith("memory: needs 6144 MiB, 0 MiB free (8192 total - 7168 used")
    assert out["excluded"]["gone"] == ["down: did not answer within 10 s"]
    assert out["excluded"]["broken"] == ["error: cannot connect to libvirt"]
    best = out["ranking"][0]
    assert set(best["scores"]) == {"mem", "cpu", "disk", "vms"} and 0 < best["score"] <= 1
    assert best["free_after"]["mem_mib"] == 64 * GIB - 1024 - 6 * GIB
    assert out["reason"] == "big: best spread score {} of 1 host(s) that fit; 4 excluded".format(best["score"])


def test_full_host_is_never_chosen_even_when_everything_else_is_better():
    # 'full' would win on cpu, disk and VM count; one MiB short of memory still excludes it
    hosts = {
        "full": host(mem=8 * GIB, mem_used=8 * GIB - 1024 - 511, cpus=64, disk=10_000 * GIB),
        "meh": host(mem=4 * GIB, mem_used=2 * GIB, cpus=2, cpus_used=6, disk=5 * GIB, vms={"a": None, "b": None}),
    }
    out = placement.rank(hosts, req(1, 512))
    assert out["host"] == "meh"
    assert "memory: needs 512 MiB, 511 MiB free" in out["excluded"]["full"][0]
    # exactly enough fits (the reserve is kept, nothing more)
    hosts["full"] = host(mem=8 * GIB, mem_used=8 * GIB - 1024 - 512, cpus=64, disk=10_000 * GIB)
    out = placement.rank(hosts, req(1, 512))
    assert out["host"] == "full" and out["ranking"][0]["free_after"]["mem_mib"] == 0


def test_vcpu_overcommit_ratio():
    hosts = {"h": host(cpus=4, cpus_used=6)}
    out = placement.rank(hosts, req(cpu=3), placement.make_policy({"cpu_overcommit": 2}))
    assert out["host"] is None
    assert out["excluded"]["h"] == ["vcpus: needs 3, 2 left (4 CPUs x 2 overcommit = 8, 6 used by running VMs)"]
    assert placement.rank(hosts, req(cpu=2), placement.make_policy({"cpu_overcommit": 2}))["host"] == "h"
    assert placement.rank(hosts, req(cpu=3))["host"] == "h"  # default 4.0


def test_disk_needs_room_for_a_full_copy():
    hosts = {"tight": host(disk=3000), "roomy": host(disk=50_000, mem=4 * GIB)}
    out = placement.rank(hosts, req(disk_mib=2500))
    assert out["host"] == "roomy"
    assert out["excluded"]["tight"] == [
        "disk: needs 2500 MiB in /srv/salt-images, 1976 MiB free (after a 1024 MiB reserve)"
    ]
    no_disk_fact = host()
    del no_disk_fact["host"]["disk_free"]
    out = placement.rank({"x": no_disk_fact}, req(disk_mib=10))
    assert out["excluded"]["x"] == ["disk: the host did not report free space in virt:images"]
    assert placement.rank({"x": no_disk_fact}, req())["host"] == "x"  # size unknown: not a reason


def test_anti_affinity_group():
    hosts = {
        "a": host(mem=64 * GIB, vms={"web1": "web", "db1": "db"}),
        "b": host(mem=8 * GIB, vms={"web2": "web"}),
        "c": host(mem=4 * GIB, vms={"db2": "db"}),
    }
    out = placement.rank(hosts, req(group="web"))
    assert out["host"] == "c"
    assert out["excluded"] == {
        "a": ["anti-affinity: group 'web' already has web1 here"],
        "b": ["anti-affinity: group 'web' already has web2 here"],
    }
    out = placement.rank(hosts, req())  # without a group every host may take it
    assert out["excluded"] == {} and len(out["ranking"]) == 3


def test_every_failing_reason_is_listed():
    out = placement.rank(
        {"h": host(mem=2 * GIB, cpus=1, cpus_used=4, disk=100, vms={"w": "web"})}, req(2, 4096, 500, "web")
    )
    assert [r.split(":")[0] for r in out["excluded"]["h"]] == ["memory", "vcpus", "disk", "anti-affinity"]


def test_maintenance_hosts_are_skipped_by_id_or_glob():
    hosts = {"hyper1": host(mem=64 * GIB), "rack2-a": host(mem=32 * GIB), "hyper3": host()}
    pol = placement.make_policy({"maintenance": ["hyper1", "rack2-*"]})
    out = placement.rank(hosts, req(), pol)
    assert out["host"] == "hyper3"
    assert out["excluded"]["hyper1"] == ["in maintenance (virt:placement:maintenance: 'hyper1')"]
    assert out["excluded"]["rack2-a"] == ["in maintenance (virt:placement:maintenance: 'rack2-*')"]
    # per-call overrides (salt-run virt.next_host maintenance=hyper3) win over the master config
    pol = placement.make_policy({"maintenance": ["hyper1"]}, maintenance="hyper3")
    assert placement.rank(hosts, req(), pol)["host"] == "hyper1"


def test_a_fleet_answer_says_which_hosts_are_in_maintenance():
    pol = placement.make_policy({"maintenance": ["hyper1", "rack2-*"]})
    hosts = {"hyper1": {"status": "up"}, "rack2-a": {"status": "down"}, "hyper3": {"status": "up"}, "odd": None}
    out = placement.mark_maintenance(hosts, pol)
    assert {h: (a or {}).get("maintenance") for h, a in out.items()} == {
        "hyper1": "hyper1",
        "rack2-a": "rack2-*",
        "hyper3": None,
        "odd": None,
    }
    assert out["odd"] is None and "maintenance" not in hosts["hyper1"]  # a copy; a non-answer left as it is


def test_weights_decide_between_memory_and_cpu_headroom():
    hosts = {
        "memrich": host(mem=64 * GIB, cpus=4, cpus_used=12),
        "cpurich": host(mem=8 * GIB, mem_used=4 * GIB, cpus=64),
    }
    mem_heavy = placement.make_policy({"weights": {"mem": 10, "cpu": 1, "disk": 0, "vms": 0}})
    cpu_heavy = placement.make_policy({"weights": {"mem": 1, "cpu": 10, "disk": 0, "vms": 0}})
    assert placement.rank(hosts, req(), mem_heavy)["host"] == "memrich"
    assert placement.rank(hosts, req(), cpu_heavy)["host"] == "cpurich"
    out = placement.rank(hosts, req(), mem_heavy)
    for entry in out["ranking"]:  # the score is the weighted mean of its parts
        s = entry["scores"]
        assert entry["score"] == pytest.approx((10 * s["mem"] + s["cpu"]) / 11, abs=1e-3)


def test_fewer_vms_win_when_resources_are_equal_and_ties_are_deterministic():
    hosts = {"b": host(vms={"x": None}), "c": host(), "a": host()}
    out = placement.rank(hosts, req())
    assert [r["host"] for r in out["ranking"]] == ["a", "c", "b"]
    assert [r["rank"] for r in out["ranking"]] == [1, 2, 3]


def test_pack_strategy_fills_the_fullest_host_that_fits():
    hosts = {
        "empty": host(mem=64 * GIB),
        "half": host(mem=16 * GIB, mem_used=8 * GIB),
        "full": host(mem=4 * GIB, mem_used=3 * GIB),
    }
    assert placement.rank(hosts, req())["host"] == "empty"
    out = placement.rank(hosts, req(), placement.make_policy({"strategy": "pack"}))
    assert out["host"] == "half" and "full" in out["excluded"]
    assert out["reason"].startswith("half: best pack score")


def test_exclude_and_empty_inputs():
    hosts = {"a": host(mem=64 * GIB), "b": host()}
    out = placement.rank(hosts, req(), exclude=["a"])
    assert out["host"] == "b" and out["excluded"]["a"] == ["excluded by the caller (already tried)"]
    assert placement.rank({}, req())["reason"].startswith("no hypervisors found")
    out = placement.rank({"a": host(status="down")}, req(group="web"))
    assert (
        out["host"] is None
        and out["reason"] == "no host can take a VM with 1 vCPU(s), 512 MiB in group 'web': see excluded"
    )
    garbage = {"status": "up", "host": {"hostname": "x"}}
    assert placement.rank({"old": garbage}, req())["excluded"]["old"][0].startswith("no capacity facts")


@pytest.mark.parametrize(
    "config, match",
    [
        ({"colour": 1}, "unknown key"),
        ({"weights": {"gpu": 1}}, "unknown resource"),
        ({"weights": {"mem": 0, "cpu": 0, "disk": 0, "vms": 0}}, "at least one weight"),
        ({"weights": "heavy"}, "must be a mapping"),
        ({"strategy": "random"}, "strategy must be one of"),
        ({"mem_reserve_mib": -1}, "must be >= 0"),
        ({"cpu_overcommit": 0}, "must be >= 0.01"),
        ({"cpu_overcommit": "lots"}, "must be a number"),
        ({"maintenance": 5}, "list of minion ids"),
        ("nope", "must be a mapping"),
    ],
)
def test_bad_policy_is_refused_with_the_key_named(config, match):
    with pytest.raises(SaltInvocationError, match=match):
        placement.make_policy(config)


def test_policy_merges_defaults_config_and_overrides():
    pol = placement.make_policy(
        {"weights": {"disk": 2}, "maintenance": "a, b"}, mem_reserve_mib="2048", cpu_overcommit=None
    )
    assert pol["weights"] == {"mem": 1.0, "cpu": 1.0, "disk": 2.0, "vms": 0.25}
    assert pol["maintenance"] == ["a", "b"] and pol["mem_reserve_mib"] == 2048 and pol["cpu_overcommit"] == 4.0
    assert placement.DEFAULT_POLICY["weights"]["disk"] == 0.5  # defaults are not mutated


@pytest.mark.parametrize("cpu, mem", [(0, 512), (1, -5), ("two", 512), (True, 512), (1.5, 512), (1, "")])
def test_bad_request_is_refused(cpu, mem):
    with pytest.raises(SaltInvocationError, match="must be a positive integer"):
        placement.make_request(cpu, mem)


def test_request_accepts_cli_strings():
    assert placement.make_request("2", "512", 3000.7, "web") == {"cpu": 2, "mem": 512, "disk_mib": 3000, "group": "web"}


def test_a_thousand_hosts_all_accounted_for_and_the_roomiest_wins():
    """Correctness at fleet scale (the speed is measured in bench/, not asserted here)."""
    rnd = random.Random(7)
    hosts = {}
    for i in range(1000):
        mem = rnd.choice([32, 64, 128, 256]) * GIB
        hosts[f"hv{i:04d}"] = host(
            mem=mem,
            mem_used=rnd.randint(0, mem // 1024) * 1024,
            cpus=rnd.choice([16, 32, 64]),
            cpus_used=rnd.randint(0, 200),
            disk=rnd.randint(0, 2000) * GIB,
            vms={f"vm{i}-{j}": rnd.choice(["web", "db", None]) for j in range(rnd.randint(0, 30))},
        )
    hosts["hv0500"] = {"status": "down", "error": "did not answer within 10 s"}
    hosts["zz-best"] = host(mem=512 * GIB, cpus=128, disk=4000 * GIB)
    out = placement.rank(hosts, req(4, 8 * GIB, 20 * GIB, "web"), placement.make_policy({"maintenance": ["hv01*"]}))
    assert out["host"] == "zz-best"
    assert len(out["ranking"]) + len(out["excluded"]) == 1001
    assert all(out["excluded"][f"hv01{i:02d}"][0].startswith("in maintenance") for i in range(100))
    assert out["excluded"]["hv0500"] == ["down: did not answer within 10 s"]
    scores = [r["score"] for r in out["ranking"]]
    assert scores == sorted(scores, reverse=True)


# soft affinity -------------------------------------------------------------------------------------
def test_soft_affinity_prefers_the_groups_hosts_and_shows_the_score_parts():
    hosts = {"a": host(vms={"db1": "db"}), "b": host(), "c": host(vms={"db2": "db", "db3": "db"})}
    plain = placement.rank(hosts, req())
    assert plain["host"] == "b"  # fewest VMs: spread alone goes to the empty host
    near = placement.rank(hosts, placement.make_request(1, 512, affinity=[{"group": "db", "weight": 5}]))
    assert near["host"] == "c"
    parts = {r["host"]: r["scores"]["affinity:db"] for r in near["ranking"]}
    assert parts == {"a": 0.5, "b": 0.0, "c": 1.0}
    assert not near["excluded"]  # soft: nobody is excluded


def test_soft_anti_affinity_spreads_without_excluding():
    hosts = {"a": host(vms={"w1": "web", "x": None, "y": None}), "b": host(vms={"w2": "web", "w3": "web"})}
    ranked = placement.rank(hosts, placement.make_request(1, 512, affinity={"web": -10}))
    assert ranked["host"] == "a" and ranked["ranking"][0]["scores"]["affinity:web"] == 0.5
    assert ranked["ranking"][1]["scores"]["affinity:web"] == 0.0 and not ranked["excluded"]
    # members by their own soft groups and in-flight reservations count too
    hosts = {"a": host(), "b": host()}
    hosts["a"]["vm_info"]["s1"] = {"state": "running", "affinity": [{"group": "web", "weight": 1}]}
    load = {"b": {"groups": {"w9": "web"}}}
    ranked = placement.rank(
        hosts, placement.make_request(1, 512, affinity={"group": "web", "weight": 1}), reserved=load
    )
    assert {r["host"]: r["scores"]["affinity:web"] for r in ranked["ranking"]} == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("web", "must be a list"),
        ([{"group": "web", "weight": 0}], "not 0"),
        ([{"group": "web", "weight": 11}], "-10..10"),
        ([{"group": "web", "weight": "x"}], "must be a number"),
        ([{"weight": 1}], "each entry is"),
        ([{"group": "web", "hard": True}], "each entry is"),
    ],
)
def test_soft_affinity_bad_input(value, message):
    with pytest.raises(SaltInvocationError, match=message):
        placement.make_request(1, 512, affinity=value)


def test_hard_group_stays_hard_beside_soft_terms():
    hosts = {"a": host(vms={"w1": "web"}), "b": host()}
    ranked = placement.rank(hosts, placement.make_request(1, 512, 0, "web", affinity={"web": 10}))
    assert ranked["host"] == "b" and "anti-affinity" in ranked["excluded"]["a"][0]


def _random_fleet(count, seed):
    rnd = random.Random(seed)
    hosts = {}
    for i in range(count):
        mem = rnd.choice([4, 32, 64]) * GIB
        hosts[f"hv{i:04d}"] = host(
            mem=mem,
            mem_used=rnd.randint(0, mem // 1024) * 1024,
            cpus=rnd.choice([2, 16, 32]),
            cpus_used=rnd.randint(0, 130),
            disk=rnd.randint(0, 100) * GIB,
            vms={f"vm{i}-{j}": rnd.choice(["web", "db", None]) for j in range(rnd.randint(0, 4))},
            status=rnd.choice(["up"] * 20 + ["down"]),
        )
    return hosts


@pytest.mark.parametrize("strategy", ["spread", "pack"])
def test_the_fast_path_agrees_with_the_reasons_and_top_is_a_prefix(strategy):
    """Hosts that plainly fit skip the reasons (_fast_free); every host is still in the ranking exactly
    when fits() finds no reason, and ``top`` lists the first hosts of the full ranking."""
    hosts = _random_fleet(400, 3)
    pol = placement.make_policy({"maintenance": ["hv00*"], "strategy": strategy})
    for request in (req(2, 4 * GIB, 10 * GIB), req(1, 512, 0, "web")):
        full = placement.rank(hosts, request, pol)
        fitting = {h for h in hosts if not placement.fits(h, hosts[h], request, pol)}
        assert {r["host"] for r in full["ranking"]} == fitting and full["fit"] == len(fitting) > 20
        assert set(full["excluded"]) == set(hosts) - fitting
        top = placement.rank(hosts, request, pol, top=5)
        assert top["ranking"] == full["ranking"][:5] and top["fit"] == full["fit"] and top["reason"] == full["reason"]
        assert top["excluded"] == full["excluded"]


def _indexed(hosts):
    """The same fleet as virt.capacity answers it: ``host.groups`` ({group: [names]}) beside vm_info."""
    indexed = {}
    for name, given in hosts.items():
        answer = dict(given)
        if answer["status"] == "up":
            groups = {}
            for vm, info in sorted(answer["vm_info"].items(), reverse=True):  # the index is not sorted
                if info["group"]:
                    groups.setdefault(info["group"], []).append(vm)
            answer["host"] = dict(answer["host"], groups=groups)
        indexed[name] = answer
    return indexed


@pytest.mark.parametrize("shape", ["vm_info", "index"])
def test_every_excluded_host_has_exactly_the_reasons_fits_gives(shape):
    """The fast path's exclusions (the group's members only) read as the full check's, word for word, on
    a random fleet, with and without in-flight reservations (which always take the full check)."""
    hosts = _random_fleet(400, 11)
    hosts = _indexed(hosts) if shape == "index" else hosts
    pol = placement.make_policy({"maintenance": ["hv01*"]})
    reserved = {"hv0002": {"mem": 512, "cpu": 1, "vms": ["x"], "groups": {"x": "web"}}}
    for request in (req(1, 512, 0, "web"), req(2, 8 * GIB, 10 * GIB, "db"), req(1, 512)):
        for load in ({}, reserved):
            ranked = placement.rank(hosts, request, pol, reserved=load)
            want = {h: placement.fits(h, a, request, pol, load.get(h)) for h, a in hosts.items()}
            assert ranked["excluded"] == {h: reasons for h, reasons in sorted(want.items()) if reasons}
            assert list(ranked["excluded"]) == sorted(ranked["excluded"])
    assert any(
        "anti-affinity" in r[0] and len(r) == 1
        for r in placement.rank(hosts, req(1, 512, 0, "web"))["excluded"].values()
    )


def test_the_capacity_group_index_decides_as_the_vm_list_does():
    """virt.capacity answers carry ``host.groups`` ({group: [names]}): the same exclusions as scanning vm_info."""
    hosts = _random_fleet(200, 5)
    indexed = _indexed(hosts)
    pol = placement.make_policy()
    for group in ("web", "db"):
        assert placement.rank(indexed, req(1, 512, 0, group), pol) == placement.rank(hosts, req(1, 512, 0, group), pol)
