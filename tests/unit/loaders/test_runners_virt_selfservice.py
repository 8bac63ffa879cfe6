"""_runners/virt_selfservice.py through Salt's runner loader: the catalog a caller may create from, a VM's
snapshots and backups on two live signed ``test:///`` hypervisors (tests/unit/fleet/test_vmselect.py's
``live_fleet``: acme's db1, web1, db3; beta's beta1; the operator's db2), and ``virt.job``, read from what the
master writes (its running-job file and its job cache). In a real browser through salt-api:
tests/integration/test_tenants.py."""

import os

import pytest
import salt.payload
import salt.utils.job

from saltvirt.fleet import callers
from saltvirt.host import ownership
from saltvirt.host import snapshot as snap
from tests.support import signedfleet
from tests.support.saltloader import make_runners

CATALOG = {
    "tiny": {"source": "salt://images/tiny.qcow2", "checksum": "sha256:" + "a" * 64, "min_size": 16},
    "big": {"source": "https://user:pw@images.example/big.qcow2", "checksum": "sha256:" + "b" * 64},
}
JID = "20260101120000123456"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """``(call(user, fun, *args, **kwargs), conns, runner)``: the virt runner over hv1 and hv2, whose snapshot
    and backup functions are the host layer's on their ``test:///`` nodes, after the owner check."""
    from tests.unit.fleet.test_vmselect import live_fleet

    opts, client, conns = live_fleet(tmp_path / "fleet", operators=["carol"])
    opts["virt"]["catalog"] = CATALOG
    opts["virt"]["tenants"]["acme"]["images"] = ["tiny", "gone"]

    def on(fun):
        def answer(conn):
            def run(vm, *args, tenant=None, **_kw):
                if tenant is not None:
                    ownership.check(conn, vm, tenant)
                return fun(conn, vm, *args)

            return run

        return {mid: answer(conn) for mid, conn in conns.items()}

    client.answers["virt.list_snapshots"] = on(snap.list_all)
    client.answers["virt.snapshot"] = on(lambda conn, vm, name=None: snap.create(conn, vm, name=name))
    client.answers["virt.delete_snapshots"] = on(lambda conn, vm, *names: snap.delete(conn, vm, names))
    client.answers["virt.backup_list"] = on(
        lambda _conn, vm: {
            "vm": vm,
            "backups": [
                {"id": "1", "owner": {"tenant": "acme"}, "tenant": "acme"},
                {"id": "2", "owner": {"tenant": "beta"}, "tenant": "beta"},  # a purged VM of the same name
                {"id": "3", "owner": {}, "tenant": None},
            ],
        }
    )
    signedfleet.serve(monkeypatch, client)
    runner = make_runners(tmp_path)
    runner.opts.update(pki_dir=opts["pki_dir"], cachedir=opts["cachedir"], virt=opts["virt"])

    def call(user, fun, *args, **kwargs):
        for face in callers.RUNNER_FACES:
            runner[face].__globals__.pop("__user__", None)
        runner[fun].__globals__["__user__"] = user
        return runner[fun](*args, **kwargs)

    yield call, conns, runner
    for conn in conns.values():
        conn.close()


def test_the_catalog_a_tenant_sees_is_its_own_without_sources(fleet):
    call, _conns, _runner = fleet
    mine = call("alice", "virt.catalog")
    assert mine["tenant"] == "acme" and mine["images"] == {"tiny": {"format": "qcow2", "min_size": 16}}
    assert mine["profiles"] == ["default"] and mine["networks"] == [] and mine["hypervisors"] == ["*"]
    assert "interfaces" in mine["arguments"] and "connection" not in mine["arguments"]
    assert "salt://" not in str(mine) and "sha256" not in str(mine)
    everything = call("carol", "virt.catalog")
    assert everything["tenant"] is None and sorted(everything["images"]) == ["big", "tiny"]
    assert "pw@" not in str(everything)  # a source may hold a password: never shown


def test_a_tenant_snapshots_its_own_vm_up_to_its_limit(fleet):
    call, conns, _runner = fleet
    assert call("alice", "virt.snapshots", "db1") == {"name": "db1", "host": "hv1", "snapshots": []}
    made = call("alice", "virt.snapshot", "db1", snapshot="s1")
    assert made["host"] == "hv1" and made["result"]["name"] == "s1"
    for name in ("s2", "s3"):
        assert "error" not in call("alice", "virt.snapshot", "db1", snapshot=name)
    refused = call("alice", "virt.snapshot", "db1", snapshot="s4")
    assert refused["data"]["error"] == "VM db1 has 3 of its 3 snapshots: delete one first (virt.delete_snapshot)"
    assert snap.names(conns["hv1"], "db1") == ["s1", "s2", "s3"]
    assert "error" not in call("carol", "virt.snapshot", "db1", snapshot="s4")  # the operator: no limit
    call("alice", "virt.delete_snapshot", "db1", "s1")
    listed = call("alice", "virt.snapshots", "db1")["snapshots"]
    assert [s["name"] for s in listed] == ["s2", "s3", "s4"]


@pytest.mark.parametrize(
    ("fun", "args"),
    [
        ("virt.snapshots", ["beta1"]),
        ("virt.snapshot", ["beta1"]),
        ("virt.delete_snapshot", ["beta1", "s1"]),
        ("virt.revert_snapshot", ["beta1", "s1"]),
        ("virt.backups", ["beta1"]),
        ("virt.snapshots", ["db2"]),  # the operator's VM
    ],
)
def test_a_tenant_cannot_reach_another_tenants_vm(fleet, fun, args):
    call, conns, _runner = fleet
    snap.create(conns["hv1"], "beta1", name="s1")
    ret = call("alice", fun, *args)
    assert ret["data"]["error"] == f"no VM named {args[0]} in tenant acme" and ret["data"]["retcode"] == 1, ret
    assert snap.names(conns["hv1"], "beta1") == ["s1"]


def test_backups_of_a_tenants_vm_are_those_its_tenant_owns(fleet):
    call, _conns, _runner = fleet
    assert [b["id"] for b in call("alice", "virt.backups", "db1")["backups"]] == ["1"]
    assert [b["id"] for b in call("carol", "virt.backups", "db1")["backups"]] == ["1", "2", "3"]


def running(runner, jid, user, fun="runner.virt.init"):
    proc = os.path.join(runner.opts["cachedir"], "proc")
    os.makedirs(proc, exist_ok=True)
    with open(os.path.join(proc, jid), "wb") as fh:
        fh.write(salt.payload.dumps({"fun": fun, "jid": jid, "user": user, "pid": 1}))


def finished(runner, jid, user, fun="runner.virt.init", mid=None):
    """What the runner client stores when its job ends (salt.client.mixins.SyncClientMixin.low)."""
    data = {"fun": fun, "jid": jid, "user": user, "return": {"name": "w1"}, "success": True}
    load = {"id": mid or runner.opts["id"], "tgt": runner.opts["id"], "jid": jid, "return": data}
    assert salt.utils.job.store_job(runner.opts, load) is not False


def test_a_job_is_its_callers_only(fleet):
    call, _conns, runner = fleet
    running(runner, JID, "alice")
    assert call("alice", "virt.job", JID) == {"jid": JID, "fun": "virt.init", "state": "running"}
    unknown = {"error": f"no virt runner job {JID} of user bob", "retcode": 1}
    assert call("bob", "virt.job", JID)["data"] == unknown
    os.remove(os.path.join(runner.opts["cachedir"], "proc", JID))
    finished(runner, JID, "alice")
    assert call("alice", "virt.job", JID) == {
        "jid": JID,
        "fun": "virt.init",
        "state": "finished",
        "success": True,
        "return": {"name": "w1"},
    }
    assert call("bob", "virt.job", JID)["data"] == unknown


def test_a_job_that_is_not_the_virt_runners_or_not_a_job_id_is_refused(fleet):
    call, _conns, runner = fleet
    running(runner, JID, "alice", fun="runner.jobs.list_jobs")
    assert call("alice", "virt.job", JID)["data"]["error"] == f"no virt runner job {JID} of user alice"
    refused = call("alice", "virt.job", "../../etc/passwd")["data"]["error"]
    assert refused == "'../../etc/passwd' is not a job id (20 digits)"


def test_a_minion_named_like_the_master_makes_job_answers_untrusted(fleet):
    """A minion's return is stored under its own id: one with the master's id could forge a finished job."""
    call, _conns, runner = fleet
    finished(runner, JID, "alice")
    os.makedirs(os.path.join(runner.opts["pki_dir"], "minions"), exist_ok=True)
    with open(os.path.join(runner.opts["pki_dir"], "minions", runner.opts["id"]), "w") as fh:
        fh.write("key")
    ret = call("alice", "virt.job", JID)
    assert ret["data"]["error"].startswith("a minion key is named like this master"), ret
