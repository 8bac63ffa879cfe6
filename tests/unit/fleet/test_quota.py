"""saltvirt.fleet.quota: a tenant's usage counted from the fleet snapshot and its ledger, and quotas
taken under the shared store's compare-and-set (localfs file lock, real redis WATCH/MULTI)."""

import threading
import time

import pytest

from saltvirt.fleet import fleetstate, quota


def vm(tenant, cpu=1, mem=256, state="running", disk_bytes=None):
    disks = {"vda": {"virtual_size": disk_bytes}} if disk_bytes else {}
    return {"cpu": cpu, "mem": mem, "state": state, "disks": disks, "owner": {"tenant": tenant, "creator": "u"}}


HOSTS = {
    "h1": {"status": "up", "vm_info": {"a1": vm("acme", 2, 512, disk_bytes=3 * 1048576), "b1": vm("beta", 4)}},
    "h2": {"status": "up", "vm_info": {"a2": vm("acme", 1, 256, state="shutoff"), "x": {"cpu": 8, "mem": 1}}},
}


def test_count_from_the_snapshot_by_owner():
    used = quota.count(None, HOSTS, "acme", time.time())
    assert used == {"vcpus": 3, "mem": 768, "disk": 3, "vms": 2, "names": ["a1", "a2"]}
    assert quota.count(None, HOSTS, "nobody", time.time())["vms"] == 0


def test_ledger_entries_count_until_the_snapshot_shows_the_vm():
    now = time.time()
    ledger = {
        "entries": {
            "a1": {"cpu": 2, "mem": 512, "disk_mib": 100, "state": "settled", "settled_at": now - 5},
            "new": {"cpu": 1, "mem": 64, "disk_mib": 10, "state": "active", "expires": now + 60},
            "expired": {"cpu": 1, "mem": 64, "state": "active", "expires": now - 1},
            "gone": {"cpu": 1, "mem": 64, "state": "settled", "settled_at": now - 600},
            "late": {"cpu": 1, "mem": 64, "state": "settled", "settled_at": now},
        }
    }
    used = quota.count(ledger, HOSTS, "acme", since=now - 1, now=now)
    # a1 from the snapshot (its recorded disk), new (active), late (settled after the snapshot was taken)
    assert used["names"] == ["a1", "a2", "late", "new"] and used["vcpus"] == 5 and used["disk"] == 110
    # a hypervisor that did not answer may hold settled VMs: they count
    down = dict(HOSTS, h3={"status": "down", "error": "no answer"})
    assert "gone" in quota.count(ledger, down, "acme", since=now - 1, now=now)["names"]


def test_refusal_wording():
    used = {"vcpus": 15, "mem": 100, "disk": 0, "vms": 3}
    asked = {"vcpus": 2, "mem": 100, "disk": 5, "vms": 1}
    assert quota.refusal("acme", used, {"vcpus": 16, "vms": 4}, asked) == "tenant acme: 15 of 16 vCPUs used, asked 2"
    assert quota.refusal("acme", used, {"vcpus": 16, "vms": 3}, asked) == (
        "tenant acme: 15 of 16 vCPUs used, asked 2; 3 of 3 VMs used, asked 1"
    )
    assert quota.refusal("acme", used, {"vcpus": 17, "mem": 200}, asked) is None


def test_bar():
    assert quota.bar(8, 16, width=10) == "[#####.....] 8 of 16"
    assert quota.bar(20, 16, width=4) == "[####] 20 of 16"
    assert quota.bar(3, None) == "3 (no quota)"
    assert quota.bar(0, 0, width=2) == "[##] 0 of 0"


def test_reserve_settle_forget(backend):
    opts = backend()
    store = fleetstate.Store(opts)
    limits = {"vcpus": 4, "vms": 3}
    since = time.time()
    with fleetstate.lock(opts, ["a3"]) as lease:
        quota.reserve(store, lease, "acme", "a3", {"cpu": 1, "mem": 64}, HOSTS, since, limits)
        lease.renew()  # the entry is renewed with the lease
        quota.finish(store, lease, "settled")
    entry = store.fetch(quota.QUOTAS, "acme")["entries"]["a3"]
    assert entry["state"] == "settled" and entry["cpu"] == 1
    with fleetstate.lock(opts, ["a4"]) as lease, pytest.raises(quota.QuotaError) as err:
        quota.reserve(store, lease, "acme", "a4", {"cpu": 1, "mem": 64}, HOSTS, since, limits)
    assert str(err.value) == (
        "tenant acme: 4 of 4 vCPUs used, asked 1; 3 of 3 VMs used, asked 1: no room for a4 "
        "(purge one of its VMs, or ask the operator for a larger quota)"
    ), str(err.value)
    assert err.value.usage["names"] == ["a1", "a2", "a3"]
    quota.forget(store, "acme", "a3")
    assert store.fetch(quota.QUOTAS, "acme") is None


def test_a_failed_init_gives_the_quota_back_and_unknown_keeps_it(backend):
    opts = backend()
    store = fleetstate.Store(opts)
    with fleetstate.lock(opts, ["v"]) as lease:
        quota.reserve(store, lease, "t", "v", {"cpu": 1, "mem": 1}, {}, time.time(), {})
        quota.finish(store, lease, "failed")
    assert store.fetch(quota.QUOTAS, "t") is None
    with fleetstate.lock(opts, ["v"]) as lease:
        quota.reserve(store, lease, "t", "v", {"cpu": 1, "mem": 1}, {}, time.time(), {})
        quota.finish(store, lease, "unknown", keep_for=900)
        quota.finish(store, lease, "failed")  # what vmcreate's cleanup does after a timeout: a no-op now
    assert store.fetch(quota.QUOTAS, "t")["entries"]["v"]["expires"] > time.time() + 800


def test_twenty_concurrent_reservations_never_exceed_the_quota(backend):
    """Twenty callers on as many "masters" (opts with their own ids, one shared store) race for a quota of
    5 vCPUs: exactly five win, whatever the interleaving."""
    won, refused, start = [], [], threading.Barrier(20)

    def contend(i):
        opts = backend(f"m{i}")
        store = fleetstate.Store(opts)
        start.wait()
        with fleetstate.lock(opts, [f"vm{i}"]) as lease:
            try:
                quota.reserve(store, lease, "acme", f"vm{i}", {"cpu": 1, "mem": 64}, {}, time.time(), {"vcpus": 5})
                won.append(i)
                quota.finish(store, lease, "settled")
            except quota.QuotaError as exc:
                refused.append(str(exc))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 5 and len(refused) == 15, (won, refused)
    assert all(msg.startswith("tenant acme: 5 of 5 vCPUs used, asked 1") for msg in refused)
    ledger = fleetstate.Store(backend()).fetch(quota.QUOTAS, "acme")
    assert sorted(ledger["entries"]) == sorted(f"vm{i}" for i in won)


def test_usage_report():
    conf = {"acme": {"quota": {"vcpus": 4}}, "beta": {"quota": {}}}

    class Empty:
        def entries(self, bank):
            return {}

    out = quota.usage(Empty(), HOSTS, conf, time.time())
    assert out["acme"]["vcpus"] == {"used": 3, "quota": 4, "bar": "vCPUs: [###############.....] 3 of 4"}
    assert out["acme"]["vm_names"] == ["a1", "a2"]
    assert out["beta"]["vcpus"]["bar"] == "vCPUs: 4 (no quota)"


def test_a_growth_entry_counts_what_the_snapshot_lacks_and_is_no_vm():
    """``<vm>/update`` (salt-run virt.update growing a1 from 2 to 4 vCPUs, +100 MiB disk): while it runs it
    counts on top of a snapshot that shows a1 with 2 vCPUs, not on top of one that shows 4 already; settled,
    its disk is in a1's own entry."""
    now = time.time()
    grow = {"cpu": 2, "mem": 0, "disk_mib": 100, "grows": "a1", "to": {"cpu": 4, "mem": None}}
    ledger = {"entries": {"a1": {"cpu": 2, "mem": 512, "disk_mib": 3, "state": "settled", "settled_at": now - 60}}}
    ledger["entries"]["a1/update"] = dict(grow, state="active", expires=now + 60)
    used = quota.count(ledger, HOSTS, "acme", since=now, now=now)
    assert (used["vcpus"], used["disk"], used["vms"], used["names"]) == (5, 103, 2, ["a1", "a2"])
    grown = {h: {"status": "up", "vm_info": dict(a["vm_info"])} for h, a in HOSTS.items()}
    grown["h1"]["vm_info"]["a1"] = vm("acme", 4, 512)
    assert quota.count(ledger, grown, "acme", since=now, now=now)["vcpus"] == 5  # 4 + 1, nothing twice
    # settled (a1's own entry folded): an older snapshot still lacks the vCPUs, the disk is a1's own now
    ledger["entries"]["a1"]["disk_mib"] = 103
    ledger["entries"]["a1/update"] = dict(grow, state="settled", settled_at=now)
    older = quota.count(ledger, HOSTS, "acme", since=now - 1, now=now)
    assert (older["vcpus"], older["disk"]) == (5, 103)
    assert quota.count(ledger, HOSTS, "acme", since=now + 60, now=now + 60)["vcpus"] == 3  # pruned: out of the window


def test_growth_reserve_settle_and_forget(backend):
    opts = backend()
    store = fleetstate.Store(opts)
    with fleetstate.lock(opts, ["a1"]) as lease:
        quota.reserve(store, lease, "acme", "a1", {"cpu": 2, "mem": 64}, {}, time.time(), {})
        quota.finish(store, lease, "settled")
    with fleetstate.lock(opts, ["a1"]) as lease:
        to = {"cpu": 4, "mem": None}
        quota.reserve(store, lease, "acme", "a1", {"cpu": 2, "mem": 0, "disk_mib": 10}, {}, time.time(), {}, grow=to)
        quota.finish(store, lease, "settled")
    entries = store.fetch(quota.QUOTAS, "acme")["entries"]
    assert (entries["a1"]["cpu"], entries["a1"]["mem"], entries["a1"]["disk_mib"]) == (4, 64, 10)
    assert entries["a1/update"]["state"] == "settled" and entries["a1/update"]["grows"] == "a1"
    with fleetstate.lock(opts, ["a1"]) as lease, pytest.raises(quota.QuotaError) as err:
        quota.reserve(store, lease, "acme", "a1", {"cpu": 1, "mem": 0}, {}, time.time(), {"vcpus": 4}, grow=to)
    assert str(err.value).startswith("tenant acme: 4 of 4 vCPUs used, asked 1: no room to grow a1 (shrink or purge")
    quota.forget(store, "acme", "a1")
    assert store.fetch(quota.QUOTAS, "acme") is None


GROUPS = {"gpu": {"hypervisors": ["h2", "h3"], "quota": {"vcpus": 3, "vms": 2}}}


def test_a_hypervisor_group_quota_is_checked_where_the_vm_is_placed(backend):
    """acme has a2 (1 vCPU) on h2, in group gpu (3 vCPUs, 2 VMs there); a1 (2 vCPUs) on h1 is not in it."""
    opts = backend()
    store = fleetstate.Store(opts)
    since = time.time()
    with fleetstate.lock(opts, ["n1"]) as lease:
        quota.reserve(store, lease, "acme", "n1", {"cpu": 2, "mem": 64}, HOSTS, since, {"vcpus": 8})
        quota.place(store, lease, "h1", HOSTS, since, GROUPS)  # outside the group: always
        quota.place(store, lease, "h3", HOSTS, since, GROUPS)  # 1 + 2 of 3
        quota.finish(store, lease, "settled")
    assert store.fetch(quota.QUOTAS, "acme")["entries"]["n1"]["host"] == "h3"
    with fleetstate.lock(opts, ["n2"]) as lease:
        quota.reserve(store, lease, "acme", "n2", {"cpu": 1, "mem": 64}, HOSTS, since, {"vcpus": 8})
        with pytest.raises(quota.QuotaError) as err:
            quota.place(store, lease, "h2", HOSTS, since, GROUPS)
        assert str(err.value) == (
            "tenant acme on hypervisor group gpu: 3 of 3 vCPUs used, asked 1; 2 of 2 VMs used, asked 1: "
            "no room for n2 on h2"
        )
        quota.place(store, lease, "h1", HOSTS, since, GROUPS)
    # a growth on the group's hypervisor is checked there in the same transaction
    with (
        fleetstate.lock(opts, ["a2"]) as lease,
        pytest.raises(quota.QuotaError, match="on hypervisor group gpu: 3 of 3 vCPUs"),
    ):
        grow = {"cpu": 2, "mem": None}
        quota.reserve(
            store, lease, "acme", "a2", {"cpu": 1, "mem": 0}, HOSTS, since, {}, grow=grow, host="h2", groups=GROUPS
        )


def test_usage_per_hypervisor_group(backend):
    """virt.usage shows a tenant's use on each hypervisor group of its group_quotas as place() counts it: a2
    (the snapshot, on h2) and n1 (an init placed on h3, not defined yet); a1 on h1 is outside the group."""
    opts = backend()
    store = fleetstate.Store(opts)
    since = time.time()
    with fleetstate.lock(opts, ["n1"]) as lease:
        quota.reserve(store, lease, "acme", "n1", {"cpu": 2, "mem": 64, "disk_mib": 10}, HOSTS, since, {})
        quota.place(store, lease, "h3", HOSTS, since, GROUPS)
        conf = {"acme": {"quota": {"vcpus": 8}, "groups": GROUPS}, "beta": {"quota": {}, "groups": {}}}
        out = quota.usage(store, HOSTS, conf, since)
    gpu = out["acme"]["groups"]["gpu"]
    assert gpu["vcpus"] == {"used": 3, "quota": 3, "bar": "vCPUs: [####################] 3 of 3"}
    assert gpu["vms"]["bar"] == "VMs: [####################] 2 of 2"
    assert gpu["mem"]["bar"] == "MiB memory: 320 (no quota)" and gpu["disk"]["used"] == 10
    assert gpu["vm_names"] == ["a2", "n1"]
    assert out["acme"]["vcpus"]["bar"] == "vCPUs: [############........] 5 of 8"  # every group and none
    assert "groups" not in out["beta"]


def test_concurrent_placements_never_exceed_a_group_quota(backend):
    """Ten inits of one tenant (whose total quota has room) race for a group of 3 vCPUs: three land there."""
    won, refused, start = [], [], threading.Barrier(10)
    groups = {"gpu": {"hypervisors": ["g*"], "quota": {"vcpus": 3}}}

    def contend(i):
        opts = backend(f"m{i}")
        store = fleetstate.Store(opts)
        start.wait()
        with fleetstate.lock(opts, [f"vm{i}"]) as lease:
            quota.reserve(store, lease, "acme", f"vm{i}", {"cpu": 1, "mem": 64}, {}, time.time(), {"vcpus": 20})
            try:
                quota.place(store, lease, "g1", {}, time.time(), groups)
                won.append(i)
                quota.finish(store, lease, "settled")
            except quota.QuotaError as exc:
                refused.append(str(exc))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 3 and len(refused) == 7, (won, refused)
    assert all(msg.startswith("tenant acme on hypervisor group gpu: 3 of 3 vCPUs used, asked 1") for msg in refused)


def test_a_snapshot_with_a_silent_hypervisor_prunes_nothing(backend):
    """h3 did not answer: acme's settled a9 and an init of a8 that expired unanswered may both be VMs there, so
    neither leaves the ledger (a8 no longer counts); a snapshot in which every hypervisor answered prunes them."""
    opts = backend()
    store = fleetstate.Store(opts)
    now = time.time()
    entries = {
        "a9": {"cpu": 1, "mem": 64, "state": "settled", "settled_at": now - 600, "host": "h3"},
        "a8": {"cpu": 1, "mem": 64, "state": "active", "expires": now - 60, "token": "gone"},
    }
    store.transact(quota.QUOTAS, "acme", lambda _old: {"entries": dict(entries)})
    silent = dict(HOSTS, h3={"status": "down", "error": "did not answer"})
    with fleetstate.lock(opts, ["n1"]) as lease:
        quota.reserve(store, lease, "acme", "n1", {"cpu": 1, "mem": 64}, silent, now, {})
        quota.finish(store, lease, "failed")
    assert sorted(store.fetch(quota.QUOTAS, "acme")["entries"]) == ["a8", "a9"]
    assert quota.count(store.fetch(quota.QUOTAS, "acme"), silent, "acme", now)["names"] == ["a1", "a2", "a9"]
    with fleetstate.lock(opts, ["n1"]) as lease:
        quota.reserve(store, lease, "acme", "n1", {"cpu": 1, "mem": 64}, HOSTS, now, {})
        quota.finish(store, lease, "failed")
    assert store.fetch(quota.QUOTAS, "acme") is None


def test_a_migration_into_a_hypervisor_group_takes_its_group_quota(backend):
    """A tenant's salt-run virt.migrate of a1 (2 vCPUs, on h1) to h3 of group gpu (a2 there: 1 vCPU): the move
    entry counts in gpu only (a1 counts in the tenant's total already), until the snapshot shows a1 there;
    settled, a1's own entry is on h3. A group without room refuses it as placement does; a move within the
    group, or out of it, takes nothing."""
    opts = backend()
    store = fleetstate.Store(opts)
    since = time.time()
    with fleetstate.lock(opts, ["a1"]) as lease:  # the entry salt-run virt.init left, placed on h1
        quota.reserve(store, lease, "acme", "a1", {"cpu": 2, "mem": 512}, HOSTS, since, {}, host="h1")
        quota.finish(store, lease, "settled")
    small = {"gpu": dict(GROUPS["gpu"], quota={"vcpus": 2})}
    with fleetstate.lock(opts, ["a1"]) as lease, pytest.raises(quota.QuotaError) as err:
        quota.move(store, lease, "acme", "a1", "h1", "h3", HOSTS, since, small)
    assert str(err.value) == "tenant acme on hypervisor group gpu: 1 of 2 vCPUs used, asked 2: no room for a1 on h3"
    with fleetstate.lock(opts, ["a1"]) as lease:
        quota.move(store, lease, "acme", "a1", "h1", "h3", HOSTS, since, GROUPS)
        ledger = store.fetch(quota.QUOTAS, "acme")
        assert quota.count(ledger, HOSTS, "acme", since)["vcpus"] == 3  # the total: a1 once
        in_gpu = quota.count(ledger, HOSTS, "acme", since, on=quota._on(GROUPS["gpu"]))
        assert (in_gpu["vcpus"], in_gpu["vms"], in_gpu["names"]) == (3, 2, ["a2", "a1"])
        quota.finish(store, lease, "settled")
    ledger = store.fetch(quota.QUOTAS, "acme")
    assert ledger["entries"]["a1"]["host"] == "h3" and ledger["entries"]["a1/migrate"]["state"] == "settled"
    moved = {h: {"status": "up", "vm_info": dict(a["vm_info"])} for h, a in HOSTS.items()}
    moved["h3"] = {"status": "up", "vm_info": {"a1": moved["h1"]["vm_info"].pop("a1")}}
    assert quota.count(ledger, moved, "acme", since - 1, on=quota._on(GROUPS["gpu"]))["vcpus"] == 3  # a1 once
    with fleetstate.lock(opts, ["a2"]) as lease:  # h2 -> h3: within gpu; h2 -> h1: out of it
        quota.move(store, lease, "acme", "a2", "h2", "h3", HOSTS, since, small)
        quota.move(store, lease, "acme", "a2", "h2", "h1", HOSTS, since, small)
        assert lease.quota is None
    quota.forget(store, "acme", "a1")
    assert "a1/migrate" not in (store.fetch(quota.QUOTAS, "acme") or {}).get("entries", {})


def test_move_refusals_read_what_move_would_refuse():
    """The read-only hint a planner uses: a1 (2 vCPUs, h1) into gpu (a2 there, 1 vCPU) fits a quota of 3, not of
    2 (the wording of move's refusal); a move within the group or out of it is never refused."""
    since = time.time()
    small = {"gpu": dict(GROUPS["gpu"], quota={"vcpus": 2})}
    assert quota.move_refusals(None, HOSTS, "acme", "a1", "h1", ["h2", "h3"], since, GROUPS) == {}
    why = "tenant acme on hypervisor group gpu: 1 of 2 vCPUs used, asked 2"
    assert quota.move_refusals(None, HOSTS, "acme", "a1", "h1", ["h2", "h3"], since, small) == {"h2": why, "h3": why}
    assert quota.move_refusals(None, HOSTS, "acme", "a2", "h2", ["h1", "h3"], since, small) == {}
    # an active entry in the ledger (an init placed on h3) counts as move() counts it
    ledger = {"entries": {"n1": {"cpu": 1, "mem": 64, "state": "active", "expires": since + 60, "host": "h3"}}}
    refused = quota.move_refusals(ledger, HOSTS, "acme", "a1", "h1", ["h3"], since, GROUPS)
    assert "2 of 3 vCPUs used, asked 2" in refused["h3"]


def test_move_refusals_count_each_group_once(monkeypatch):
    """A group's use does not depend on which of its hosts a VM moves to: counted once for every target in it
    (each count scans every VM of the snapshot: a balancing round asked it per host before)."""
    counted = []
    real = quota.count
    monkeypatch.setattr(quota, "count", lambda *a, **k: counted.append(1) or real(*a, **k))  # a spy: real counts
    group = {"gpu": {"hypervisors": ["h2", "h3", "h4", "h5"], "quota": {"vcpus": 2}}}
    refused = quota.move_refusals(None, HOSTS, "acme", "a1", "h1", ["h2", "h3", "h4", "h5"], time.time(), group)
    assert sorted(refused) == ["h2", "h3", "h4", "h5"] and len(counted) == 1, (refused, counted)
