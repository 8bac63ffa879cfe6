"""Delegation is a trust boundary (issue 23), proven through a real salt-api (rest_cherrypy) in front of a
real salt-master: the eauth user ``alice`` may run ``@runner: [virt.*]`` and ``virt.*`` on the hypervisors,
nothing else, and the hypervisor's ``virt:operators`` lists her (so the deeper refusals are reached).
Every attack is tried through the API (and the salt-run CLI where it fits) and must get a clear refusal
with nothing created, nothing read and nothing secret in the answer, the job cache or the logs. ``dave``
has the same eauth rights but is no operator on the hypervisor: his direct ``virt.*`` calls are refused
(issue 26), his runner calls work.

    hyper-a    real namespaced libvirtd hv1 (lab), this repo's _modules straight from the checkout
"""

import json
import pathlib
import shutil
import tempfile

import pytest
import salt.payload
import salt.utils.user

from saltvirt.base import operators
from tests.support import saltapi, signedfleet
from tests.support.paths import ROOT
from tests.support.saltd import hypervisor_minion_config, start_minion

HV = "hyper-a"
USERS = {
    "alice": saltapi.User("alice-pw-4f1", [saltapi.RUNNER_VIRT, {"hyper*": ["virt.*"]}]),
    "dave": saltapi.User("dave-pw-7c2", [saltapi.RUNNER_VIRT, {"hyper*": ["virt.*"]}]),
}
GFX_PW = "gfxpw-91"
VIRT = {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 10, "gather_job_timeout": 30}}


@pytest.fixture(scope="module")
def api(salt_factories, state_tree, tmp_path_factory):
    extra = {"virt": VIRT, "runner_dirs": [str(ROOT / "_runners")], "ext_pillar": []}
    with saltapi.started(salt_factories, "deleg", state_tree, USERS, tmp_path_factory.mktemp("api"), **extra) as api:
        yield api


@pytest.fixture(scope="module")
def hyper(api, hv1, lab_dir):
    config = hypervisor_minion_config(hv1, pathlib.Path(lab_dir) / "deleg-images", module_dirs=[str(ROOT / "_modules")])
    config["virt"]["operators"] = [*operators.DEFAULT_OPERATORS, "alice"]  # dave is not one
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
        graphics={"type": "vnc", "password": GFX_PW},
    )
    assert status == 200 and isinstance(body, dict) and body.get("host") == HV, body
    assert GFX_PW not in str(body)
    job = api.master.salt_run_cli(timeout=120).run("jobs.list_job", body["jid"]).data
    kwargs = signedfleet.published_kwargs(job)
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


# disks, backing stores, pools and serial ports through the API (issue 23 #4/#5, the raw storage functions) --
@pytest.fixture
def pool_dir():
    """A directory for alice's pool, inside the hypervisor's virt:pool_paths (/var/tmp in the test config)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="svdeleg-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_disk_attacks_through_the_api_are_refused(api, alice, hyper, created, pool_dir):
    """alice (an operator of the hypervisor, so every deeper check is reached) names another VM's disk and a
    host file as a disk, the other VM's disk as a new volume's backing store, a pool on /etc and TCP serial
    ports, through salt-api's local and runner clients: each gets its refusal, libvirt gets nothing (no VM,
    pool or volume) and the other VM's disk is untouched. Her pool inside virt:pool_paths is defined."""
    disks = alice.local(HV, "virt.get_disks", ["deleg-vm"])[1][HV]
    theirs = next(d["file"] for d in disks.values() if d.get("file"))
    seen = pathlib.Path(theirs).stat()
    status, body = alice.local(HV, "virt.pool_define", ["deleg-pool", "dir"], target=str(pool_dir / "pool"))
    assert (status, body) == (200, {HV: True}), body
    new = {"nic": None, "disk": None, "start": False}
    tcp = [{"type": "tcp", "port": 22, "protocol": "raw"}]
    try:
        for fun, arg, kwargs, refusal in [
            ("virt.init", ["deleg-a", 1, 128], dict(new, disks=[{"name": "data", "path": theirs, "format": "qcow2"}]),
             f"disk data: {theirs} is a disk of VM 'deleg-vm': refused"),
            ("virt.init", ["deleg-a", 1, 128], dict(new, disks=[{"name": "data", "path": "/etc/shadow"}]),
             "path of disk data /etc/shadow is outside the directories salt-virt may use"),
            ("virt.init", ["deleg-a", 1, 128], dict(new, serials=tcp), "TCP serial ports are off on this hypervisor"),
            ("virt.pool_define", ["deleg-etc", "dir"], {"target": "/etc/deleg"},
             "pool deleg-etc: target /etc/deleg is outside the directories pools may use"),
            ("virt.volume_define", ["deleg-pool", "top.qcow2", 8],
             {"format": "qcow2", "backing_store": {"path": theirs, "format": "qcow2"}},
             f"backing_store: {theirs} is a disk of VM 'deleg-vm': refused"),
        ]:  # fmt: skip
            status, body = alice.local(HV, fun, arg, **kwargs)
            assert status == 200 and refusal in _minion_error(body), (fun, kwargs, body)
        # the runner forwards them to the hypervisor, which refuses the same
        image = {"image": "salt://images/guest.qcow2", "host": HV, "start": False, "nic": None}
        for kwargs, refusal in [
            ({"disks": [{"name": "data", "path": theirs, "format": "qcow2"}]}, "is a disk of VM 'deleg-vm': refused"),
            ({"consoles": [{"type": "tcp", "port": 4555}]}, "TCP serial ports are off on this hypervisor"),
        ]:
            status, body = alice.runner("virt.init", name="deleg-r", cpu=1, mem=128, **image, **kwargs)
            assert status == 200 and refusal in str(body), (kwargs, body)
        assert not {"deleg-a", "deleg-r"} & set(_domains(api))
        assert "deleg-r" not in api.master.salt_key_cli(timeout=60).run("-L").stdout
        assert alice.local(HV, "virt.pool_list_volumes", ["deleg-pool"]) == (200, {HV: []})
        assert "deleg-etc" not in alice.local(HV, "virt.list_pools")[1][HV]
        after = pathlib.Path(theirs).stat()
        assert (after.st_size, after.st_mtime_ns) == (seen.st_size, seen.st_mtime_ns)
    finally:
        alice.local(HV, "virt.pool_undefine", ["deleg-pool"])


# issue 26: the hypervisor refuses direct virt.* calls of users who are not its operators ------------------
def _jobs(api):
    ret = api.master.salt_run_cli(timeout=120).run("jobs.list_jobs")
    assert ret.returncode == 0 and isinstance(ret.data, dict), ret
    return ret.data


def _domains(api):
    """What libvirtd on the hypervisor has, asked as root on the master (an operator)."""
    ret = api.master.salt_cli(timeout=120).run("virt.list_domains", minion_tgt=HV)
    assert ret.returncode == 0 and isinstance(ret.data, list), ret
    return ret.data


def test_a_direct_virt_call_by_a_non_operator_is_refused(api, hyper):
    """dave may publish virt.* to the hypervisors (Salt's eauth lets him), but the hypervisor refuses every
    published virt.* call of a user not in its virt:operators, arbitrary domain XML and a recovery restart
    included, and says how to do it through the runner; a forged __pub_user changes nothing."""
    dave = api.client("dave")
    xml = "<domain type='qemu'><name>deleg-d2</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    new = {"nic": None, "disk": None, "start": False}
    for fun, arg, kwargs in [
        ("virt.init", ["deleg-d1", 1, 128], new),
        ("virt.init", ["deleg-d1", 1, 128], dict(new, __pub_user="root")),
        ("virt.define_xml_str", [xml], {}),
        ("virt.recovery_restart", ["deleg-d2", xml, {}], {}),
        ("virt.list_domains", [], {}),
        ("virt.get_hypervisor", [], {}),  # a function without **kwargs of its own
    ]:
        status, body = dave.local(HV, fun, arg, **kwargs)
        assert status == 200 and operators.refusal(fun, "dave") in _minion_error(body), (fun, body)
    assert not {"deleg-d1", "deleg-d2"} & set(_domains(api))
    # the same user through the runner: its publications carry the master's own user and pass
    assert _runner_list_works(dave)


def _runner_list_works(client):
    status, body = client.runner("virt.list")
    assert status == 200 and isinstance(body, dict) and isinstance(body.get(HV), dict), body
    assert "vms" in body[HV] and "error" not in body[HV], body
    return True


def test_the_runners_publications_carry_the_masters_user(api, hyper):
    """What user the hypervisor sees for a job the runner publishes on behalf of an eauth user: the
    master's own (the runner's LocalClient), which the default virt:operators lists; dave's name is only
    on his runner job."""
    before = set(_jobs(api))
    assert _runner_list_works(api.client("dave"))
    new = {jid: job for jid, job in _jobs(api).items() if jid not in before}
    published = {jid: job for jid, job in new.items() if not job["Function"].startswith("runner.")}
    assert published and all(job["Function"].startswith("virt.") for job in published.values()), new
    users = {job["User"] for job in published.values()}
    assert users == {salt.utils.user.get_specific_user()}, new
    assert all(operators.is_operator({}, user) for user in users)
    assert {job["User"] for job in new.values() if job["Function"] == "runner.virt.list"} == {"dave"}, new


def test_no_secret_in_the_job_cache_or_the_logs(api, hyper, created):
    """After the attacks above: no password (eauth, console) and no private key in clear in any file of the
    master's and the hypervisor minion's cache dirs (job cache included) or in the master's, salt-api's and
    the minion's log files. The sealed key is in the job cache, sealed only."""
    assert "PRIVATE KEY" not in json.dumps(created["kwargs"]) and created["kwargs"]["priv_key"]["context"]
    secrets = [s.encode() for s in (GFX_PW, USERS["alice"].password, USERS["dave"].password, "PRIVATE KEY")]
    configs = [api.master.config, hyper.config]
    dirs = [pathlib.Path(c["cachedir"]) for c in configs]
    files = [p for d in dirs for p in d.rglob("*") if p.is_file() and p.stat().st_size < 50 << 20]
    logs = [pathlib.Path(c[key]) for c in configs for key in ("log_file", "api_logfile") if c.get(key)]
    logs = [p for p in logs if p.is_file()]
    assert any("jobs" in p.parts for p in files) and len(logs) >= 2, (files, logs)
    assert sum(p.stat().st_size for p in logs) > 10000  # the logs of the attacks above are there
    leaked = [(p, s.decode()) for p in files + logs for s in secrets if s in p.read_bytes()]
    # Salt itself (not salt-virt) keeps a caller's own input in the master's root-only job cache: a runner
    # job's arguments (the console password alice gave virt.init) in that job's .load.p/return.p, and the
    # eauth password of a salt-api `local` request sent with credentials (not a /login token) in that
    # publication's .load.p. Nothing else may hold a secret: no log, no minion file, no publication of
    # the runner's, no private key anywhere.
    own = [(p, s) for p, s in leaked if _callers_own_input(_job_load(p), s)]
    assert sorted(set(leaked) - set(own)) == [], "\n".join(f"{p}: {s}" for p, s in set(leaked) - set(own))


def _callers_own_input(load, secret):
    ret = load.get("return") if isinstance(load.get("return"), dict) else {}
    if secret == GFX_PW and ret.get("fun") == "runner.virt.init" and ret.get("user") == "alice":
        return True
    kwargs = load.get("kwargs") or {}
    user = USERS.get(kwargs.get("username"))
    return user is not None and secret == user.password == kwargs.get("password") and load.get("cmd") == "publish"


def _job_load(path):
    """The job's ``.load.p`` for a file of the master's job cache (``jobs/<xx>/<hash>/[<id>/]<file>``)."""
    parts = path.parts
    if "jobs" not in parts:
        return {}
    jobdir = pathlib.Path(*parts[: parts.index("jobs") + 3])
    load = salt.payload.loads((jobdir / ".load.p").read_bytes())
    return load if isinstance(load, dict) else {}
