"""_runners/virt*.py (one ``virt`` runner) through Salt's runner loader, without a salt-master: what is refused
before anything is published or created (``salt-run virt.init ... wait=``). Waiting itself needs a master and a
hypervisor: tests/integration/test_guest_ips.py."""

import logging

import pytest

from tests.support.saltloader import make_runners


@pytest.fixture
def runner(tmp_path):
    return make_runners(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wait": "ssh"}, "wait must be ip or minion (or left out), not 'ssh'"),
        ({"wait": "minion", "start": False}, "wait=minion needs the VM started: leave out start=False"),
        (
            {"wait": "ip", "wait_timeout": "0"},
            "wait_timeout must be a number of seconds above 0 (at most 86400), not '0'",
        ),
    ],
)
def test_init_refuses_a_bad_wait_before_anything_happens(runner, tmp_path, kwargs, message):
    ret = runner["virt.init"]("web1", 1, 128, **kwargs)
    assert ret["data"] == {"error": message, "retcode": 1}
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published


@pytest.mark.parametrize("arg", ["connection"])  # username/password: tests/unit/model (no credentials)
def test_init_never_forwards_a_connection_argument(runner, tmp_path, arg):
    hostile = "qemu+ext:///system?command=/bin/sh"
    ret = runner["virt.init"]("web1", 1, 128, **{arg: hostile})
    message = (
        f"salt-run virt.init: {arg}= is not forwarded to the hypervisors: each one uses the libvirt connection its "
        f"minion config names (virt:connection); drop {arg}="
    )
    assert ret["data"] == {"error": message, "retcode": 1}
    assert hostile not in str(ret)
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"graphics": {"type": "vnc", "password": {"v": 2, "ct": "stolen"}}}, "graphics:password"),
        ({"priv_key": {"v": 2, "ct": "stolen"}}, "priv_key"),
    ],
)
def test_init_never_forwards_an_envelope_from_a_call(runner, tmp_path, kwargs, arg):
    """A sealed secret (e.g. another VM's key from the job cache) never passes the runner unsealed."""
    ret = runner["virt.init"]("web1", 1, 128, **kwargs)
    message = (
        f"salt-run virt.init: {arg} must be given in clear to the runner (it seals it for the chosen hypervisor "
        "itself); a sealed envelope or mapping is never accepted from a call"
    )
    assert ret["data"] == {"error": message, "retcode": 1}
    assert "stolen" not in str(ret)
    assert not (tmp_path / "pki").exists()


@pytest.mark.parametrize(
    ("name", "kwargs", "what", "value"),
    [("hyper1", {}, "VM name", "hyper1"), ("db1", {"minion_id": "hyper1"}, "minion id", "hyper1")],
)
def test_init_refuses_a_vm_the_hypervisor_target_matches(runner, tmp_path, name, kwargs, what, value):
    ret = runner["virt.init"](name, 1, 128, **kwargs)
    message = (
        f"salt-run virt.init: the {what} {value!r} matches virt:hypervisors in the master config: a VM must never "
        f"be taken for a hypervisor (it would get libvirt certificates); pick another {what}"
    )
    assert ret["data"] == {"error": message, "retcode": 1}
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published


@pytest.mark.parametrize(
    "kwargs", [{"image": "https://169.254.169.254/latest/"}, {"disks": [{"name": "d", "image": "https://10.0.0.5/x"}]}]
)
def test_init_refuses_an_image_url_outside_the_operators_sources(runner, tmp_path, kwargs):
    """virt:image_sources (master config, none here): the hypervisor is never asked to fetch it (issue 34 #7)."""
    ret = runner["virt.init"]("web1", 1, 128, **kwargs)
    assert "is not from a source the operator allows (virt:image_sources in the master config: none)" in str(ret)
    assert ret["data"]["retcode"] == 1 and not (tmp_path / "pki").exists()  # no key generated, nothing published


# tenants: what is refused before anything is published (the whole flow: tests/integration/test_tenants.py)
SHA = "sha256:" + "ab" * 32
TENANTS = {
    "hypervisors": ["hyper1"],
    "operators": ["carol"],
    "tenants": {"acme": {"members": ["alice"], "quota": {"vcpus": 2}, "images": ["tiny"]}},
    "catalog": {"tiny": {"source": "salt://images/tiny.qcow2", "checksum": SHA}},
}


@pytest.fixture
def tenant_runner(runner):
    runner.opts["virt"] = TENANTS

    def call(user, fun, *args, **kwargs):
        # what Salt's runner client does for every job: the job's user as the module global __user__
        runner[fun].__globals__["__user__"] = user
        return runner[fun](*args, **kwargs)

    return call


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image": "salt://images/tiny.qcow2"}, "tenant acme may use catalog images only: 'salt://images/tiny.qcow2'"),
        ({"image": "other"}, "tenant acme may use catalog images only: 'other' is not one of its images (tiny)"),
        ({"image": "tiny", "boot": {"kernel": "/etc/shadow"}}, "tenant acme may not pass boot to virt.init"),
        ({"image": "tiny", "tenant": "beta"}, "user alice is in tenant acme: tenant=beta is refused"),
        ({"image": "tiny", "minion_id": "hyper2"}, "tenant acme: a VM's minion id is its name"),
        ({"image": "tiny", "nic": "uplink"}, "tenant acme may not use nic profile 'uplink' (allowed: default)"),
    ],
)
def test_tenant_init_refusals_before_anything_happens(tenant_runner, tmp_path, kwargs, message):
    ret = tenant_runner("alice", "virt.init", "web1", 1, 128, **kwargs)
    assert ret["data"]["error"].startswith(message), ret
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published


def test_init_tells_the_hypervisor_which_catalog_entry_the_image_came_from(tenant_runner, monkeypatch):
    """The hypervisor gets the catalog entry's source and records its name (the VM's image grain); an image
    named by its source is recorded as given (the hypervisor strips what could be a secret)."""
    from saltvirt.fleet import vmcreate

    sent = []
    monkeypatch.setattr(
        vmcreate, "create", lambda _o, name, _r, image, kwargs, **_k: sent.append((image, kwargs)) or {}
    )
    tenant_runner("alice", "virt.init", "web1", 1, 128, image="tiny")
    tenant_runner("carol", "virt.init", "web2", 1, 128, image="tiny")
    monkeypatch.setattr(vmcreate, "image_mib", lambda *_a: (0, "no fileserver here"))
    tenant_runner("carol", "virt.init", "web3", 1, 128, image="salt://images/tiny.qcow2")
    assert [(image, kwargs.get("catalog_image")) for image, kwargs in sent] == [
        ("salt://images/tiny.qcow2", "tiny"),
        ("salt://images/tiny.qcow2", "tiny"),
        ("salt://images/tiny.qcow2", None),
    ]
    for user in ("alice", "carol"):  # nobody names the catalog entry: the runner does
        refused = tenant_runner(user, "virt.init", "web4", 1, 128, image="salt://x.qcow2", catalog_image="debian12")
        assert "catalog_image" in refused["data"]["error"] and len(sent) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"boot": {"kernel": "/etc/shadow"}}, "tenant acme may not pass boot to virt.update (a tenant may pass: "),
        ({"host_devices": ["pci_0000_00_1f_2"]}, "tenant acme may not pass host_devices to virt.update"),
        ({"graphics": {"type": "vnc", "listen": "0.0.0.0"}}, "tenant acme may not pass graphics to virt.update"),
        ({"disks": [{"name": "d", "path": "/dev/sda"}]}, "tenant acme may not set path in disks (allowed: "),
        ({"disks": {"d": {"size": 8, "pool": "ops"}}}, "tenant acme may not use pool 'ops' (allowed: none)"),
        ({"nic_profile": "uplink"}, "tenant acme may not use nic profile 'uplink' (allowed: default)"),
        ({"interfaces": [{"name": "e", "bridge": "br-mgmt"}]}, "tenant acme may not use network 'br-mgmt'"),
        ({"cpu": {"maximum": 4, "tuning": {"vcpupin": {0: "0"}}}}, "cpu must be"),
        ({"connection": "qemu:///system"}, "salt-run virt.update: connection= is not forwarded"),
        ({"alloewd_paths": ["/"]}, "salt-run virt.update: unknown argument(s) alloewd_paths"),
    ],
)
def test_tenant_update_refusals_before_anything_happens(tenant_runner, kwargs, message):
    """What a tenant may not pass to salt-run virt.update is refused before any hypervisor is asked (none
    answers here: a refusal after publishing would say so)."""
    ret = tenant_runner("alice", "virt.update", "web1", **kwargs)
    assert ret["data"]["error"].startswith(message), ret


HA_REFUSAL = (
    "tenant acme may not pass ha=True to {fun}: the operator has not let tenants mark their VMs for automatic HA "
    "(virt:ha:tenant_flag in the master config): ask the operator"
)


def test_ha_forwarded_an_operators_always_a_tenants_only_with_tenant_flag(tenant_runner, runner, monkeypatch, tmp_path):
    """salt-run virt.init/virt.update ha=True: recorded on the hypervisor (saltvirt.fleet.ha reads it); a tenant's
    restarts take capacity the operator keeps, so a tenant's ha=True needs virt:ha:tenant_flag."""
    from saltvirt.fleet import vmcreate, vmupdate

    sent = []
    monkeypatch.setattr(vmcreate, "create", lambda _o, name, _r, _i, kwargs, **_k: sent.append((name, kwargs)) or {})
    monkeypatch.setattr(vmupdate, "update", lambda _o, name, _c, _m, kwargs, **_k: sent.append((name, kwargs)) or {})
    ret = tenant_runner("alice", "virt.init", "web1", 1, 128, image="tiny", ha=True)
    assert ret["data"] == {"error": HA_REFUSAL.format(fun="virt.init"), "retcode": 1}
    assert not (tmp_path / "pki").exists()
    ret = tenant_runner("alice", "virt.update", "web1", ha="yes")
    assert ret["data"] == {"error": HA_REFUSAL.format(fun="virt.update"), "retcode": 1}
    assert sent == []
    ops = tenant_runner("carol", "virt.init", "ops1", 1, 128, image="tiny", ha=True)  # an operator's: always
    assert "warnings" not in ops["data"]
    for_acme = tenant_runner("carol", "virt.init", "acme1", 1, 128, image="tiny", ha=True, tenant="acme")
    assert for_acme["data"]["warnings"] == [
        "ha=True on tenant acme's VM acme1 is recorded, but automatic HA counts a tenant's VM's flag only with "
        "virt:ha:tenant_flag: True in the master config; to make acme1 HA alone, name it in virt:ha:vms"
    ]
    tenant_runner("carol", "virt.update", "ops1", ha=True)
    tenant_runner("alice", "virt.init", "web2", 1, 128, image="tiny", ha=False)  # turning it off: always
    tenant_runner("alice", "virt.update", "web2", ha=False)
    opts = runner["virt.init"].__globals__["__opts__"]  # the loaded runner's copy of the master config
    opts["virt"] = dict(opts["virt"], ha={"tenant_flag": True})  # the operator lets tenants mark their VMs HA
    tenant_runner("alice", "virt.init", "web3", 1, 128, image="tiny", ha=True)
    tenant_runner("alice", "virt.update", "web3", ha=True)
    assert [(name, kwargs.get("ha")) for name, kwargs in sent] == [
        ("ops1", True),
        ("acme1", True),
        ("ops1", True),
        ("web2", False),
        ("web2", False),
        ("web3", True),
        ("web3", True),
    ]


def test_callers_from_the_job_user_only(tenant_runner):
    assert tenant_runner("alice", "virt.whoami") == {
        "user": "alice",
        "operator": False,
        "tenant": "acme",
        "why": "member of tenant acme",
    }
    assert tenant_runner("carol", "virt.whoami")["operator"] is True
    refused = tenant_runner("mallory", "virt.whoami")["data"]["error"]
    assert refused.startswith("user mallory is in no tenant and no operator")
    refused = tenant_runner("UNKNOWN", "virt.whoami")["data"]["error"]
    assert refused.startswith("this runner job has no authenticated user")


@pytest.mark.parametrize("fun", ["virt.record", "virt.rebalance", "virt.provision_assigned", "virt.cleanup"])
def test_other_runner_files_see_the_user_salt_injected_into_one(runner, fun):
    """SyncClientMixin.low puts __user__ into the first loaded module of virtualname virt only."""
    runner.opts["virt"] = TENANTS
    runner["virt.init"].__globals__["__user__"] = "alice"
    assert "__user__" not in runner[fun].__globals__
    args = {"virt.provision_assigned": {"host": "hyper1"}, "virt.cleanup": {"name": "web1"}}
    ret = runner[fun](**args.get(fun, {}))
    assert ret["error"].startswith(f"{fun} is for operators: user alice is a member of tenant acme"), ret


@pytest.mark.parametrize("fun", ["virt.host_info", "virt.next_host", "virt.evacuate"])
def test_operator_functions_refused_to_tenants(tenant_runner, fun):
    args = ("hyper1",) if fun == "virt.evacuate" else ()
    ret = tenant_runner("alice", fun, *args)
    assert ret["data"]["error"].startswith(f"{fun} is for operators: user alice is a member of tenant acme")


def test_every_virt_runner_file_has_a_face_the_caller_is_looked_up_in(runner):
    """Salt injects __user__ into one of the virt runner's files: callers.RUNNER_FACES names one function of each."""
    import ast

    from saltvirt.fleet import callers
    from tests.support.paths import ROOT

    files = set()
    for path in (ROOT / "_runners").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if hasattr(t, "id")}
        if "__virtualname__" in names and '__virtualname__ = "virt"' in path.read_text():
            files.add(path.name)
    faces = {runner[fun].__globals__["__file__"].rsplit("/", 1)[-1] for fun in callers.RUNNER_FACES}
    assert files == faces, "add one function of each virt runner file to saltvirt.fleet.callers.RUNNER_FACES"


@pytest.mark.parametrize("face", ["virt.init", "virt.whoami", "virt.migrate", "virt.record", "virt.backup"])
def test_whichever_file_salt_injected_the_user_into(runner, face):
    runner.opts["virt"] = TENANTS
    runner[face].__globals__["__user__"] = "alice"
    assert runner["virt.whoami"]()["tenant"] == "acme"
    for fun, args in (("virt.vm_info", ("web1",)), ("virt.migrate", ("web1", "hyper1"))):
        # a tenant's VM no hypervisor answered for: the tenant's wording, so the caller was seen as alice
        assert runner[fun](*args)["data"]["error"].startswith("no VM named web1 in tenant acme"), fun


def test_tenant_functions_answer_in_the_runners_shape(tenant_runner):
    refused = tenant_runner("mallory", "virt.usage")
    assert refused["outputter"] == "virt_query" and refused["data"]["retcode"] == 1
    assert refused["data"]["error"].startswith("user mallory is in no tenant and no operator")
    bad = tenant_runner("carol", "virt.migrate", "../web1", "hyper1")
    assert bad["outputter"] == "virt_query" and "retcode" in bad["data"] and bad["data"]["error"]


@pytest.mark.parametrize(("fun", "args"), [("virt.migrate", ("web1", "hyper2")), ("virt.evacuate", ("hyper1",))])
def test_a_bad_migration_timeout_is_refused_before_anything_moves(runner, fun, args):
    runner.opts["virt"] = {"hypervisors": ["hyper1"], "migration_timeout": "soon"}
    ret = runner[fun](*args)
    assert ret["data"]["error"].startswith("virt:migration_timeout must be a number of seconds above 0"), ret


def test_the_runner_loads_without_libvirt(tmp_path):
    """Every salt-run virt.* loads all the virt runner files on the master, where libvirt is not needed:
    importing it (~0.1 s) was a cost of every runner call (a library module brought it in for one hypervisor-side
    function). A fresh interpreter, as salt-run has one."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tests.support.saltloader import make_runners\n"
        f"runners = make_runners(__import__('pathlib').Path({str(tmp_path)!r}))\n"
        "funs = [f for f in runners if f.startswith('virt.')]\n"
        "assert 'virt.init' in funs and 'virt.query' in funs and 'virt.migrate' in funs, funs\n"
        "print(sorted(m for m in sys.modules if m == 'libvirt' or m.startswith('libvirt.')))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_saltext_virt_installed_too_is_named_when_the_runner_loads(tmp_path, monkeypatch, caplog):
    """A file_roots install has no entry point to warn from (saltvirt.loader.get_dirs): the runner does, once."""
    from saltvirt.base import install

    info = tmp_path / "site" / "saltext.virt-1.0.0.dist-info"  # as pip leaves saltext-virt in site-packages
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: saltext.virt\nVersion: 1.0.0\n")
    monkeypatch.syspath_prepend(str(info.parent))
    monkeypatch.setattr(install, "_checked", False)
    with caplog.at_level(logging.WARNING):
        list(make_runners(tmp_path))  # every runner module loaded: each file of the virt runner could warn
    warned = [r.getMessage() for r in caplog.records if "saltext" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("saltext.virt 1.0.0 is installed beside salt-virt")


# select=: a fleet operation on the VMs a selection picks (the evaluator: tests/unit/fleet/test_vmselect.py)
@pytest.fixture
def fleet_runner(tmp_path, monkeypatch):
    """``(call(user, fun, *args, **kwargs), client, conns)``: the virt runner over two live signed hypervisors
    (tests/unit/fleet/test_vmselect.py's ``live_fleet``); carol is an operator, alice in tenant acme."""
    from tests.support import signedfleet
    from tests.unit.fleet.test_vmselect import live_fleet

    opts, client, conns = live_fleet(tmp_path / "fleet", operators=["carol"])
    signedfleet.serve(monkeypatch, client)
    runner = make_runners(tmp_path)
    runner.opts.update(pki_dir=opts["pki_dir"], cachedir=opts["cachedir"], virt=opts["virt"])

    def call(user, fun, *args, **kwargs):
        runner[fun].__globals__["__user__"] = user
        return runner[fun](*args, **kwargs)

    yield call, client, conns
    for conn in conns.values():
        conn.close()


def test_stop_select_stops_exactly_the_selected_vms_across_hosts(fleet_runner):
    from tests.unit.fleet.test_vmselect import running

    call, client, conns = fleet_runner
    listed = call("carol", "virt.stop", select="T@virt_vm and G@group:db", test=True)["data"]
    assert [v["name"] for v in listed["selected"]] == ["db1", "beta1", "db2", "db3"] and "results" not in listed
    assert running(conns) == {"hv1": ["beta1", "db1", "web1"], "hv2": ["db2", "db3"]}  # a dry run
    out = call("carol", "virt.stop", select="T@virt_vm and G@group:db and not G@tenant:beta")["data"]
    assert {r["name"]: r["result"] for r in out["results"].values()} == {"db1": True, "db2": True, "db3": True}
    assert running(conns) == {"hv1": ["beta1", "web1"], "hv2": []} and "retcode" not in out
    out = call("carol", "virt.stop", select="G@group:nosuch")["data"]
    assert (out["selected"], out["results"], out["note"]) == ([], {}, "the selection matched no VM")


def test_a_tenants_stop_select_reaches_its_own_vms_only(fleet_runner):
    from tests.unit.fleet.test_vmselect import running

    call, _client, conns = fleet_runner
    out = call("alice", "virt.stop", select="G@group:db or G@tenant:beta")["data"]  # beta1: group db, beta's
    assert sorted(r["name"] for r in out["results"].values()) == ["db1", "db3"]
    assert running(conns) == {"hv1": ["beta1", "web1"], "hv2": ["db2"]}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (["db1"], {"select": "T@virt_vm"}, "virt.stop: select= picks the VMs: drop the VM name and host="),
        (["db1"], {"test": True}, "virt.stop: test=True lists what select= picks; a call naming a VM has no dry run"),
        ([], {"select": "E@db.*"}, "select='E@db.*': E@ matches minions, not VMs (supported: T@virt_vm"),
        ([], {}, "virt.stop needs a VM name, or select=<selection>"),
    ],
)
def test_stop_select_refusals_before_anything_is_published(fleet_runner, args, kwargs, message):
    call, client, _conns = fleet_runner
    out = call("carol", "virt.stop", *args, **kwargs)["data"]
    assert out["retcode"] == 1 and out["error"].startswith(message), out
    assert client.published == []


def test_console_tickets_follow_the_vms_owner_and_carry_no_password_in_clear(fleet_runner):
    """salt-run virt.console: a tenant gets tickets for its own VMs only (refused for another tenant's before
    anything is published to that VM's hypervisor), an operator for any; the hypervisor's answer (here: its
    ownership check and a password sealed to the caller's key, as virt.console answers) comes back as is."""
    import base64

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    from saltvirt.host import ownership, vncticket

    call, client, conns = fleet_runner
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pub = base64.b64encode(der).decode()

    def console(conn):
        def answer(name, pubkey, tenant=None, **_kwargs):
            if tenant is not None:
                ownership.check(conn, name, tenant)
            return {"vm": name, "password": vncticket.seal_for(vncticket.browser_key(pubkey), f"pw-{name}")}

        return answer

    client.answers["virt.console"] = {mid: console(conn) for mid, conn in conns.items()}
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    for user, vm in (("alice", "web1"), ("alice", "db3"), ("carol", "beta1")):
        ret = call(user, "virt.console", vm, pubkey=pub)["data"]
        assert ret["name"] == vm and ret["result"]["vm"] == vm, ret
        assert key.decrypt(base64.b64decode(ret["result"]["password"]), oaep).decode() == f"pw-{vm}"
        assert f"pw-{vm}" not in str(ret)
    published = len(client.published)
    refused = call("alice", "virt.console", "beta1", pubkey=pub)["data"]
    assert refused["error"].startswith("no VM named beta1 in tenant acme"), refused
    assert [f for f, _ in client.published[published:]] == ["virt.full_info"]  # located, never asked for a ticket
