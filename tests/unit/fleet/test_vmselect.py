"""saltvirt.fleet.vmselect: ``select=`` of ``salt-run virt.*`` (Salt's compound syntax restricted to VMs) evaluated
on the hypervisors' signed facts: every operator, nesting, refusals; a selection over two live hypervisors
(libvirt's test driver, answers signed with each hypervisor's key: tests/support/signedfleet.py) acts on exactly
the selected VMs, a tenant's never reaches another tenant's VM, and a forged answer adds nothing."""

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import publish, tenants, vmselect
from saltvirt.model import vmgrains
from saltvirt.pki import answers
from tests.support import signedfleet
from tests.support.paths import TEST_NODE_XML
from tests.unit.host.test_vmresources import define

U = [f"0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9b{i:02d}" for i in range(8)]


def grains(uuid=U[0], name="web1", host="hv1", group=None, tenant=None, state="running", macs=()):
    facts = {
        "uuid": uuid,
        "name": name,
        "state": state,
        "cpu": 2,
        "mem": 256,
        "group": group,
        "owner": {"tenant": tenant, "creator": "u"} if tenant else None,
        "persistent": True,
        "autostart": False,
        "nics": {m: {"mac": m} for m in macs},
    }
    return vmgrains.grains(facts, host)


DB = grains(U[0], "db1", group="db", tenant="acme", macs=("52:54:00:00:00:0a", "52:54:00:00:00:0b"))
WEB = grains(U[1], "web1", host="hv2", group="web", state="shutoff")
OPS = grains(U[2], "ops1", host="hv2")


@pytest.mark.parametrize(
    ("expr", "picked"),
    [
        ("T@virt_vm", [DB, WEB, OPS]),
        (f"T@virt_vm:{U[1]}", [WEB]),
        ("G@group:db", [DB]),
        ("G@name:*1", [DB, WEB, OPS]),
        ("G@state:SHUT*", [WEB]),  # Salt's grain globs ignore case
        ("G@tenant:None", [WEB, OPS]),  # an operator's VM: Salt compares str(None)
        ("G@macs:52:54:00:00:00:0b", [DB]),  # a list grain: any item (the value holds the delimiter)
        ("G|@macs|52:54:00:00:00:0a", [DB]),  # Salt's own delimiter form
        (f"L@{U[2]},{U[0]}", [DB, OPS]),
        ("M@hv2", [WEB, OPS]),
        ("M@hv", []),  # exact, as Salt's managing-minion matcher
        ("T@virt_vm and G@group:db", [DB]),
        ("G@group:db or G@group:web", [DB, WEB]),
        ("T@virt_vm and not M@hv2", [DB]),
        ("T@virt_vm not M@hv2", [DB]),  # Salt: `not` after a term is `and not`
        ("not not G@group:web", [WEB]),
        ("G@group:db or G@group:web and M@hv1", [DB]),  # and before or, as Salt's eval
        ("( G@group:db or G@group:web ) and not M@hv1", [WEB]),
        ("( ( M@hv1 ) or ( ( G@name:ops1 ) ) )", [DB, OPS]),
    ],
)
def test_each_operator_and_engine_as_salt_means_it(expr, picked):
    match = vmselect.parse(expr)
    assert [g["name"] for g in (DB, WEB, OPS) if match(g)] == [g["name"] for g in picked]


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("E@web.*", "E@ matches minions, not VMs"),
        ("T@virt_vm and P@os:Deb.*", "P@ matches minions, not VMs"),
        ("I@role:db", "I@ matches minions, not VMs"),
        ("S@10.0.0.0/8", "S@ matches minions, not VMs"),
        ("N@dbs", "N@ matches minions, not VMs"),
        ("web*", "'web*' is no engine@pattern word (a bare word is a minion id glob in Salt)"),
        ("T@ssh", "T@ssh is not a VM: select takes virt_vm resources only"),
        ("G@group", "'G@group' needs a grain and a value: G@<grain>:<glob>"),
        ("", "a selection is a non-empty compound expression"),
        ("T@virt_vm and", "it ends where a term is expected"),
        ("and T@virt_vm", "'and' where a term is expected"),
        ("( T@virt_vm", "a '(' is not closed"),
        ("T@virt_vm )", "')' where and/or/not or the end is expected"),
        ("M@hv1 M@hv2", "'M@hv2' where and/or/not or the end is expected"),
        ("(M@hv1 or M@hv2)", "'(M@hv1': parentheses are words of their own, as in Salt"),
        ("not " * 40 + "T@virt_vm", "nested deeper than 32"),
        ("M@hv1 or " * 500 + "M@hv2", "longer than 4096 characters"),
    ],
)
def test_bad_selections_are_refused_saying_what_is_supported(expr, why):
    with pytest.raises(SaltInvocationError) as err:
        vmselect.parse(expr)
    assert why in str(err.value) and vmselect.SUPPORTED in str(err.value)


def test_a_non_string_selection_is_refused():
    with pytest.raises(SaltInvocationError, match="a selection is a non-empty compound expression"):
        vmselect.parse(["T@virt_vm"])


def full(*vms, status="up"):
    """A hypervisor's ``virt.full_info`` answer (``publish.Fleet.gather``'s shape) with VMs ``(name, uuid, extra)``."""
    if status != "up":
        return {"status": status, "error": "did not answer"}
    info = {n: {"uuid": u, "name": n, "state": "running", **extra} for n, u, extra in vms}
    return {"status": "up", "host": {}, "vm_info": info}


def test_a_vm_on_two_hypervisors_is_refused_never_picked():
    hosts = {
        "hv1": full(("db1", U[0], {"group": "db"}), ("db2", U[1], {"group": "db"})),
        "hv2": full(("db1", U[0], {"group": "db", "state": "shutoff"})),
        "hv3": full(status="down"),
    }
    got = vmselect.select(hosts, "G@state:shutoff")  # only the stale copy matches: the VM is still refused
    assert got["selected"] == [] and list(got["refused"]) == [U[0]]
    assert got["refused"][U[0]]["hosts"] == ["hv1", "hv2"] and got["down"] == ["hv3"]
    got = vmselect.select(hosts, "G@group:db")
    assert got["selected"] == [{"uuid": U[1], "name": "db2", "host": "hv1"}] and list(got["refused"]) == [U[0]]
    assert vmselect.select(hosts, "G@group:db", within=["hv2"])["selected"] == []  # tgt= narrows the picks only


def test_an_unreadable_vm_is_listed_and_nothing_matched_says_so():
    hosts = {"hv1": {"status": "up", "vm_info": {"odd": {"name": "odd", "state": "unknown", "error": "cannot"}}}}
    got = vmselect.answer(vmselect.select(hosts, "T@virt_vm"), {})
    assert got["unreadable"] == ["hv1/odd"] and got["note"] == "the selection matched no VM" and "retcode" not in got
    hosts["hv2"] = full(status="down")
    got = vmselect.answer(vmselect.select(hosts, "T@virt_vm"), {})
    assert got["note"] == "the selection matched no VM on the hypervisors that answered (these did not: hv2)"
    assert got["retcode"] == 1  # what was down may hold VMs the selection would have picked


# a selection over two live hypervisors ------------------------------------------------------------------------------
TENANTS = {"tenants": {"acme": {"members": ["alice"]}, "beta": {"members": ["bob"]}}}
OPERATOR = tenants.Caller(user="root", operator=True)
ALICE = tenants.Caller(user="alice", operator=False, tenant="acme")


def live_fleet(tmp_path, **virt):
    """``(opts, client, conns)``: hv1 and hv2 on their own test:/// nodes, answering with signed live answers
    (``virt``: more master ``virt:`` keys). hv1: db1 (group db, acme), web1 (group web, acme), beta1 (group db,
    beta); hv2: db2 (group db, operator's), db3 (group db, acme). Every one runs. Images: db1 and db2 debian12,
    db3 debian11, web1 salt://images/web.qcow2, beta1 none recorded."""
    conns = {h: libvirt.open(f"test://{TEST_NODE_XML}") for h in ("hv1", "hv2")}
    for dom in (d for c in conns.values() for d in c.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)):
        dom.destroy()  # the node's own 'test' domain: off, so every running VM is one defined here
    define(conns["hv1"], "db1", U[0], tenant="acme", group="db", start=True, image="debian12")
    define(conns["hv1"], "web1", U[1], tenant="acme", group="web", start=True, image="salt://images/web.qcow2")
    define(conns["hv1"], "beta1", U[2], tenant="beta", group="db", start=True)
    define(conns["hv2"], "db2", U[3], group="db", start=True, image="debian12")
    define(conns["hv2"], "db3", U[4], tenant="acme", group="db", start=True, image="debian11")
    client = signedfleet.SigningClient(signedfleet.live_answers(conns))
    opts = signedfleet.fleet_opts(tmp_path, ["hv1", "hv2"], **{**TENANTS, **virt})
    return opts, client, conns


@pytest.fixture
def fleet(tmp_path):
    opts, client, conns = live_fleet(tmp_path)
    yield opts, client, conns
    for conn in conns.values():
        conn.close()


def running(conns):
    """``{host: [running VM names]}`` by libvirt itself."""
    return {
        h: sorted(d.name() for d in c.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)) for h, c in conns.items()
    }


def test_a_selection_across_two_hosts_stops_exactly_the_selected_vms(fleet):
    opts, client, conns = fleet
    got = vmselect.run(
        publish.Fleet(opts, None, client), OPERATOR, "T@virt_vm and G@group:db and not G@tenant:beta", "virt.stop"
    )
    assert [(v["host"], v["name"]) for v in got["selected"]] == [("hv1", "db1"), ("hv2", "db2"), ("hv2", "db3")]
    assert got["results"] == {
        U[0]: {"name": "db1", "host": "hv1", "result": True},
        U[3]: {"name": "db2", "host": "hv2", "result": True},
        U[4]: {"name": "db3", "host": "hv2", "result": True},
    }
    assert "retcode" not in got and running(conns) == {"hv1": ["beta1", "web1"], "hv2": []}
    assert [f for f, _t in client.published] == ["virt.full_info", "virt.stop", "virt.stop", "virt.stop"]


def test_a_selection_by_image_stops_exactly_the_vms_of_that_image(fleet):
    """Issue 37's "every VM with image X": the image virt.init recorded, as each hypervisor signed it."""
    opts, client, conns = fleet
    transport = publish.Fleet(opts, client=client)
    got = vmselect.run(transport, OPERATOR, "G@image:salt://images/*", "virt.stop", test=True)
    assert [v["name"] for v in got["selected"]] == ["web1"]
    got = vmselect.run(
        publish.Fleet(opts, None, client), OPERATOR, "G@image:None", "virt.stop", test=True
    )  # none recorded
    assert [v["name"] for v in got["selected"]] == ["beta1"]
    got = vmselect.run(transport, OPERATOR, "T@virt_vm and G@image:debian12", "virt.stop")
    assert [(v["host"], v["name"]) for v in got["selected"]] == [("hv1", "db1"), ("hv2", "db2")]
    assert {r["name"]: r["result"] for r in got["results"].values()} == {"db1": True, "db2": True}
    assert running(conns) == {"hv1": ["beta1", "web1"], "hv2": ["db3"]}


def test_a_dry_run_lists_the_selection_and_touches_nothing(fleet):
    opts, client, conns = fleet
    transport = publish.Fleet(opts, client=client)
    got = vmselect.run(transport, OPERATOR, "M@hv2", "virt.stop", test=True)
    assert [v["name"] for v in got["selected"]] == ["db2", "db3"] and got["test"] is True and "results" not in got
    assert running(conns)["hv2"] == ["db2", "db3"] and [f for f, _t in client.published] == ["virt.full_info"]


def test_one_vm_failing_is_its_own_result_and_the_others_still_run(fleet):
    opts, client, conns = fleet
    transport = publish.Fleet(opts, client=client)
    conns["hv2"].lookupByName("db2").destroy()  # already off: the hypervisor refuses to force it off
    got = vmselect.run(transport, OPERATOR, "G@group:db and M@hv2", "virt.stop")
    assert "error" in got["results"][U[3]] and got["results"][U[4]]["result"] is True and got["retcode"] == 1
    assert running(conns)["hv2"] == []


def test_a_tenants_selection_never_reaches_another_tenants_vm(fleet):
    opts, client, conns = fleet
    got = vmselect.run(
        publish.Fleet(opts, None, client), ALICE, "T@virt_vm and G@group:db", "virt.stop"
    )  # beta1 is group db
    assert sorted(v["name"] for v in got["selected"]) == ["db1", "db3"]
    got = vmselect.run(
        publish.Fleet(opts, None, client), ALICE, f"T@virt_vm:{U[2]} or G@tenant:beta or G@name:db2", "virt.stop"
    )
    assert got["selected"] == [] and got["note"] == "the selection matched no VM"  # beta1, db2: not acme's
    assert running(conns) == {"hv1": ["beta1", "web1"], "hv2": ["db2"]}


def test_the_hypervisor_still_checks_the_owner_of_a_tenants_vm(fleet):
    """Belt and braces: were the master's view wrong, the hypervisor refuses a tenant's call on a VM not its own."""
    opts, client, conns = fleet
    transport = publish.Fleet(opts, client=client)
    client.answers["virt.full_info"]["hv1"] = lambda *a, **k: {
        "host": {},
        "vm_info": {"beta1": {"uuid": U[2], "name": "beta1", "state": "running", "owner": {"tenant": "acme"}}},
    }
    got = vmselect.run(transport, ALICE, "T@virt_vm", "virt.stop")
    assert "error" in got["results"][U[2]] and "beta1" in running(conns)["hv1"]


def test_a_forged_answer_cannot_add_a_vm_to_a_selection(fleet):
    """Another minion (a tenant's VM) puts an answer for hv2 on the bus, listing another tenant's VM as acme's: it
    is not signed with hv2's key for this request, so the selection never sees it."""
    opts, client, conns = fleet
    transport = publish.Fleet(opts, client=client)
    forged = {"host": {}, "vm_info": {"beta1": {"uuid": U[2], "name": "beta1", "state": "running"}}}
    real_reply = client.reply

    def forge_then_reply(jid, mid, kwarg, ret, retcode=0):
        if kwarg["fun"] == "virt.full_info" and mid == "hv2":
            for signer in ("hv1", "tenant-vm"):  # another hypervisor's key, or an unknown one
                fake = answers.sign(signedfleet.minion_key(signer)[1], signer, kwarg["fun"], kwarg["nonce"], forged, 0)
                client.event.queue.append({"tag": f"salt/job/{jid}/ret/hv2", "data": {"id": "hv2", "return": fake}})
            client.event.queue.append({"tag": f"salt/job/{jid}/ret/hv2", "data": {"id": "hv2", "return": forged}})
        real_reply(jid, mid, kwarg, ret, retcode)

    client.reply = forge_then_reply
    got = vmselect.run(transport, OPERATOR, "G@name:beta1 and M@hv2", "virt.stop")
    assert got["selected"] == [] and got["note"] == "the selection matched no VM"
    assert "beta1" in running(conns)["hv1"] and [f for f, _t in client.published] == ["virt.full_info"]
