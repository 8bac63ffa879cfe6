"""saltvirt.fleet.vmupdate: the master side of ``salt-run virt.update``. The hypervisor is the real module
``virt.update``/``virt.full_info`` on libvirt's test driver (``virt_test``), called the way
``saltvirt.fleet.publish.Fleet.call`` answers; the quota ledger is a real localfs store (the runner's publication
to real minions through salt-api: tests/integration/test_tenants.py)."""

import threading
import time

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import fleetstate, quota, vmupdate
from tests.support.signedfleet import SigningClient, fleet_opts

OWNER = {"tenant": "acme", "creator": "alice"}


@pytest.fixture
def hv(virt_test, tmp_path):
    """``(locate, call, opts)`` for one hypervisor ``hv1`` answered by ``virt_test``, and master opts."""
    import salt.config

    opts = dict(salt.config.master_config(None), id="m1", cachedir=str(tmp_path / "master-cache"), virt={})

    def locate():
        return "hv1", {"hv1": {"status": "up", "vm_info": virt_test["virt.full_info"]()["vm_info"]}}

    def call(host, fun, args, kwargs):
        try:
            return {"status": "up", "ret": virt_test[fun](*args, **kwargs)}
        except Exception as exc:  # noqa: BLE001 - what the minion's job returns for a raising module
            return {"status": "error", "error": str(exc)}

    return locate, call, opts


def define(virt_test, name, cpu=1, mem=64):
    virt_test["virt.init"](name, cpu, mem, nic=None, disk=None, start=False, owner=OWNER)


def settle(opts, name, cpu, mem):
    """The ledger entry ``virt.init`` leaves for a tenant's VM."""
    store = fleetstate.Store(opts)
    with fleetstate.lock(opts, [name]) as lease:
        quota.reserve(store, lease, "acme", name, {"cpu": cpu, "mem": mem}, {}, time.time(), {})
        quota.finish(store, lease, "settled")
    return store


def vcpus(virt_test, name):
    return virt_test["virt.vm_info"](name)[name]["cpu"]


def test_arguments_are_the_modules():
    assert vmupdate.arguments({"nic_profile": "p", "disk_profile": "d", "__pub_user": "x", "live": False}) == {
        "nic": "p",
        "disk": "d",
        "live": False,
    }
    with pytest.raises(SaltInvocationError, match="connection= is not forwarded"):
        vmupdate.arguments({"connection": "qemu:///system"})
    with pytest.raises(SaltInvocationError, match=r"unknown argument\(s\) imgae"):
        vmupdate.arguments({"imgae": "x"})
    with pytest.raises(SaltInvocationError, match="give nic= or nic_profile="):
        vmupdate.arguments({"nic": "a", "nic_profile": "b"})
    assert vmupdate.sizes("4", 0) == (4, None)
    with pytest.raises(SaltInvocationError, match="cpu"):
        vmupdate.sizes({"placement": "static", "maximum": 4}, None)


def test_growth_is_the_positive_part_of_each_change():
    vm = {"cpu": 2, "mem": 1024}
    added = {"disks": {"added": [{"size": 100, "attach": False}, {"size": None, "attach": True}]}}
    assert vmupdate.growth(vm, 4, 512, added) == {"cpu": 2, "mem": 0, "disk_mib": 100}
    assert vmupdate.growth(vm, None, 2048) == {"cpu": 0, "mem": 1024, "disk_mib": 0}


def test_a_tenant_grows_within_its_quota_and_is_refused_past_it(virt_test, hv):
    locate, call, opts = hv
    define(virt_test, "u1")
    store = settle(opts, "u1", 1, 64)
    tenant = {"name": "acme", "quota": {"vcpus": 2, "vms": 1, "disk": 8}}
    ret = vmupdate.update(opts, "u1", 2, None, {}, locate=locate, call=call, tenant=tenant)
    assert ret["host"] == "hv1" and ret["cpu"] is True and ret["changes"]["cpu"]["new"] == 2
    assert vcpus(virt_test, "u1") == 2
    entries = store.fetch(quota.QUOTAS, "acme")["entries"]
    assert entries["u1"]["cpu"] == 2  # the VM's own entry has its new size
    assert entries["u1/update"]["state"] == "settled" and entries["u1/update"]["cpu"] == 1
    with pytest.raises(quota.QuotaError) as err:
        vmupdate.update(opts, "u1", 3, None, {}, locate=locate, call=call, tenant=tenant)
    assert str(err.value) == (
        "tenant acme: 2 of 2 vCPUs used, asked 1: no room to grow u1 "
        "(shrink or purge one of its VMs, or ask the operator for a larger quota)"
    )
    assert vcpus(virt_test, "u1") == 2
    # a new disk counts with its size (as the hypervisor builds it): 8 MiB fit, 9 more do not
    ret = vmupdate.update(
        opts,
        "u1",
        None,
        None,
        {"disk": None, "disks": [{"data": {"size": 8}}]},
        locate=locate,
        call=call,
        tenant=tenant,
    )
    assert [d["name"] for d in ret["disk"]["attached"]] == ["data"]
    assert store.fetch(quota.QUOTAS, "acme")["entries"]["u1"]["disk_mib"] == 8
    with pytest.raises(quota.QuotaError, match="8 of 8 MiB disk used, asked 9: no room to grow u1"):
        vmupdate.update(
            opts,
            "u1",
            None,
            None,
            {"disk": None, "disks": [{"data": {"size": 8}}, {"more": {"size": 9}}]},
            locate=locate,
            call=call,
            tenant=tenant,
        )
    assert list(virt_test["virt.get_disks"]("u1")) == ["vda"]
    # shrinking takes nothing, and an operator's update is not counted
    assert vmupdate.update(opts, "u1", 1, None, {}, locate=locate, call=call, tenant=tenant)["cpu"] is True
    assert vmupdate.update(opts, "u1", 8, None, {}, locate=locate, call=call)["cpu"] is True
    assert vcpus(virt_test, "u1") == 8


def test_a_growth_that_waits_for_a_restart_counts_for_good(virt_test, hv):
    """Issue 34 #5: live=False grows a running VM's definition only (pending_restart); the running VM keeps its
    old sizes until its restart. The quota counts the bigger of the two in every later snapshot, not only
    while the growth entry is in its settle window, so the tenant cannot grow another VM into that room."""
    locate, call, opts = hv
    virt_test["virt.init"]("r1", 1, 64, nic=None, disk=None, start=True, owner=OWNER)
    store = settle(opts, "r1", 1, 64)
    tenant = {"name": "acme", "quota": {"vcpus": 2, "mem": 128}}
    ret = vmupdate.update(opts, "r1", 2, 128, {"live": False}, locate=locate, call=call, tenant=tenant)
    assert ret["pending_restart"] == ["cpu", "mem"] and vcpus(virt_test, "r1") == 1
    later = time.time() + 3600  # a snapshot taken long after the growth settled: its entry no longer counts
    ledger = store.fetch(quota.QUOTAS, "acme")
    used = quota.count(ledger, locate()[1], "acme", since=later, now=later)
    assert (used["vcpus"], used["mem"]) == (2, 128)
    conf = {"acme": {"quota": tenant["quota"]}}
    assert quota.usage(store, locate()[1], conf, later)["acme"]["vcpus"]["bar"].endswith("2 of 2")
    # growing it to what its definition has already takes nothing; one more vCPU does not fit
    assert vmupdate.growth(locate()[1]["hv1"]["vm_info"]["r1"], 2, 128) == {"cpu": 0, "mem": 0, "disk_mib": 0}
    with pytest.raises(quota.QuotaError, match=r"^tenant acme: 2 of 2 vCPUs used, asked 1: no room to grow r1"):
        vmupdate.update(opts, "r1", 3, None, {"live": False}, locate=locate, call=call, tenant=tenant)


def test_an_operators_update_of_a_tenants_vm_shows_in_its_usage(virt_test, hv):
    """Not refused by the quota (acme: 1 MiB disk), but the disk it adds and the new vCPUs go into the VM's
    ledger entry, which the tenant's usage counts; a VM no tenant's ledger has is left alone."""
    locate, call, opts = hv
    define(virt_test, "o1")
    store = settle(opts, "o1", 1, 64)
    kwargs = {"disk": None, "disks": [{"data": {"size": 8}}]}
    ret = vmupdate.update(opts, "o1", 2, None, kwargs, locate=locate, call=call)
    assert [d["name"] for d in ret["disk"]["attached"]] == ["data"]
    entry = store.fetch(quota.QUOTAS, "acme")["entries"]["o1"]
    assert (entry["cpu"], entry["mem"], entry["disk_mib"]) == (2, 64, 8)
    conf = {"acme": {"quota": {"disk": 1}}}
    assert quota.usage(store, {"hv1": locate()[1]["hv1"]}, conf, time.time())["acme"]["disk"]["used"] == 8
    # test=True records nothing; a VM in no ledger: nothing written (its usage is what the snapshot shows)
    vmupdate.update(
        opts, "o1", None, None, {"disk": None, "disks": [{"more": {"size": 4}}], "test": True}, locate=locate, call=call
    )
    assert store.fetch(quota.QUOTAS, "acme")["entries"]["o1"]["disk_mib"] == 8
    define(virt_test, "o2")
    vmupdate.update(opts, "o2", None, None, kwargs, locate=locate, call=call)
    assert "o2" not in store.fetch(quota.QUOTAS, "acme")["entries"]
    assert quota.record(store, "o2", {}, 8) is None and quota.record(store, "o1", {}, 0) == "acme"


def test_a_failed_update_gives_the_growth_back(virt_test, hv):
    locate, call, opts = hv
    define(virt_test, "u2")
    store = settle(opts, "u2", 1, 64)
    tenant = {"name": "acme", "quota": {"mem": 128}}
    with pytest.raises(vmupdate.publish.Failed, match="virt.update u2 on hv1: error: .*graphics"):
        vmupdate.update(
            opts, "u2", None, 128, {"graphics": {"type": "nonsense"}}, locate=locate, call=call, tenant=tenant
        )
    assert sorted(store.fetch(quota.QUOTAS, "acme")["entries"]) == ["u2"]  # no growth entry left
    assert virt_test["virt.vm_info"]("u2")["u2"]["mem"] == 64
    # test=True changes nothing and takes nothing
    ret = vmupdate.update(opts, "u2", None, 1024, {"test": True}, locate=locate, call=call, tenant=tenant)
    assert ret["changes"]["mem"]["new"] == 1024 and virt_test["virt.vm_info"]("u2")["u2"]["mem"] == 64


def test_concurrent_growths_of_one_tenant_never_exceed_its_quota(virt_test, hv):
    """Six VMs of one tenant grow by one vCPU each at once, two vCPUs free: exactly two grow."""
    locate, call, opts = hv
    names = [f"g{i}" for i in range(6)]
    for name in names:
        define(virt_test, name)
        settle(opts, name, 1, 64)
    tenant = {"name": "acme", "quota": {"vcpus": 8}}
    won, refused, start = [], [], threading.Barrier(len(names))

    def grow(name):
        start.wait()
        try:
            vmupdate.update(opts, name, 2, None, {}, locate=locate, call=call, tenant=tenant)
            won.append(name)
        except quota.QuotaError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=grow, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 2 and len(refused) == 4, (won, refused)
    assert all(r.startswith("tenant acme: 8 of 8 vCPUs used, asked 1") for r in refused), refused
    assert sum(vcpus(virt_test, n) for n in names) == 8


def test_a_tenants_tgt_never_hides_its_vms_elsewhere_from_its_quota(virt_test, tmp_path):
    """salt-run virt.update u1 cpu=2 tgt=hv1 by a tenant (acme: 2 vCPUs): a2 (1 vCPU) on hv2 counts, so the
    growth is refused; u1 is found on hv1 (the runner's lookup, tenants.where, through the publication)."""
    from saltvirt.fleet import publish, tenants

    define(virt_test, "u1")
    hv1 = {"host": {}, "vm_info": virt_test["virt.full_info"]()["vm_info"]}
    hv2 = {"host": {}, "vm_info": {"a2": {"cpu": 1, "mem": 64, "state": "running", "owner": OWNER}}}
    opts = fleet_opts(tmp_path, ["hv1", "hv2"], tenants={"acme": {"members": ["alice"], "quota": {"vcpus": 2}}})
    client = SigningClient({"virt.full_info": {"hv1": hv1, "hv2": hv2}})
    alice = tenants.Caller("alice", operator=False, tenant="acme")
    cfg = publish.config(opts, tgt="hv1")
    store = settle(opts, "u1", 1, 64)

    def call(host, fun, args, kwargs):
        return {"status": "up", "ret": virt_test[fun](*args, **kwargs)}

    with pytest.raises(quota.QuotaError) as err:
        vmupdate.update(
            opts,
            "u1",
            2,
            None,
            {},
            locate=lambda: tenants.where(publish.Fleet(opts, cfg, client), alice, "u1", None),
            call=call,
            tenant={"name": "acme", "quota": {"vcpus": 2}},
        )
    assert str(err.value).startswith("tenant acme: 2 of 2 vCPUs used, asked 1: no room to grow u1"), str(err.value)
    assert client.published == [("virt.full_info", ["hv1", "hv2"])] and vcpus(virt_test, "u1") == 1
    assert sorted(store.fetch(quota.QUOTAS, "acme")["entries"]) == ["u1"]
    # a VM on a hypervisor outside tgt is not found there (tgt still says where to look)
    with pytest.raises(publish.Failed, match="^no VM named a2 in tenant acme$"):
        tenants.where(publish.Fleet(opts, cfg, client), alice, "a2", None)


def test_a_tenant_is_told_whose_call_holds_a_vm_for_its_own_vms_only(virt_test, hv):
    """A tenant's update of another tenant's VM whose name a call holds (being created, moved or changed) gets
    the refusal of a name nobody has, never who holds it (issue 34 #7); its own VM and an operator: the holder."""
    from saltvirt.fleet import callers, publish, tenants

    locate, call, opts = hv
    define(virt_test, "u2")
    virt_test["virt.init"]("o2", 1, 64, nic=None, disk=None, start=False, owner={"tenant": "beta", "creator": "bob"})
    conf = {"virt": {"tenants": {"acme": {"members": ["alice"]}, "beta": {"members": ["bob"]}}}}
    alice = callers.resolve(conf, "alice")

    def as_alice(name):  # the runner's locate for a tenant caller: its tenant's VMs only
        def mine():
            hosts = locate()[1]
            return tenants.locate(tenants.visible(hosts, alice, tenants.config(conf)), name, alice), hosts

        return mine

    tenant = {"name": "acme", "quota": {}}
    with pytest.raises(publish.Failed, match="^no VM named nothere in tenant acme$"):
        vmupdate.update(opts, "nothere", 2, None, {}, locate=as_alice("nothere"), call=call, tenant=tenant)
    with fleetstate.lock(opts, ["o2", "u2"], kind="virt.migrate"):
        with pytest.raises(publish.Failed, match="^no VM named o2 in tenant acme$"):
            vmupdate.update(opts, "o2", 2, None, {}, locate=as_alice("o2"), call=call, tenant=tenant)
        with pytest.raises(fleetstate.HeldError, match="'u2' is held: virt.migrate by master m1"):
            vmupdate.update(opts, "u2", 2, None, {}, locate=as_alice("u2"), call=call, tenant=tenant)
        with pytest.raises(fleetstate.HeldError, match="'o2' is held: virt.migrate by master m1"):
            vmupdate.update(opts, "o2", 2, None, {}, locate=locate, call=call)
    assert vcpus(virt_test, "o2") == 1 and vcpus(virt_test, "u2") == 1
