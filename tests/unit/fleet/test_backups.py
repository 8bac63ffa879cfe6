"""saltvirt.fleet.backups: settings, the per-host plan, and the fan-out with retention. The fan-out runs the
real ``virt.backup``/``virt.backup_prune`` of this repo's loader on libvirt's test driver: only Salt's
transport (publish to a minion, gather its answer) is replaced by a direct call, since unit tests run no
salt daemons (tests/integration/test_backup_runner.py runs the real runner)."""

import threading

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import backups, callers, tenants
from tests.unit.vm.test_backup import bk  # noqa: F401 - the fixture is shared


def test_settings_call_over_config_and_checked():
    conf = {"per_host": 2, "timeout": 60, "retention": {"keep_daily": 7}}
    assert backups.settings(conf) == {"per_host": 2, "timeout": 60, "retention": {"keep_daily": 7}}
    assert backups.settings(conf, per_host=3, keep=2)["retention"] == {"keep": 2}
    assert backups.settings(None) == {"per_host": 1, "timeout": 21600, "retention": {}}
    with pytest.raises(SaltInvocationError, match="unknown argument"):
        backups.settings({}, keep_monthly=3)
    with pytest.raises(SaltInvocationError, match="unknown key"):
        backups.settings({"retention": {"keep_yearly": 1}})
    with pytest.raises(SaltInvocationError):
        backups.settings({}, per_host=0)


def test_plan_finds_each_vms_host_and_refuses_ambiguity():
    hosts = {
        "h1": {"status": "up", "vms": {"a": "running", "dup": "running"}},
        "h2": {"status": "up", "vms": {"b": "shutdown", "dup": "shutdown"}},
        "h3": {"status": "down", "error": "did not answer"},
    }
    work, problems = backups.plan(hosts, "all")
    assert work == {"h1": ["a"], "h2": ["b"]}
    assert problems == {"dup": "defined on h1, h2: back it up with salt '<host>' virt.backup dup"}
    assert backups.plan(hosts, "b") == ({"h2": ["b"]}, {})
    assert backups.plan(hosts, "zz")[1] == {"zz": "not defined on any hypervisor that answered (down: h3)"}
    with pytest.raises(SaltInvocationError):
        backups.plan(hosts, "../x")


def test_run_backs_up_prunes_and_respects_the_per_host_limit(bk):  # noqa: F811
    v, _tmp = bk
    v["virt.init"]("bk2", 1, 64, disk=None, nic=None, start=False, seed=False, disks=[{"name": "d", "size": 8}])
    busy, peak, lock = {}, {}, threading.Lock()

    def call(host, fun, args, kwargs, max_wait):
        with lock:
            busy[host] = busy.get(host, 0) + 1
            peak[host] = max(peak.get(host, 0), busy[host])
        try:
            return {"status": "up", "ret": v[fun](*args, **kwargs)}
        except Exception as exc:  # noqa: BLE001 - what a minion answers with
            return {"status": "error", "error": str(exc)}
        finally:
            with lock:
                busy[host] -= 1

    cfg = backups.settings({}, per_host=1, keep=1)
    lines = []
    try:
        first = backups.run(call, {"h1": ["bk1", "bk2"]}, cfg, progress=lines.append)
        assert sorted(first["made"]) == ["bk1", "bk2"] and first["failed"] == {}
        assert first["made"]["bk1"]["host"] == "h1" and first["made"]["bk1"]["type"] == "full"
        second = backups.run(call, {"h1": ["bk1", "nosuchvm"]}, cfg, progress=lines.append)
        assert second["pruned"]["bk1"]["pruned"] == [first["made"]["bk1"]["id"]]  # keep=1: the older full goes
        assert second["pruned"]["bk1"]["kept"] == [second["made"]["bk1"]["id"]]
        assert "nosuchvm" in second["failed"] and "is not defined" in second["failed"]["nosuchvm"]
        assert peak == {"h1": 1}
        assert len(lines) == 4 and lines[0].startswith("[1/2] ")
    finally:
        conn = libvirt.open("test:///default")
        conn.lookupByName("bk2").undefine()
        conn.close()


# tenants: what a run backs up (the whole flow with a real master: tests/integration/test_backup_runner.py)
TENANTS = {"tenants": {"acme": {"members": ["alice"]}, "beta": {"members": ["bob"]}}, "operators": ["carol"]}


def test_scope_tenant_callers_get_their_own_tenant_only():
    conf = tenants.config({"virt": TENANTS})
    alice = callers.resolve({"virt": TENANTS}, "alice")
    carol = callers.resolve({"virt": TENANTS}, "carol")
    assert backups.scope(alice, None, conf) == "acme"
    assert backups.scope(alice, "acme", conf) == "acme"
    with pytest.raises(SaltInvocationError, match="user alice is in tenant acme: tenant=beta is refused"):
        backups.scope(alice, "beta", conf)
    assert backups.scope(carol, None, conf) is None  # an operator: every VM
    assert backups.scope(carol, "beta", conf) == "beta"
    with pytest.raises(SaltInvocationError, match="no tenant named 'gamma' in virt:tenants"):
        backups.scope(carol, "gamma", conf)


def test_plan_for_a_tenant_sees_its_own_vms_only():
    def vm(state, tenant=None):
        return {"state": state, "owner": {"tenant": tenant, "creator": "x"} if tenant else None}

    full_info = {
        "h1": {"status": "up", "vm_info": {"a1": vm("running", "acme"), "b1": vm("running", "beta"), "o": vm("x")}},
        "h2": {"status": "up", "vm_info": {"a2": vm("shutdown", "acme")}},
        "h3": {"status": "down", "error": "did not answer"},
    }
    hosts = backups.owned(full_info, "acme")
    assert hosts["h1"] == {"status": "up", "vms": {"a1": "running"}} and hosts["h3"]["status"] == "down"
    assert backups.plan(hosts, "all", tenant="acme") == ({"h1": ["a1"], "h2": ["a2"]}, {})
    work, problems = backups.plan(hosts, "b1", tenant="acme")  # another tenant's VM: as if it did not exist
    assert work == {} and problems == {"b1": "no VM named b1 in tenant acme (down: h3)"}
    assert backups.plan(backups.owned(full_info, "beta"), "all", tenant="beta")[0] == {"h1": ["b1"]}


# salt-run virt.restore: where, and never one VM twice (with a real master: tests/integration/test_backup_runner.py)
FLEET = {
    "h1": {"status": "up", "vms": {"web1": "running", "db1": "shutdown"}},
    "h2": {"status": "up", "vms": {}},
}


def test_restore_under_the_same_name_is_refused_while_the_vm_is_defined_elsewhere():
    with pytest.raises(CommandExecutionError, match=r"VM web1 is defined on h1 \(running\): restoring it on h2"):
        backups.restore_host(FLEET, "web1", "h2")
    with pytest.raises(CommandExecutionError, match=r"VM db1 is defined on h1 \(shutdown\)"):  # stopped counts
        backups.restore_host(FLEET, "db1", "h2")
    assert backups.restore_host(FLEET, "web1") == ("h1", [])  # in place: the module checks running/force
    assert backups.restore_host(FLEET, "web1", "h1") == ("h1", [])
    assert backups.restore_host(FLEET, "gone", "h2") == ("h2", [])  # purged everywhere: any host may
    assert backups.restore_host(FLEET, "web1", "h2", as_name="web1-copy") == ("h2", [])  # a new identity


def test_restore_refusals_name_the_way_out():
    with pytest.raises(SaltInvocationError, match="a VM named db1 is defined on h1 .*: choose another as_name"):
        backups.restore_host(FLEET, "web1", "h2", as_name="db1")
    with pytest.raises(SaltInvocationError, match="name the hypervisor to restore VM gone on: host="):
        backups.restore_host(FLEET, "gone")
    with pytest.raises(CommandExecutionError, match=r"hypervisor h9 did not answer .*\(answered: h1, h2\)"):
        backups.restore_host(FLEET, "gone", "h9")
    down = dict(FLEET, h3={"status": "down", "error": "no answer"})
    with pytest.raises(CommandExecutionError, match=r"h3 did not answer: VM gone may be defined or running there"):
        backups.restore_host(down, "gone", "h2")
    assert backups.restore_host(down, "gone", "h2", ignore_down=True) == ("h2", ["h3"])
    assert backups.restore_host(down, "gone", "h2", as_name="gone2") == ("h2", ["h3"])


def test_a_tenant_restores_its_own_backups_only_and_a_new_vm_counts(bk):  # noqa: F811
    """The owner is the one the backup recorded in the VM's domain XML (virt.backup_list shows it), never
    the name: the restore of a copy asks the quota for the VM the backup recorded."""
    v, _tmp = bk
    owner = {"tenant": "acme", "creator": "alice"}
    v["virt.init"](
        "bk3", 2, 64, disk=None, nic=None, start=False, seed=False, disks=[{"name": "d", "size": 8}], owner=owner
    )
    try:
        made = v["virt.backup"]("bk3")["id"]
        theirs = v["virt.backup"]("bk1")["id"]
        listing = v["virt.backup_list"]("bk3")
        assert listing["backups"][0]["owner"] == owner and listing["backups"][0]["cpu"] == 2
        full = {"h1": {"status": "up", "vm_info": v["virt.full_info"]()["vm_info"]}}
        conf = tenants.config({"virt": dict(TENANTS, tenants={"acme": {"members": ["alice"]}, "beta": {}})})
        acme, beta = conf["tenants"]["acme"], conf["tenants"]["beta"]
        alice, bob = callers.resolve({"virt": TENANTS}, "alice"), callers.resolve({"virt": TENANTS}, "bob")
        counted = {"cpu": 2, "mem": 64, "disk_mib": 8}  # what its quota counts of bk3 (its ledger entry's disk)
        assert backups.tenant_restore(alice, acme, full, listing, "bk3", made, "h1", counted=counted) is None
        copy = backups.tenant_restore(alice, acme, full, listing, "bk3", made, "h1", as_name="bk3-copy")
        assert copy == {"cpu": 2, "mem": 64, "disk_mib": 8}
        with pytest.raises(SaltInvocationError, match=f"^no backup {made} of a VM named bk3 in tenant beta$"):
            backups.tenant_restore(bob, beta, full, listing, "bk3", made, "h1", as_name="x")
        other = v["virt.backup_list"]("bk1")  # a VM of no tenant
        with pytest.raises(SaltInvocationError, match=f"^no backup {theirs} of a VM named bk1 in tenant acme$"):
            backups.tenant_restore(alice, acme, full, other, "bk1", theirs, "h1", as_name="x")
        with pytest.raises(SaltInvocationError, match="tenant acme may not use hypervisor 'h1'"):
            backups.tenant_restore(alice, dict(acme, hypervisors=["h9"]), full, listing, "bk3", made, "h1", "x")
    finally:
        conn = libvirt.open("test:///default")
        conn.lookupByName("bk3").undefine()
        conn.close()


def test_a_tenant_member_may_not_pass_the_operators_restore_switches():
    """force= powers a running VM off; ignore_down= bets that a hypervisor that did not answer runs nothing."""
    alice = callers.resolve({"virt": TENANTS}, "alice")
    carol = callers.resolve({"virt": TENANTS}, "carol")
    for key in ("force", "ignore_down"):
        with pytest.raises(SaltInvocationError, match=f"^tenant acme may not pass {key} to virt.restore "):
            backups.operator_args(alice, "virt.restore", {key: True})
        backups.operator_args(carol, "virt.restore", {key: True})  # an operator's to pass
    backups.operator_args(alice, "virt.restore", {"force": None, "ignore_down": ""})  # not passed: fine


def test_a_tenant_member_runs_backups_with_the_operators_retention_and_load():
    """Retention (how much of the backup store a tenant fills), per_host and timeout (the hypervisors' IO) come
    from virt:backup in the master config for a tenant member: passing them is refused, never clamped."""
    alice = callers.resolve({"virt": TENANTS}, "alice")
    carol = callers.resolve({"virt": TENANTS}, "carol")
    for key, value in (("keep", 1000), ("keep_daily", 365), ("keep_weekly", 52), ("per_host", 16), ("timeout", 9e9)):
        with pytest.raises(SaltInvocationError, match=f"^tenant acme may not pass {key} to virt.backup "):
            backups.operator_args(alice, "virt.backup", {key: value})
        backups.operator_args(carol, "virt.backup", {key: value})
    backups.operator_args(alice, "virt.backup", {"per_host": None, "timeout": None, "__pub_user": "alice"})


def test_a_tenants_backups_stop_at_its_backup_mib_quota(bk):  # noqa: F811
    """backup_mib: what the tenant's backups take in the backup directories (the owner each backup recorded),
    counted once when hypervisors share the directory; a run backs up its VMs only while under it."""
    v, _tmp = bk
    owner = {"tenant": "acme", "creator": "alice"}
    v["virt.init"](
        "bk3", 1, 64, disk=None, nic=None, start=False, seed=False, disks=[{"name": "d", "size": 8}], owner=owner
    )

    def call(host, fun, args, kwargs, max_wait):
        return {"status": "up", "ret": v[fun](*args, **kwargs)}

    try:
        conf = tenants.config({"virt": dict(TENANTS, tenants={"acme": {"quota": {"vms": 2, "backup_mib": 1}}})})
        assert backups.backup_quotas(conf) == {"acme": 1} and backups.backup_quotas(conf, "beta") == {}
        owners = {"bk3": "acme"}
        first = backups.run(
            call, {"h1": ["bk3", "bk1"]}, backups.settings({}), budget=backups.Budget({"acme": 1}, {}, owners)
        )
        assert sorted(first["made"]) == ["bk1", "bk3"] and first["failed"] == {}
        usage = v["virt.backup_usage"]()
        assert {e["tenant"] for e in usage.values()} == {"acme", None} and len(usage) == 2
        shared = {"h1": {"status": "up", "ret": usage}, "h2": {"status": "up", "ret": usage}, "h3": {"status": "down"}}
        used = backups.backup_use(shared)
        assert used == {"acme": 1}  # a shared directory counts once; a VM of no tenant counts for none
        budget = backups.Budget({"acme": 1}, used, owners)
        second = backups.run(call, {"h1": ["bk3", "bk1"]}, backups.settings({}), budget=budget)
        assert sorted(second["made"]) == ["bk1"] and second["failed"] == {
            "bk3": "tenant acme: 1 of 1 MiB of backups used: no room for a backup of bk3 (the operator deletes old "
            "backups or gives a larger backup_mib quota)"
        }
        assert budget.report() == {"acme": {"used": 1, "quota": 1}}
        with pytest.raises(SaltInvocationError, match="unknown key"):  # not a hypervisor group's
            tenants.config(
                {
                    "virt": {
                        "hypervisor_groups": {"g": ["h*"]},
                        "tenants": {"acme": {"group_quotas": {"g": {"backup_mib": 1}}}},
                    }
                }
            )
    finally:
        conn = libvirt.open("test:///default")
        conn.lookupByName("bk3").undefine()
        conn.close()


def test_a_tenants_restore_is_never_told_another_tenants_vm_or_its_host():
    """What salt-run virt.restore checks for a tenant caller before restore_host (whose refusals name any VM's
    hypervisor and state, as the first two asserts show): a copy's name another tenant's VM has is a taken
    name, an in-place restore over another tenant's VM the refusal of a VM that does not exist; the same when
    another call holds the name, unless it is the caller's own VM (issue 34 #7)."""

    def vm(tenant):
        return {"state": "running", "owner": {"tenant": tenant, "creator": "x"}}

    full = {"h1": {"status": "up", "vm_info": {"a1": vm("acme"), "b1": vm("beta")}}, "h2": {"status": "up"}}
    with pytest.raises(SaltInvocationError, match=r"a VM named b1 is defined on h1 \(running\)"):
        backups.restore_host(backups.vm_states(full), "a1", "h2", as_name="b1")
    with pytest.raises(CommandExecutionError, match=r"VM b1 is defined on h1 \(running\)"):
        backups.restore_host(backups.vm_states(full), "b1", "h2")
    alice = callers.resolve({"virt": TENANTS}, "alice")
    refusals = [
        ("a1", "b1", "^the name b1 is taken: pick another name$"),
        ("b1", None, "^no VM named b1 in tenant acme$"),
    ]
    for name, as_name, refusal in refusals:
        with pytest.raises(SaltInvocationError, match=refusal):
            backups.tenant_names(alice, full, name, as_name)
        with pytest.raises(SaltInvocationError, match=refusal):
            backups.tenant_held(alice, lambda: full, name, as_name)
    assert backups.tenant_names(alice, full, "a1") is True  # its own VM, in place
    assert backups.tenant_names(alice, full, "gone") is False
    assert backups.tenant_names(alice, full, "b1", as_name="new") is False  # its backup of a name now theirs
    assert backups.tenant_held(alice, lambda: full, "a1", None) is None  # its own VM: whose call may be said
    for name, as_name in (("gone", None), ("a1", "new")):
        with pytest.raises(SaltInvocationError, match=f"^the name {as_name or name} is taken: pick another name$"):
            backups.tenant_held(alice, lambda: full, name, as_name)


def test_an_in_place_restore_of_a_bigger_backup_takes_what_it_grows(bk, tmp_path):  # noqa: F811
    """Issue 34 #5: restoring in place a backup whose VM had more vCPUs, memory and disk than the VM it replaces
    grows that VM: the growth is taken from the tenant's quota (a growth entry, as virt.update's) and refused
    with the quota's wording when it does not fit. The VM is the real one on the test driver."""
    import salt.config

    from saltvirt.fleet import fleetstate, quota

    v, _tmp = bk
    owner = {"tenant": "acme", "creator": "alice"}
    init = {"disk": None, "nic": None, "start": False, "seed": False, "owner": owner}
    v["virt.init"]("bk4", 2, 128, disks=[{"name": "d", "size": 8}], **init)
    made = v["virt.backup"]("bk4")["id"]
    v["virt.purge"]("bk4")
    v["virt.init"]("bk4", 1, 64, disks=[{"name": "d", "size": 4}], **init)  # smaller now
    opts = dict(salt.config.master_config(None), id="m1", cachedir=str(tmp_path / "master-cache"))
    with fleetstate.lock(opts, ["bk4"]) as lease:  # the entry salt-run virt.init left in acme's ledger
        quota.reserve(lease.store, lease, "acme", "bk4", {"cpu": 1, "mem": 64, "disk_mib": 4}, {}, 0.0, {})
        quota.finish(lease.store, lease, "settled")
    try:
        listing = v["virt.backup_list"]("bk4")
        full = {"h1": {"status": "up", "vm_info": v["virt.full_info"]()["vm_info"]}}
        conf = tenants.config({"virt": dict(TENANTS, tenants={"acme": {"members": ["alice"], "quota": {"vcpus": 2}}})})
        acme, alice = conf["tenants"]["acme"], callers.resolve({"virt": TENANTS}, "alice")
        counted = quota.counted(full["h1"]["vm_info"]["bk4"], fleetstate.Store(opts), "acme")
        grown = backups.tenant_restore(alice, acme, full, listing, "bk4", made, "h1", counted=counted)
        assert grown == {"cpu": 1, "mem": 64, "disk_mib": 4, "grow": {"cpu": 2, "mem": 128}}
        with fleetstate.lock(opts, ["bk4"]) as lease:
            backups.reserve_restore(lease, alice, acme, full, listing, "bk4", made, "h1", 0.0)
            entry = lease.store.fetch(quota.QUOTAS, "acme")["entries"]["bk4/update"]
            assert (entry["grows"], entry["cpu"], entry["mem"], entry["disk_mib"]) == ("bk4", 1, 64, 4)
            quota.finish(lease.store, lease, "failed")
        acme = dict(acme, quota={"vcpus": 1})
        with fleetstate.lock(opts, ["bk4"]) as lease, pytest.raises(quota.QuotaError) as err:
            backups.reserve_restore(lease, alice, acme, full, listing, "bk4", made, "h1", 0.0)
        assert str(err.value) == (
            "tenant acme: 1 of 1 vCPUs used, asked 1: no room to grow bk4 "
            "(shrink or purge one of its VMs, or ask the operator for a larger quota)"
        )
    finally:
        v["virt.purge"]("bk4")


def test_salt_run_restore_in_place_of_a_bigger_backup_is_refused_past_the_quota(bk, tmp_path, monkeypatch):  # noqa: F811
    """The same through the runner (``salt-run virt.restore``, Salt's runner loader) as tenant member alice: the
    hypervisor answers are the real module's on the test driver, signed (tests/support/signedfleet.py). Past
    acme's quota nothing is restored (``virt.restore`` is never published); within it, acme's ledger has the
    restored VM's sizes once it is done."""
    from saltvirt.fleet import fleetstate, quota
    from tests.support import signedfleet
    from tests.support.saltloader import make_runners

    v, _tmp = bk
    owner = {"tenant": "acme", "creator": "alice"}
    init = {"disk": None, "nic": None, "start": False, "seed": False, "owner": owner}
    v["virt.init"]("bk5", 2, 128, disks=[{"name": "d", "size": 4}], **init)
    made = v["virt.backup"]("bk5")["id"]
    v["virt.purge"]("bk5")
    v["virt.init"]("bk5", 1, 64, disks=[{"name": "d", "size": 4}], **init)

    def salt_run(vcpus):
        """A runner job of alice's, acme's quota ``vcpus`` (Salt's loader copies the master opts it is given)."""
        runner = make_runners(tmp_path)
        opts = signedfleet.accept(runner.opts, tmp_path, ["hv1"])
        opts["virt"].update(TENANTS, tenants={"acme": {"members": ["alice"], "quota": {"vcpus": vcpus}}})
        runner["virt.restore"].__globals__["__user__"] = "alice"
        return runner["virt.restore"]("bk5", made), opts

    try:
        opts = signedfleet.accept(make_runners(tmp_path).opts, tmp_path, ["hv1"])
        with fleetstate.lock(opts, ["bk5"]) as lease:  # the entry salt-run virt.init left in acme's ledger
            quota.reserve(lease.store, lease, "acme", "bk5", {"cpu": 1, "mem": 64, "disk_mib": 4}, {}, 0.0, {})
            quota.finish(lease.store, lease, "settled")
        restored = {"name": "bk5", "id": made, "defined": True, "started": False}
        answers = {
            "virt.full_info": {"hv1": v["virt.full_info"]()},
            "virt.backup_list": {"hv1": v["virt.backup_list"]("bk5")},
            "virt.restore": {"hv1": restored},
        }
        client = signedfleet.SigningClient(answers)
        signedfleet.serve(monkeypatch, client)
        ret, _opts = salt_run(1)
        assert ret == {
            "error": "tenant acme: 1 of 1 vCPUs used, asked 1: no room to grow bk5 "
            "(shrink or purge one of its VMs, or ask the operator for a larger quota)",
            "retcode": 1,
        }
        assert "virt.restore" not in [fun for fun, _tgt in client.published]
        ret, opts = salt_run(2)
        assert ret.get("result") == restored, ret
        entry = fleetstate.Store(opts).fetch(quota.QUOTAS, "acme")["entries"]["bk5"]
        assert (entry["cpu"], entry["mem"]) == (2, 128)
    finally:
        v["virt.purge"]("bk5")


def test_the_work_of_a_run_is_refused_before_anything_is_published():
    """``fleet`` None: a refusal here never reaches the hypervisors (the runner's whole flow:
    tests/unit/loaders/test_runners_virt_backup.py)."""
    root = callers.Caller("root", True)
    with pytest.raises(SaltInvocationError, match="^virt.backup: select= picks the VMs: drop the VM name$"):
        backups.work(None, root, "web1", None, "G@group:db", False, False)
    with pytest.raises(SaltInvocationError, match="^virt.backup: test=True lists what select= picks; it has no other"):
        backups.work(None, root, "all", None, None, "True", False)
