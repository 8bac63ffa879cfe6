"""saltvirt.fleet.callers: the caller of a runner job is what Salt put in ``__user__``, never an argument;
operators and tenants resolved from the master config."""

import grp
import os
import pwd

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import callers
from tests.support.paths import ROOT

PROBE = f"""
import sys
sys.path.insert(0, {str(ROOT / "_utils")!r})
from saltvirt.fleet import callers


def probe(*args, **kwargs):
    return {{"user": callers.job_user(globals()), "kwargs": sorted(kwargs)}}
"""

TENANTS = {
    "operators": ["ops", "wheel-ish%"],
    "tenants": {"acme": {"members": ["alice", "acmegrp%"]}, "beta": {"members": ["bob"]}},
}


def opts(virt=TENANTS):
    return {"virt": virt}


def test_job_user_is_the_runner_clients_user_not_a_keyword(tmp_path):
    """Salt's real RunnerClient job path (what the master runs for salt-api/eauth callers): the keywords
    ``__user__``/``__pub_user`` a caller sends end up in **kwargs; the global stays the job's user."""
    import salt.config
    import salt.runner

    (tmp_path / "runners").mkdir()
    (tmp_path / "runners" / "probe.py").write_text(PROBE)
    (tmp_path / "cache" / "proc").mkdir(parents=True)
    master = salt.config.master_config(None)
    master.update(
        runner_dirs=[str(tmp_path / "runners")],
        cachedir=str(tmp_path / "cache"),
        sock_dir=str(tmp_path / "sock"),
        extension_modules=str(tmp_path / "ext"),
    )
    forged = {"arg": [], "kwarg": {"__user__": "root", "__pub_user": "root", "user": "root"}}
    with salt.runner.RunnerClient(master) as client:
        ret = client._proc_function(
            instance=client,
            opts=master,
            fun="probe.probe",
            low=forged,
            user="alice",
            tag="salt/run/1",
            jid="1",
            daemonize=False,
            full_return=True,
        )
    assert ret["return"] == {"user": "alice", "kwargs": ["__pub_user", "__user__", "user"]}


@pytest.mark.parametrize("value", [None, "", "UNKNOWN", 3])
def test_job_user_unknown(value):
    assert callers.job_user({"__user__": value}) is None
    assert callers.job_user({}) is None


def test_job_user_across_the_runner_files():
    """Salt injects __user__ into one module per virtualname: whichever of the virt runner's files it is."""
    assert callers.job_user({}, {"__user__": "alice"}, {"__user__": "UNKNOWN"}) == "alice"
    assert callers.job_user({"__user__": "alice"}, {"__user__": "alice"}) == "alice"
    with pytest.raises(SaltInvocationError, match="several users \\(alice, root\\): refused"):
        callers.job_user({"__user__": "alice"}, {"__user__": "root"})


def test_without_tenants_everyone_is_an_operator():
    who = callers.resolve({"virt": {}}, "alice")
    assert who.operator and who.tenant is None and "not configured" in who.why


@pytest.mark.parametrize("user", ["root", "sudo_alice", pwd.getpwuid(os.geteuid()).pw_name, "ops"])
def test_operators(user):
    who = callers.resolve(opts(), user)
    assert who.operator and who.tenant is None


def test_tenant_member_and_group_member():
    assert callers.resolve(opts(), "alice") == callers.Caller("alice", False, "acme", "member of tenant acme")
    assert callers.resolve(opts(), "bob").tenant == "beta"
    # an OS group of the master host written group% (as Salt's ACLs): a real group of a real user here
    user = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.getegid()).gr_name
    conf = {"tenants": {"acme": {"members": [f"{group}%"]}}}
    assert group in callers.os_groups(user)
    # the process's own user is an operator: check the group rule on the resolver's matcher instead
    from saltvirt.fleet import tenants

    assert tenants.matches(conf["tenants"]["acme"]["members"], "nobody-here", callers.os_groups(user))
    assert not tenants.matches(conf["tenants"]["acme"]["members"], "nobody-here", ())


def test_unknown_and_strangers_are_refused():
    with pytest.raises(SaltInvocationError, match="no authenticated user"):
        callers.resolve(opts(), None)
    with pytest.raises(SaltInvocationError, match="user mallory is in no tenant and no operator"):
        callers.resolve(opts(), "mallory")


def test_a_user_in_two_tenants_is_a_config_error():
    conf = {"tenants": {"a": {"members": ["alice"]}, "b": {"members": ["alice"]}}}
    with pytest.raises(SaltInvocationError, match="alice is a member of tenants a and b"):
        callers.resolve(opts(conf), "alice")


def test_job_caller_resolves_the_user_of_any_runner_file():
    other = {"__user__": "alice"}
    loader = {"virt.init": type("F", (), {"__globals__": other})()}
    assert callers.job_caller(opts(), {"__user__": "UNKNOWN"}, loader) == callers.resolve(opts(), "alice")


@pytest.mark.parametrize("acl", [{"alice": ["test.*"]}, {"ali*": ["test.*"]}, {"a.ice": []}])
def test_a_publisher_acl_user_is_no_tenant_member(acl):
    """Salt accepts a publisher_acl user's own key for a claimed root (issue 34 #4, shown on a real master in
    tests/integration/test_publisher_acl.py): such a user is refused as a tenant member and as a stranger,
    however publisher_acl names it; virt:operators may still list it, and without tenants nothing changes."""
    conf = dict(opts(), publisher_acl=acl)
    wording = "user alice is in this master's publisher_acl, whose users Salt lets run any job as root"
    with pytest.raises(SaltInvocationError, match=wording) as refused:
        callers.resolve(conf, "alice")
    assert "removes it from publisher_acl and gives it eauth" in str(refused.value)
    assert callers.resolve(conf, "bob").tenant == "beta"
    listed = dict(conf, virt=dict(TENANTS, operators=["alice"]))
    assert callers.resolve(listed, "alice").operator
    assert callers.resolve(dict(conf, virt={}), "alice").operator


def test_tenant_members_is_what_resolve_makes_tenant_members():
    """The ``{user: tenant}`` the libvirt ext_pillar gives the hypervisors: named members and the OS users of a
    ``group%`` entry (a real user here whose primary group the entry names), never an operator, a
    ``publisher_acl`` user or a user two tenants claim (resolve refuses those)."""
    other = next(p for p in pwd.getpwall() if p.pw_uid not in (0, os.geteuid()))
    group = grp.getgrgid(other.pw_gid).gr_name
    assert other.pw_name in callers.group_users(group)
    assert callers.group_users("no-such-group-here") == ()
    conf = {
        "operators": ["ops"],
        "tenants": {
            "acme": {"members": ["alice", "ops", "root", "carol", f"{group}%"]},
            "beta": {"members": ["bob", "carol-too"]},
        },
    }
    members = callers.tenant_members(dict(opts(conf), publisher_acl={"carol": [".*"]}))
    assert members["alice"] == "acme" and members["bob"] == "beta" and members[other.pw_name] == "acme"
    assert "ops" not in members and "root" not in members and "carol" not in members
    conf["tenants"]["beta"]["members"].append(other.pw_name)  # now in both tenants (by name, by group): neither
    assert other.pw_name not in callers.tenant_members(opts(conf))
    assert callers.tenant_members(opts({})) == {}
