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
        f"tenant acme may not pass {next(iter(kwargs))} to virt.backup (a tenant may pass: incremental, name, tenant)"
    ), ret
