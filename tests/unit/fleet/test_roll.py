"""saltvirt.fleet.roll through ``salt-run virt.roll`` on Salt's runner loader: three hypervisors that sign their
answers with their own keys (tests/support/signedfleet.py), each a private libvirt ``test:///`` connection whose
domains really move when the source answers ``virt.migrate`` (defined and started on the target, destroyed and
undefined on the source), and the real shared store (localfs). What stands in: the minions' transport (a real one
needs a salt-master: tests/integration), the states' outcome (``virt.host_states`` answers what the test says a
state run returned) and the reboot (a new boot id, silent for one question first)."""

import uuid

import libvirt
import pytest

from saltvirt.fleet import fleetstate, placement, recovery, roll
from saltvirt.pki import answers
from tests.support import signedfleet
from tests.support.fleetfacts import MIGRATION_STEPS
from tests.support.saltloader import make_runners, new_job
from tests.support.testfleet import TestFleet, domain_xml

HVS = ["hv1", "hv2", "hv3"]
OK_STATE = {
    "pkg_|-upgrade_|-upgrade_|-uptodate": {"result": True, "comment": "", "changes": {"x": 1}, "__id__": "upgrade"}
}
FAILED_STATE = {
    "pkg_|-upgrade_|-upgrade_|-uptodate": {"result": False, "comment": "E: dpkg was interrupted", "changes": {}},
    "file_|-motd_|-/etc/motd_|-managed": {"result": True, "comment": "", "changes": {}},
}


READY = {
    "ready": True,
    "libvirtd": {"ok": True, "why": "libvirt 9000000 answers"},
    "tls": {"ok": None, "why": "migrations to this host use tcp (virt:migration:transport)"},
    "engine": {"ok": True, "why": "the events engine (virt_events) beat 1 s ago, connected to libvirt"},
}
ENGINE_LATE = dict(READY, ready=False, engine={"ok": False, "why": "the events engine has not beaten since this boot"})
NOT_AVAILABLE = ("'virt.host_ready' is not available.", 254)  # virt.answer on an older salt-virt (pki.answers)


class RollFleet(signedfleet.SigningClient):
    """The hypervisors' signed answers computed from their libvirt test connections (see the module doc)."""

    def __init__(self, tmp_path):
        super().__init__({})
        self.fleet = TestFleet(tmp_path, HVS)
        self.states = {h: {"ret": OK_STATE, "retcode": 0} for h in HVS}
        self.boot = {h: f"boot-{h}-0" for h in HVS}
        self.rebooting: set[str] = set()  # silent for one more question, then booted again
        self.reboots: list[str] = []
        self.applied: list[tuple[str, object, bool]] = []
        self.arrive: dict[str, str] = {}  # host -> a VM defined there right after its states ran
        self.pending: dict[str, str] = {}
        self.silent: set[str] = set()
        self.ready: dict[str, list] = {h: [READY] for h in HVS}  # virt.host_ready's answers in turn, the last kept

    def add(self, host, name, mem=512):
        dom = self.fleet.conns[host].defineXML(domain_xml(name, f"{self.fleet.shared}/{name}.qcow2", uuid.uuid4(), mem))
        dom.create()

    def uuids(self):
        """``{uuid: [hosts running it]}`` by libvirt on every host."""
        out = {}
        for host, conn in sorted(self.fleet.conns.items()):
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                out.setdefault(dom.UUIDString(), []).append(host)
        return out

    def names(self, host):
        return sorted(d.name() for d in self.fleet.conns[host].listAllDomains(0))

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        if fun == "system.reboot":  # published as it is (nothing decided from its return): the host goes away
            self.reboots.extend(tgt)
            self.rebooting.update(tgt)
            return {"jid": "1", "minions": list(tgt)}
        self._jid += 1
        jid = jid or str(20260000000000000000 + self._jid)
        inner = kwarg["fun"]
        if inner == answers.JOB_CHECK:
            return {"jid": jid, "minions": list(tgt)}
        self.published.append((inner, sorted(tgt)))
        for mid in sorted(set(tgt) - self.silent):
            if inner == "virt.boot_id" and mid in self.rebooting:
                self.rebooting.discard(mid)  # this question gets no answer (down); the next one a new boot
                self.boot[mid] = self.boot[mid][:-1] + str(int(self.boot[mid][-1]) + 1)
                continue
            ret = self.answer(mid, inner, kwarg.get("args") or [], kwarg.get("kwargs") or {})
            self.reply(jid, mid, kwarg, *(ret if isinstance(ret, tuple) else (ret,)))
        return {"jid": jid, "minions": list(tgt)}

    def _facts(self, host):
        vms = {}
        for dom in self.fleet.conns[host].listAllDomains(0):
            info = dom.info()
            state = "running" if info[0] == libvirt.VIR_DOMAIN_RUNNING else "shutdown"
            vms[dom.name()] = {"state": state, "uuid": dom.UUIDString(), "mem": info[1] // 1024, "cpu": 1}
        used = sum(v["mem"] for v in vms.values() if v["state"] == "running")
        facts = {
            "mem_total": 4096,
            "mem_used_by_vms": used,
            "vcpus_total": 8,
            "vcpus_used_by_vms": len(vms),
            "disk_free": 102400,
            "vms_defined": len(vms),
            "groups": {},
        }
        return {"host": facts, "vm_info": vms}

    def _after_reboot(self, host, fun):
        if fun == "virt.boot_id":
            return self.boot[host]
        return self.ready[host].pop(0) if len(self.ready[host]) > 1 else self.ready[host][0]

    def answer(self, host, fun, args, kwargs):
        if fun in ("virt.full_info", "virt.capacity"):
            return self._facts(host)
        if fun in ("virt.boot_id", "virt.host_ready"):
            return self._after_reboot(host, fun)
        if fun == "virt.host_states":
            self.applied.append((host, args[0], kwargs.get("test")))
            if host in self.arrive:
                self.add(host, self.arrive.pop(host))
            return self.states[host]
        if fun == "virt.migrate_prepare":
            self.pending[args[0]] = host
            return MIGRATION_STEPS[fun]
        if fun == "virt.migrate":
            dom = self.fleet.conns[host].lookupByName(args[0])
            xml = dom.XMLDesc(0)
            dom.destroy()
            dom.undefine()
            self.fleet.conns[self.pending.pop(args[0])].defineXML(xml).create()
            return MIGRATION_STEPS[fun]
        if fun == "virt.recovery_record":
            return {"vms": {n: {"uuid": vm["uuid"]} for n, vm in self._facts(host)["vm_info"].items()}}
        if fun in MIGRATION_STEPS:
            return MIGRATION_STEPS[fun]
        if fun == "virt.migrate_abort_cleanup":
            return {}
        raise AssertionError(f"unexpected {fun} on {host}")


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(roll, "POLL", 0.05)  # the product asks a rebooting host every 2 s


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """Two 512 MiB VMs on each of hv1..hv3 (4 GiB each, no reserve)."""
    client = RollFleet(tmp_path)
    for host in HVS:
        for i in range(2):
            client.add(host, f"{host}-vm{i}")
    signedfleet.serve(monkeypatch, client)
    yield client
    client.fleet.close()


@pytest.fixture
def salt_run(tmp_path):
    """``salt-run virt.roll <tgt> ...`` as ``user`` through Salt's runner loader (one loader per test: loading it
    is most of a test's time); tenant acme has member alice."""
    runner = make_runners(tmp_path)
    virt = {"placement": {"mem_reserve_mib": 0}, "tenants": {"acme": {"members": ["alice"]}}}
    signedfleet.accept(runner.opts, tmp_path, HVS)["virt"].update(virt)
    # a roll is many publications in a row: signedfleet's 0.1 s before "down" made a loaded machine (load 40 on
    # 2 cores) take a host that answered for one that did not; a rebooting host's silence costs 1 s each
    runner.opts["virt"]["hypervisors"]["down_after"] = 1.0

    def run(tgt="hv*", user="root", **kwargs):
        new_job(runner)
        runner["virt.roll"].__globals__["__user__"] = user
        ret = runner["virt.roll"](tgt, **kwargs)
        return ret.get("data", ret)

    run.opts = runner.opts
    return run


def steps(ret, host):
    return [s["step"] for s in ret["hosts"][host]["steps"]]


def test_a_roll_empties_each_host_in_turn_and_brings_every_one_back(salt_run, fleet):
    before = fleet.uuids()
    ret = salt_run(state="upgrade", reboot=True)
    assert ret["stopped"] is None and ret["done"] == HVS and ret["untouched"] == [] and "retcode" not in ret, ret
    assert ret["left_in_maintenance"] == []
    for host in HVS:
        assert steps(ret, host) == ["maintenance", "evacuate", "states", "reboot", "maintenance_off"]
        moved = ret["hosts"][host]["steps"][1]["moved"]
        # each host's VMs went to hosts not in maintenance then
        assert host not in moved.values() and moved, moved
        assert ret["hosts"][host]["steps"][3]["boot_id"] == "new"
    assert fleet.reboots == HVS and [a[0] for a in fleet.applied] == HVS
    assert fleet.applied[0] == ("hv1", ["upgrade"], False)
    after = fleet.uuids()
    assert sorted(after) == sorted(before) and all(len(h) == 1 for h in after.values())
    assert ret["vms"] == {"running_before": 6, "running_after": 6, "not_running": [], "twice": {}}
    # no host runs a VM while it reboots: the last one rolled is empty, the others took their share back
    assert fleet.names("hv3") == []
    # the master's record followed the VMs: automatic HA does not see hv3's old VMs there while it reboots
    assert fleetstate.Store(salt_run.opts).fetch(recovery.HOSTS, "hv3")["vms"] == {}


def test_the_second_hosts_failed_state_stops_the_roll_there_with_the_vms_intact(salt_run, fleet):
    """Issue 38: the roll over three hosts with one failing state stops there with the VMs intact."""
    fleet.states["hv2"] = {"ret": FAILED_STATE, "retcode": 2}
    before = fleet.uuids()
    ret = salt_run(state="upgrade", reboot=True)
    assert ret.get("done") == ["hv1"] and ret["untouched"] == ["hv3"], ret
    assert ret["stopped"] == {
        "host": "hv2",
        "step": "states",
        "reason": "state(s) failed: upgrade",
        "failed": {"upgrade": "E: dpkg was interrupted"},
        "changed": [],
    }
    assert ret["left_in_maintenance"] == ["hv2"] and ret["retcode"] == 1  # salt-run exits 1
    assert ret["hosts"]["hv2"]["status"] == "stopped (left in maintenance)"
    assert steps(ret, "hv2") == ["maintenance", "evacuate"]
    assert fleet.reboots == ["hv1"]  # hv2 not rebooted, hv3 not touched at all
    assert [a[0] for a in fleet.applied] == ["hv1", "hv2"]
    assert fleet.names("hv2") == []  # its VMs left before the states ran, and stay where they went
    after = fleet.uuids()
    assert sorted(after) == sorted(before) and all(len(h) == 1 for h in after.values())
    assert ret["vms"]["not_running"] == [] and ret["vms"]["twice"] == {}


def test_test_true_changes_nothing_and_says_what_it_would_do(salt_run, fleet):
    before = {h: fleet.names(h) for h in HVS}
    ret = salt_run(state="upgrade", reboot=True, balance=True, test=True)
    assert ret["test"] is True and ret["stopped"] is None and ret["done"] == HVS, ret
    plan = ret["hosts"]["hv1"]["steps"][1]["plan"]
    assert sorted(plan) == ["hv1-vm0", "hv1-vm1"] and set(plan.values()) <= {"hv2", "hv3"}
    assert ret["hosts"]["hv1"]["steps"][3] == {
        "step": "reboot",
        "seconds": ret["hosts"]["hv1"]["steps"][3]["seconds"],
        "would_reboot": True,
    }
    assert all(a[2] is True for a in fleet.applied) and len(fleet.applied) == 3  # Salt's own dry run
    assert fleet.reboots == [] and {h: fleet.names(h) for h in HVS} == before
    assert ret["balance"]["applied"] is False
    assert [f for f, _t in fleet.published if f == "virt.migrate"] == []


def test_a_vm_that_arrives_during_the_roll_is_moved_off_before_the_reboot(salt_run, fleet):
    fleet.arrive["hv1"] = "late"
    ret = salt_run("hv1", state="upgrade", reboot=True)
    assert ret["stopped"] is None and ret["done"] == ["hv1"], ret
    assert fleet.names("hv1") == [] and fleet.reboots == ["hv1"]
    assert len([h for h, n in [(h, fleet.names(h)) for h in HVS] if "late" in n]) == 1


def test_a_host_that_does_not_come_back_stops_the_roll_and_says_what_was_seen(salt_run, fleet, monkeypatch):
    # hv1 never reboots: the same boot id every time, until the timeout
    monkeypatch.setattr(fleet, "rebooting", type("Never", (set,), {"update": lambda self, _t: None})())
    ret = salt_run(reboot=True, timeout=0.5)
    assert ret["stopped"]["host"] == "hv1" and ret["stopped"]["step"] == "reboot", ret
    assert ret["stopped"]["reason"] == (
        "not back within timeout=0.5 s; last seen: still the boot before the reboot (not rebooted yet)"
    )
    assert ret["untouched"] == ["hv2", "hv3"] and ret["left_in_maintenance"] == ["hv1"]


def test_a_rebooted_host_is_waited_for_until_it_says_ready(salt_run, fleet):
    """Issue 38: after the reboot, the minion, libvirtd, TLS and the events engine: the roll goes on only once the
    host's signed virt.host_ready says ready (here its engine beats from the third question on)."""
    fleet.ready["hv1"] = [ENGINE_LATE, ENGINE_LATE, READY]
    ret = salt_run(reboot=True)
    assert ret["stopped"] is None and ret["done"] == HVS, ret
    assert fleet.ready["hv1"] == [READY]  # asked three times
    assert [fun for fun, tgt in fleet.published if tgt == ["hv1"]].count("virt.host_ready") == 3


def test_a_host_that_never_gets_ready_stops_the_roll_and_says_which_part(salt_run, fleet):
    fleet.ready["hv1"] = [ENGINE_LATE]
    ret = salt_run(reboot=True, timeout=3)  # room for the one unanswered boot id question first
    assert (ret["stopped"]["host"], ret["stopped"]["step"]) == ("hv1", "reboot"), ret
    assert ret["stopped"]["reason"] == (
        "not back within timeout=3 s; last seen: booted again, but engine: the events engine has not beaten "
        "since this boot"
    )
    assert ret["untouched"] == ["hv2", "hv3"] and ret["left_in_maintenance"] == ["hv1"]


def test_a_host_with_an_older_salt_virt_is_ready_once_libvirtd_answers(salt_run, fleet):
    fleet.ready = {h: [NOT_AVAILABLE] for h in HVS}
    ret = salt_run(reboot=True)
    assert ret["stopped"] is None and ret["done"] == HVS, ret
    assert ("virt.capacity", ["hv1"]) in fleet.published


def test_an_evacuation_that_cannot_place_a_vm_stops_before_the_states(salt_run, fleet):
    fleet.add("hv1", "huge", mem=3500)  # no other host has 3500 MiB free
    ret = salt_run(state="upgrade")
    assert (ret["stopped"]["host"], ret["stopped"]["step"]) == ("hv1", "evacuate"), ret
    assert "huge" in ret["stopped"]["vms"] and fleet.applied == []
    assert "huge" in fleet.names("hv1") and ret["untouched"] == ["hv2", "hv3"]


def test_refusals_before_anything_is_done(salt_run, fleet):
    ret = salt_run(batch=3)
    assert ret["error"].startswith("batch=3 would put every answering hypervisor (3) in maintenance at once"), ret
    ret = salt_run("nothere")
    assert ret["error"] == "no hypervisor matches the target: nothing to roll"
    ret = salt_run(state=5)
    assert ret["error"].startswith("state must be an SLS name")
    ret = salt_run(user="alice")
    assert "virt.roll" in ret["error"] and "operators" in ret["error"], ret
    assert {f for f, _t in fleet.published} == {"virt.full_info"}  # only asked who is there
    fleet.silent.add("hv2")
    ret = salt_run()
    assert ret["error"].startswith("a roll starts with every host answering; not: hv2 (down: "), ret
    assert {f for f, _t in fleet.published} == {"virt.full_info"}


def test_a_host_another_roll_holds_is_not_taken(salt_run, fleet):
    with fleetstate.lock(salt_run.opts, [roll.LOCK + "hv1"], kind="virt.roll"):
        ret = salt_run("hv1")
    assert ret["stopped"]["step"] == "maintenance" and "held" in ret["stopped"]["reason"], ret
    assert fleet.names("hv1") == ["hv1-vm0", "hv1-vm1"]


def test_batch_two_keeps_both_hosts_of_a_batch_out_of_placement(salt_run, fleet):
    ret = salt_run("hv1,hv2", tgt_type="list", batch=2)
    assert ret["stopped"] is None, ret
    for host in ("hv1", "hv2"):
        assert set(ret["hosts"][host]["steps"][1]["moved"].values()) == {"hv3"}
    assert fleet.names("hv3") == sorted(f"{h}-vm{i}" for h in HVS for i in range(2))


def test_state_outcome_reads_salts_state_returns():
    assert roll.state_outcome({"ret": OK_STATE})["ok"] is True
    out = roll.state_outcome({"ret": FAILED_STATE})
    assert out["failed"] == {"upgrade": "E: dpkg was interrupted"} and not out["ok"]
    out = roll.state_outcome({"ret": ["Rendering SLS 'base:upgrade' failed: bad yaml"]})
    assert out["failed"] == {"render": "Rendering SLS 'base:upgrade' failed: bad yaml"}
    would = {"a": {"result": None, "comment": "would", "changes": {}, "__id__": "a"}}
    assert roll.state_outcome({"ret": would})["would_change"] == ["a"]


def test_options():
    assert roll.options("a, b", "True", "2", 60) == (["a", "b"], True, 2, 60.0)
    assert roll.options("highstate")[0] == roll.HIGHSTATE and roll.options()[0] is None
    with pytest.raises(Exception, match="batch"):
        roll.options(batch=0)
    assert placement.make_policy()["maintenance"] == []
