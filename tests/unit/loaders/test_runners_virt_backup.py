"""_runners/virt_backup.py through Salt's runner loader, without a salt-master: who the caller is and what
a tenant caller is refused before anything is published (the backups themselves, with a real master and
hypervisor: tests/integration/test_backup_runner.py)."""

import pytest

from saltvirt.fleet import callers
from tests.support.saltloader import make_runners

TENANTS = {
    "hypervisors": ["hyper1"],
    "operators": ["carol"],
    "tenants": {"acme": {"members": ["alice"]}, "beta": {"members": ["bob"]}},
}


FILES = callers.RUNNER_FACES  # one function of each runner file of the virtual name virt


@pytest.fixture
def runner(tmp_path):
    runners = make_runners(tmp_path)
    runners.opts["virt"] = TENANTS
    for fun in FILES:  # Salt's job user stays in a module's globals after the job: no test sees another's
        runners[fun].__globals__.pop("__user__", None)
    yield runners
    for fun in FILES:
        runners[fun].__globals__.pop("__user__", None)


def test_a_tenant_caller_may_not_name_another_tenant(runner):
    runner["virt.backup"].__globals__["__user__"] = "alice"  # what Salt's runner client injects
    assert runner["virt.backup"]("all", tenant="beta") == {
        "error": "user alice is in tenant acme: tenant=beta is refused",
        "retcode": 1,
    }


def test_an_operator_names_a_known_tenant_only(runner):
    runner["virt.backup"].__globals__["__user__"] = "carol"
    ret = runner["virt.backup"]("all", tenant="gamma")
    assert ret["error"].startswith("no tenant named 'gamma' in virt:tenants (known: acme, beta)"), ret


def test_no_user_is_refused_under_tenants(runner):
    ret = runner["virt.backup"]("all")
    assert ret["error"].startswith("this runner job has no authenticated user"), ret


@pytest.mark.parametrize(("injected", "called"), [("virt.init", "virt.backup"), ("virt.backup", "virt.record")])
def test_the_user_salt_injected_into_one_runner_file_is_seen_by_the_others(runner, injected, called):
    """SyncClientMixin.low puts __user__ into the first loaded module of virtualname virt only: the backup
    runner file finds it in the others, and they find it in the backup runner file."""
    runner[injected].__globals__["__user__"] = "alice"
    assert "__user__" not in runner[called].__globals__
    if called == "virt.backup":
        ret = runner[called]("all", tenant="beta")
        assert ret["error"] == "user alice is in tenant acme: tenant=beta is refused"
    else:
        ret = runner[called]()
        assert ret["error"].startswith("virt.record is for operators: user alice is a member of tenant acme"), ret


@pytest.mark.parametrize(
    ("user", "kwargs", "message"),
    [
        ("alice", {"as": "../x"}, "invalid as_name"),
        ("carol", {"target": "/etc"}, "unknown argument(s) target to virt.restore"),
        ("carol", {"as": "../x"}, "invalid as_name"),
    ],
)
def test_restore_refusals_before_anything_is_asked(runner, user, kwargs, message):
    runner["virt.restore"].__globals__["__user__"] = user
    ret = runner["virt.restore"]("web1", "20260101T020000Z", **kwargs)
    assert ret["retcode"] == 1 and ret["error"].startswith(message), ret


@pytest.mark.parametrize(
    ("fun", "args", "kwargs", "message"),
    [
        (
            "virt.restore",
            ["web1", "20260101T020000Z"],
            {"force": True},
            "tenant acme may not pass force to virt.restore",
        ),
        (
            "virt.restore",
            ["web1", "20260101T020000Z"],
            {"ignore_down": True, "host": "hyper1"},
            "tenant acme may not pass ignore_down to virt.restore",
        ),
    ],
)
def test_a_tenant_may_not_pass_the_operators_switches(runner, fun, args, kwargs, message):
    """force= powers a running VM off, ignore_down= bets that a silent hypervisor runs nothing: the operator's."""
    runner[fun].__globals__["__user__"] = "alice"
    ret = runner[fun](*args, **kwargs)
    assert ret["retcode"] == 1 and ret["error"].startswith(message), ret


@pytest.mark.parametrize("kwargs", [{"keep": 1000}, {"keep_daily": 365}, {"per_host": 16}, {"timeout": 999999}])
def test_a_tenant_may_not_set_retention_or_the_hypervisors_load(runner, kwargs):
    """Retention decides how much of the backup store a tenant's VMs fill, per_host and timeout the IO a run
    puts on the hypervisors: virt:backup in the master config, the operator's."""
    runner["virt.backup"].__globals__["__user__"] = "alice"
    ret = runner["virt.backup"]("all", **kwargs)
    assert ret["retcode"] == 1 and ret["error"] == (
        f"tenant acme may not pass {next(iter(kwargs))} to virt.backup "
        "(a tenant may pass: incremental, name, select, tenant, test)"
    ), ret


# select=: back up the VMs a selection picks, from the hypervisors' signed facts
@pytest.fixture
def fleet_runner(tmp_path, monkeypatch):
    """``(call(user, fun, **kwargs), client)``: the virt runner over two live signed hypervisors
    (tests/unit/fleet/test_vmselect.py's ``live_fleet``) whose ``virt.backup`` answers with a made backup."""
    from tests.support import signedfleet
    from tests.unit.fleet.test_vmselect import live_fleet

    opts, client, conns = live_fleet(tmp_path / "fleet", operators=["carol"])
    client.answers["virt.backup"] = dict.fromkeys(conns, lambda vm, **_kw: {"id": f"{vm}-1", "type": "full", "size": 1})
    signedfleet.serve(monkeypatch, client)
    runner = make_runners(tmp_path)
    runner.opts.update(pki_dir=opts["pki_dir"], cachedir=opts["cachedir"], virt=opts["virt"])

    def call(user, fun, **kwargs):
        runner[fun].__globals__["__user__"] = user
        return runner[fun](**kwargs)

    yield call, client
    for conn in conns.values():
        conn.close()


def backed_up(client):
    """The targets of every ``virt.backup`` published (one job per VM)."""
    return [t for f, t in client.published if f == "virt.backup"]


def test_backup_select_backs_up_every_vm_of_group_db_and_nothing_else(fleet_runner):
    call, client = fleet_runner
    listed = call("carol", "virt.backup", select="T@virt_vm and G@group:db", test=True)
    assert [v["name"] for v in listed["selected"]] == ["db1", "beta1", "db2", "db3"] and backed_up(client) == []
    out = call("carol", "virt.backup", select="T@virt_vm and G@group:db")
    assert sorted(out["made"]) == ["beta1", "db1", "db2", "db3"] and out["failed"] == {} and "retcode" not in out
    assert {vm: m["host"] for vm, m in out["made"].items()} == {
        "db1": "hv1",
        "beta1": "hv1",
        "db2": "hv2",
        "db3": "hv2",
    }
    assert len(backed_up(client)) == 4 and "web1" not in out["made"]
    assert [v["name"] for v in out["selected"]] == ["db1", "beta1", "db2", "db3"] and out["refused"] == {}


def test_backup_select_of_a_tenant_and_of_an_operator_for_a_tenant(fleet_runner):
    call, _client = fleet_runner
    assert sorted(call("alice", "virt.backup", select="G@group:db")["made"]) == ["db1", "db3"]  # not beta1's
    assert sorted(call("carol", "virt.backup", select="G@group:db", tenant="beta")["made"]) == ["beta1"]


def test_backup_select_refusals(fleet_runner):
    call, client = fleet_runner
    out = call("carol", "virt.backup", name="db1", select="T@virt_vm")
    assert out == {"error": "virt.backup: select= picks the VMs: drop the VM name", "retcode": 1}
    out = call("carol", "virt.backup", name="db1", test=True)
    assert out["retcode"] == 1 and out["error"].startswith("virt.backup: test=True lists what select= picks")
    assert backed_up(client) == []
