"""saltvirt.fleet.relocate: the migration settings from the master config (moving VMs needs hypervisors:
tests/integration/test_migration.py)."""

import re
import uuid

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import fleetstate, relocate
from tests.support.fleetfacts import MIGRATION_STEPS


def test_settings_defaults_config_and_the_calls_own_tunnel():
    assert relocate.settings({}) == (False, float(relocate.DEFAULT_TIMEOUT))
    assert relocate.settings({"tunnel": True, "migration_timeout": "90"}) == (True, 90.0)
    assert relocate.settings({"tunnel": True}, tunnel=False)[0] is False
    assert relocate.settings({}, tunnel="yes")[0] is True


@pytest.mark.parametrize("bad", ["soon", 0, -5, True])
def test_settings_refuse_a_bad_migration_timeout(bad):
    with pytest.raises(SaltInvocationError, match="^virt:migration_timeout must be a number of seconds above 0"):
        relocate.settings({"migration_timeout": bad})


@pytest.mark.parametrize(
    ("who", "args", "message"),
    [
        ("alice", {"target": "hv2", "forced": True}, "virt.migrate ignore_placement=True is for operators"),
        ("root", {"target": None}, "virt.migrate needs target=<hypervisor> (virt.evacuate select= lets placement"),
        ("root", {"test": "True"}, "virt.migrate: test=True lists what select= picks; a call naming a VM has no dry"),
        ("root", {"select": "G@group:db", "host": "hv1"}, "virt.migrate: select= picks the VMs: drop the VM name"),
    ],
)
def test_migrate_refusals_before_anything_is_asked(who, args, message):
    from saltvirt.fleet import callers

    caller = callers.Caller(who, who == "root", None if who == "root" else "acme")
    call = {"name": "web1", "host": None, "target": "hv2", "select": None, "forced": False, "test": False, **args}
    if call["select"] is not None:
        call["name"] = None
    with pytest.raises(SaltInvocationError, match=f"^{re.escape(message)}"):
        relocate.refuse_migrate_args(caller, **call)
    relocate.refuse_migrate_args(callers.Caller("root", True), "web1", None, "hv2", None, False, False)  # fine


# the shared store (redis) dying during a migration -----------------------------------------------------
class _Hypervisors:
    """publish.Fleet's part migrate uses, answering each step of a shared-storage migration of web1 from
    hv1 to hv2 and recording it. A stand-in for Salt's publication (tests/integration/test_migration.py
    migrates through real ones); what the real one reads from the shared store before publishing (which
    minions are hypervisors, hypervisors.members) it reads for real. ``crash_after``: the step after which
    redis dies."""

    def __init__(self, opts, server, crash_after):
        self.opts, self.server, self.crash_after, self.calls = opts, server, crash_after, []

    def gather(self, fun):
        return {"hv1": {"status": "up", "vms": {"web1": "running"}}, "hv2": {"status": "up", "vms": {}}}

    def ret(self, minion, fun, *args, **kwargs):
        from saltvirt.fleet import hypervisors

        hypervisors.members(self.opts, [minion])  # as Fleet.run does before it publishes
        self.calls.append((minion, fun))
        ret = {
            "virt.migrate_source_info": {"active": True, "probes": {}},
            "virt.migrate_prepare": {
                "copy_storage": None,
                "unsafe": True,
                "disk_map": None,
                "migrate_disks": None,
                "verify_backing": None,
                "address": "hv2",
                "created": ["/srv/vms/web1/made-for-it"],
                "disks": [],
            },
            "virt.migrate": {"undefined_on_source": True, "live": True, "tunnelled": False, "target_uri": "x"},
            "virt.migrate_finish": {"host": "hv2", "state": "running", "persistent": True, "disks": []},
            "virt.migrate_abort_cleanup": {"removed": args[1] if len(args) > 1 else []},
        }[fun]
        if fun == self.crash_after:
            self.server.crash()
        return dict(ret, seconds=0.1) if fun == "virt.migrate" else ret


@pytest.fixture
def redis_opts(tmp_path):
    import salt.config

    from tests.support.redis_server import RedisServer

    server = RedisServer().start()
    opts = dict(salt.config.master_config(None), id="m1", cachedir=str(tmp_path), **server.master_opts())
    opts["virt"] = {"hypervisors": {"tgt": "hv*"}}
    yield opts, server
    server.stop()


def test_a_store_gone_before_the_move_migrates_nothing_and_takes_back_what_the_target_made(redis_opts):
    opts, server = redis_opts
    remote = _Hypervisors(opts, server, crash_after="virt.migrate_prepare")
    with pytest.raises(CommandExecutionError) as err:
        relocate.migrate(remote, "web1", "hv2")
    assert str(err.value).startswith("VM 'web1' was not migrated, it stays on hv1: the shared runner state (redis")
    assert "virt.migrate" not in [fun for _m, fun in remote.calls]
    assert ("hv2", "virt.migrate_abort_cleanup") not in remote.calls  # the store is needed to reach it too ...
    assert "Connection refused" in err.value.details["target_cleanup"]["error"]  # ... and the answer says so


def test_a_store_lost_during_the_move_still_reports_the_migration(redis_opts):
    opts, server = redis_opts
    ret = relocate.migrate(_Hypervisors(opts, server, crash_after="virt.migrate"), "web1", "hv2")
    assert (ret["source"], ret["target"], ret["state"]) == ("hv1", "hv2", "unknown")
    unconfirmed, unreleased = ret["warnings"]
    assert unconfirmed.startswith("the migration of VM 'web1' finished (the source's libvirt reported it done), but")
    assert "hv2 could not be asked how the VM runs there: the shared runner state (redis" in unconfirmed
    assert unreleased.startswith("the lock of 'web1' could not be given back: the shared runner state (redis")
    assert unreleased.endswith("(it expires by itself 60 s after its last renewal, virt:shared:lock_ttl)")


# salt-run virt.migrate: virt.init's placement checks on the target ------------------------------------------
FACTS = {"mem_total": 16384, "mem_used_by_vms": 64, "vcpus_total": 8, "vcpus_used_by_vms": 1, "disk_free": 102400}
ACME = {"tenant": "acme", "creator": "alice"}


def _vm(group=None, owner=ACME):
    return {"cpu": 1, "mem": 64, "state": "running", "group": group, "owner": owner, "disks": {}}


def _uuid(name):
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


# web1 (acme, group web) on hv1; hv2 in maintenance; hv3 in acme's full hypervisor group gpu (g1 there);
# hv4 holds web2 of web1's anti-affinity group; hv5 has 100 MiB of memory; hv6 takes it
VMS = {"hv1": {"web1": _vm("web")}, "hv3": {"g1": _vm()}, "hv4": {"web2": _vm("web", None)}}
HVS = [f"hv{i}" for i in range(1, 7)]


def _answers():
    """Every hypervisor's ``virt.capacity``, ``virt.full_info`` and ``virt.vm_state`` (placement's, a tenant's and a
    migration without placement's view) and its answers to each step of a migration."""
    out = {fun: dict.fromkeys(HVS, ret) for fun, ret in MIGRATION_STEPS.items()}
    out["virt.capacity"], out["virt.full_info"], out["virt.vm_state"] = {}, {}, {}
    for hv in HVS:
        vms = VMS.get(hv, {})
        facts = dict(FACTS, mem_total=100) if hv == "hv5" else dict(FACTS)
        groups = {}
        for name, vm in vms.items():
            if vm["group"]:
                groups.setdefault(vm["group"], []).append(name)
        small = {n: {k: vm[k] for k in ("group", "state", "cpu", "mem")} for n, vm in vms.items()}
        out["virt.capacity"][hv] = {"host": dict(facts, groups=groups, vms_defined=len(vms)), "vm_info": small}
        out["virt.full_info"][hv] = {"host": facts, "vm_info": {n: dict(vm, uuid=_uuid(n)) for n, vm in vms.items()}}
        out["virt.vm_state"][hv] = {n: vm["state"] for n, vm in vms.items()}
    return out


@pytest.fixture
def salt_run(tmp_path, monkeypatch):
    """``(migrate(user, target, **kwargs) -> answer, client)``: ``salt-run virt.migrate web1 <target>`` through
    Salt's runner loader as ``user`` (alice of tenant acme, carol an operator), with signed hypervisor answers."""
    from tests.support import signedfleet
    from tests.support.saltloader import make_runners

    client = signedfleet.SigningClient(_answers())
    signedfleet.serve(monkeypatch, client)
    virt = {
        "placement": {"maintenance": ["hv2"], "mem_reserve_mib": 0},
        "hypervisor_groups": {"gpu": ["hv3"]},
        "operators": ["carol"],
        "tenants": {"acme": {"members": ["alice"], "group_quotas": {"gpu": {"vms": 1}}}},
    }

    def migrate(user, target, fun="virt.migrate", name="web1", **kwargs):
        runner = make_runners(tmp_path)  # a new job: Salt's loader copies the opts it is given
        signedfleet.accept(runner.opts, tmp_path, HVS)["virt"].update(virt)
        runner[fun].__globals__["__user__"] = user
        args = [name, target] if fun == "virt.migrate" else []
        ret = runner[fun](*args, **kwargs)
        return ret.get("data", ret), runner.opts

    return migrate, client


def _migrated(client):
    return [tgt for fun, tgt in client.published if fun == "virt.migrate"]


def test_a_tenants_migration_is_placed_as_virt_init_places_a_vm(salt_run):
    """Issue 34 #5: a tenant's salt-run virt.migrate checked the target's disk room only. Refused now, before
    anything is asked of the hypervisors: a host in maintenance, one of a hypervisor group whose quota the
    tenant has used up, one with a VM of its anti-affinity group, one without room; and ignore_placement is
    not the tenant's. A target that fits keeps the VM's room reserved until the move is done."""
    migrate, client = salt_run
    stays = "Nothing was migrated, the VM stays on hv1: choose another target"
    for target, why in (
        ("hv2", "in maintenance (virt:placement:maintenance: 'hv2')"),
        ("hv4", "anti-affinity: group 'web' already has web2 here"),
        ("hv5", "memory: needs 64 MiB, 36 MiB free (100 total - 64 used by running VMs - 0 reserve)"),
    ):
        ret, _opts = migrate("alice", target)
        assert ret.get("error") == f"{target} cannot take VM 'web1': {why}. {stays}", ret
    ret, _opts = migrate("alice", "hv3")
    assert ret["error"] == "tenant acme on hypervisor group gpu: 1 of 1 VMs used, asked 1: no room for web1 on hv3"
    ret, _opts = migrate("alice", "hv2", ignore_placement=True)
    assert ret["error"].startswith("virt.migrate ignore_placement=True is for operators: user alice is a member")
    assert _migrated(client) == []  # nothing moved
    ret, opts = migrate("alice", "hv6")
    assert (ret["source"], ret["target"]) == ("hv1", "hv6") and "warnings" not in ret, ret
    assert _migrated(client) == [["hv1"]]
    room = fleetstate.Store(opts).fetch(fleetstate.RESERVATIONS, "hv6")["entries"]["web1"]
    assert (room["cpu"], room["mem"], room["state"]) == (1, 64, "settled")


def test_an_operator_may_move_a_vm_past_placement_by_saying_so(salt_run):
    migrate, client = salt_run
    ret, _opts = migrate("carol", "hv2")
    assert ret["error"] == (
        "hv2 cannot take VM 'web1': in maintenance (virt:placement:maintenance: 'hv2'). Nothing was migrated, the "
        "VM stays on hv1: choose another target, or pass ignore_placement=True to move it anyway"
    )
    ret, _opts = migrate("carol", "hv2", ignore_placement=True)
    assert ret.get("target") == "hv2" and _migrated(client) == [["hv1"]], ret
    assert ret["warnings"] == [
        "ignore_placement=True: web1 was moved to hv2 without placement's checks (room, maintenance, anti-affinity)"
    ]


# select=: moving the VMs a selection picks (the selection itself: tests/unit/fleet/test_vmselect.py)
def test_migrate_select_moves_each_selected_vm_from_where_it_is_as_the_named_call(salt_run):
    migrate, client = salt_run
    listed, _opts = migrate("carol", "hv6", name=None, select="T@virt_vm and G@group:web", test=True)
    assert [(v["name"], v["host"]) for v in listed["selected"]] == sorted(
        [("web1", "hv1"), ("web2", "hv4")], key=lambda v: _uuid(v[0])
    )
    assert _migrated(client) == []
    ret, _opts = migrate("carol", "hv6", name=None, select="G@group:web and not M@hv4")
    assert list(ret["results"]) == [_uuid("web1")] and ret["results"][_uuid("web1")]["host"] == "hv1"
    assert "error" not in ret["results"][_uuid("web1")] and _migrated(client) == [["hv1"]]
    ret, _opts = migrate("carol", "hv4", name=None, select="M@hv4")
    assert ret["results"][_uuid("web2")]["result"] == {"skipped": "already on hv4"} and _migrated(client) == [["hv1"]]


def test_a_tenants_migrate_select_moves_its_own_vms_only_with_its_checks(salt_run):
    migrate, client = salt_run
    ret, _opts = migrate("alice", "hv2", name=None, select="T@virt_vm")  # web2 (hv4) is the operator's
    assert sorted(r["name"] for r in ret["results"].values()) == ["g1", "web1"] and ret["retcode"] == 1
    assert all("in maintenance" in r["error"] for r in ret["results"].values()) and _migrated(client) == []


def test_evacuate_select_places_each_selected_vm(salt_run):
    migrate, client = salt_run
    ret, _opts = migrate("carol", None, fun="virt.evacuate", select="G@group:web", dry_run=True)
    assert sorted(ret["plan"]) == ["web1", "web2"] and ret["cannot_place"] == {} and _migrated(client) == []
    assert all(p["target"] not in ("hv2", "hv1", "hv4") for p in ret["plan"].values()), ret["plan"]
    ret, _opts = migrate("alice", None, fun="virt.evacuate", select="G@group:web")
    assert ret["error"].startswith("virt.evacuate is for operators: user alice is a member of tenant acme")


@pytest.mark.parametrize(
    ("user", "fun", "target", "kwargs", "message"),
    [
        ("carol", "virt.migrate", "hv6", {"select": "T@virt_vm"}, "virt.migrate: select= picks the VMs: drop"),
        ("carol", "virt.migrate", None, {"name": None, "select": "T@virt_vm"}, "virt.migrate needs target="),
        ("carol", "virt.migrate", "hv6", {"test": True}, "virt.migrate: test=True lists what select= picks"),
        ("carol", "virt.migrate", "hv6", {"name": None}, "virt.migrate needs a VM name, or select=<selection>"),
        ("carol", "virt.evacuate", None, {"host": "hv1", "select": "M@hv1"}, "virt.evacuate: select= picks the VMs"),
    ],
)
def test_select_refusals_before_anything_moves(salt_run, user, fun, target, kwargs, message):
    migrate, client = salt_run
    ret, _opts = migrate(user, target, fun=fun, **kwargs)
    assert ret["retcode"] == 1 and ret["error"].startswith(message), ret
    assert _migrated(client) == []
