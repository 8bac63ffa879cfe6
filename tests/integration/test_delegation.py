"""Delegation is a trust boundary (issue 23), proven through a real salt-api (rest_cherrypy) in front of a
real salt-master: the eauth user ``alice`` may run ``@runner: [virt.*]`` and ``virt.*`` on the hypervisors,
nothing else. Every attack is tried through the API (and the salt-run CLI where it fits) and must get a
clear refusal with nothing created, nothing read and nothing secret in the answer.

    hyper-a    real namespaced libvirtd hv1 (lab), this repo's _modules straight from the checkout
"""

import pathlib

import pytest

from tests.support import saltapi
from tests.support.paths import ROOT
from tests.support.saltd import hypervisor_minion_config, start_minion

HV = "hyper-a"
USERS = {
    "alice": saltapi.User("alice-pw-4f1", [saltapi.RUNNER_VIRT, {"hyper*": ["virt.*"]}]),
}
VIRT = {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 10, "gather_job_timeout": 30}}


@pytest.fixture(scope="module")
def api(salt_factories, state_tree, tmp_path_factory):
    extra = {"virt": VIRT, "runner_dirs": [str(ROOT / "_runners")], "ext_pillar": []}
    with saltapi.started(salt_factories, "deleg", state_tree, USERS, tmp_path_factory.mktemp("api"), **extra) as api:
        yield api


@pytest.fixture(scope="module")
def hyper(api, hv1, lab_dir):
    config = hypervisor_minion_config(hv1, pathlib.Path(lab_dir) / "deleg-images", module_dirs=[str(ROOT / "_modules")])
    factory = start_minion(api.master, HV, config)
    with factory.started():
        ret = api.master.salt_cli(timeout=120).run("test.ping", minion_tgt=HV)
        assert ret.returncode == 0 and ret.data is True, ret
        yield factory


@pytest.fixture
def alice(api):
    return api.client("alice")


@pytest.fixture
def marker():
    """A file a hostile URI's command would create (on the hypervisor: the same machine here)."""
    path = pathlib.Path("/var/tmp") / f"svdeleg-{id(object())}"
    yield path
    path.unlink(missing_ok=True)


def _minion_error(body):
    assert isinstance(body, dict) and HV in body, body
    return str(body[HV])


def test_harness_enforces_the_eauth_permissions(api, hyper):
    """The fixture itself: a wrong password, a function outside virt.* and a runner outside virt.* are 401."""
    assert api.client("alice", password="wrong").runner("virt.list")[0] == 401
    alice = api.client("alice")
    assert alice.local(HV, "cmd.run", ["id"])[0] == 401
    assert alice.local(HV, "test.ping")[0] == 401
    assert alice.runner("manage.up")[0] == 401
    assert alice.local(HV, "virt.list_domains") == (200, {HV: []})


@pytest.mark.parametrize(
    "uri",
    [
        "qemu+ext:///system?command=/usr/bin/touch%20{marker}",
        "test:///etc/shadow",
        "qemu+unix:///system?socket=/run/libvirt/libvirt-sock",
        "qemu+ssh://root@127.0.0.1/system?keyfile=/root/.ssh/id_rsa&no_verify=1",
    ],
)
def test_a_uri_from_a_call_never_reaches_libvirt(alice, hyper, marker, uri):
    uri = uri.format(marker=marker)
    status, body = alice.local(HV, "virt.list_domains", connection=uri)
    err = _minion_error(body)
    assert status == 200 and "must name a libvirt connection the operator configured" in err, body
    assert uri not in err and "root:" not in err
    assert not marker.exists()


def test_the_runner_never_forwards_a_connection(api, alice, hyper, marker):
    uri = f"qemu+ext:///system?command=/usr/bin/touch%20{marker}"
    status, body = alice.runner("virt.init", name="deleg1", cpu=1, mem=128, connection=uri)
    assert status == 200 and "connection= is not forwarded to the hypervisors" in str(body), body
    assert uri not in str(body) and not marker.exists()
    keys = api.master.salt_key_cli(timeout=60).run("-L")
    assert "deleg1" not in keys.stdout  # no key pre-accepted
    # the same through the CLI (the master's own salt-run)
    ret = api.master.salt_run_cli(timeout=120).run("virt.init", "deleg1", "1", "128", f"connection={uri}")
    assert "connection= is not forwarded to the hypervisors" in ret.stdout, ret
    assert not marker.exists()


@pytest.fixture(scope="module")
def created(api, hyper):
    """A VM that alice creates through salt-api: its sealed private key is in the master's job cache."""
    alice = api.client("alice")
    status, body = alice.runner(
        "virt.init",
        name="deleg-vm",
        cpu=1,
        mem=128,
        image="salt://images/guest.qcow2",
        host=HV,
        start=False,
        nic=None,
        graphics={"type": "vnc", "password": "gfxpw-91"},
    )
    assert status == 200 and isinstance(body, dict) and body.get("host") == HV, body
    assert "gfxpw-91" not in str(body)
    job = api.master.salt_run_cli(timeout=120).run("jobs.list_job", body["jid"]).data
    kwargs = next(a for a in job["Arguments"] if isinstance(a, dict))
    yield {"answer": body, "jid": body["jid"], "kwargs": kwargs}
    alice.runner("virt.purge", name="deleg-vm", host=HV)


def test_a_sealed_key_from_the_job_cache_opens_nowhere_else(alice, created, hyper):
    """Issue 23 #2: another VM's sealed key as a console password (and through the runner): refused,
    nothing defined, no secret in the answer."""
    sealed = created["kwargs"]["priv_key"]
    assert sealed["context"] == "deleg-vm/priv_key" and sealed["job"] == created["jid"]
    gfx = {"type": "vnc", "password": sealed}
    status, body = alice.local(HV, "virt.init", ["deleg-x", 1, 128], nic=None, disk=None, graphics=gfx)
    err = _minion_error(body)
    assert "the sealed secret was not sealed as deleg-x/graphics" in err, body
    assert "PRIVATE KEY" not in err
    # a replay in its own job (same context) is refused by the job binding and the hypervisor's replay cache:
    # tests/unit/pki/test_envelope.py (salt-api publishes every call under a new jid)
    status, body = alice.local(HV, "virt.list_domains")
    assert "deleg-x" not in body[HV], body
    # the runner refuses to forward it
    status, body = alice.runner("virt.init", name="deleg-y", cpu=1, mem=128, graphics=gfx)
    assert "a sealed envelope or mapping is never accepted from a call" in str(body) and "PRIVATE" not in str(body)


def test_a_vm_named_like_a_hypervisor_is_refused(api, alice, hyper):
    """Issue 23 #3: 'hyper*' are the hypervisors; a VM 'hyper-db1' (or minion_id 'hyper-x') would get
    libvirt certificates. Refused before any key is pre-accepted."""
    for kwargs, what in (
        ({"name": "hyper-db1"}, "VM name 'hyper-db1'"),
        ({"name": "db1", "minion_id": "hyper-x"}, "minion id 'hyper-x'"),
    ):
        status, body = alice.runner("virt.init", cpu=1, mem=128, image="salt://images/guest.qcow2", **kwargs)
        assert status == 200 and f"the {what} matches virt:hypervisors" in str(body), body
    keys = api.master.salt_key_cli(timeout=60).run("-L").stdout
    assert "hyper-db1" not in keys and "hyper-x" not in keys


@pytest.mark.parametrize("arg", ["trusted_image", "allow_http"])
def test_operator_switches_are_refused_through_the_api(alice, hyper, arg):
    """Issue 23 #5: the "trust me" switches are minion config, never a call's (runner and module)."""
    status, body = alice.runner(
        "virt.init", name="deleg-sw", cpu=1, mem=128, image="salt://images/guest.qcow2", **{arg: True}
    )
    assert f"{arg}= is an operator switch, not a call argument" in str(body), body
    status, body = alice.local(HV, "virt.init", ["deleg-sw", 1, 128], image="salt://images/guest.qcow2", **{arg: True})
    assert f"{arg}= is an operator switch, not a call argument" in _minion_error(body), body
    status, body = alice.local(HV, "virt.list_domains")
    assert "deleg-sw" not in body[HV]
