"""saltvirt.fleet.recovery: the plan (pure), the settings, fencing (a real command), the down checks."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import publish as fleet
from saltvirt.fleet import recovery
from saltvirt.fleet import recovery_guard as guard
from tests.support.testfleet import TestFleet, domain_xml, local_store


def rec(**vms):
    storage = {"/srv/shared": {"path": "/srv/shared/.salt-virt-storage", "token": "t0k"}}
    return {"recorded": 1000.0, "master": "m1", "storage": storage, "vms": vms}


def vm(state="running", mem=512, disks=None, uuid=None):
    disks = disks if disks is not None else [{"target": "vda", "path": "/srv/shared/x.qcow2", "root": "/srv/shared"}]
    return {"state": state, "mem": mem, "cpu": 1, "uuid": uuid, "xml": "<domain/>", "disks": disks}


def up(**vms):
    return {"status": "up", "host": {}, "vm_info": vms}


HOSTS = {"hv1": {"status": "down", "error": "no answer"}, "hv2": up(), "hv3": up()}


def test_plan_restarts_what_is_shared_biggest_first_and_says_why_not_for_the_rest():
    record = rec(
        small=vm(mem=256),
        big=vm(mem=2048),
        off=vm(state="shutoff", mem=4096),
        local=vm(disks=[{"target": "vda", "path": "/x", "why": "disk vda (/x) is outside virt:images"}]),
        pool=vm(disks=[{"target": "vda", "path": "/srv/other/x", "root": "/srv/other"}]),  # no marker recorded
        broken={"error": "domain vanished"},
    )
    out = recovery.plan(record, HOSTS, "hv1")
    assert out["restart"] == ["big", "small", "off"]  # running first, biggest first
    assert out["not_recoverable"]["local"] == "not on shared storage: disk vda (/x) is outside virt:images"
    assert out["not_recoverable"]["pool"] == "not on shared storage: disk vda: no storage marker"
    assert "could not be read when recorded (domain vanished)" in out["not_recoverable"]["broken"]


def test_plan_leaves_alone_what_runs_elsewhere_by_name_or_uuid():
    hosts = dict(HOSTS, hv2=up(web1={"state": "running"}), hv3=up(renamed={"state": "shutoff", "uuid": "u-2"}))
    out = recovery.plan(rec(web1=vm(), db1=vm(uuid="u-2")), hosts, "hv1")
    assert out["restart"] == []
    assert out["elsewhere"] == {
        "web1": "defined on hv2 (running) now: left alone",
        "db1": "defined on hv3 (shutoff) now: left alone",
    }


def test_plan_uses_the_peers_checks():
    checks = {"hv2": {"a": [], "b": ["disk vda: not shared"]}, "hv3": {"a": ["no"], "b": ["disk vda: missing"]}}
    out = recovery.plan(rec(a=vm(), b=vm()), HOSTS, "hv1", checks)
    assert out["restart"] == ["a"] and out["candidates"] == {"a": ["hv2"]}
    assert out["not_recoverable"]["b"] == (
        "no other hypervisor can run it: hv2: disk vda: not shared; hv3: disk vda: missing"
    )
    assert recovery.plan(rec(a=vm()), HOSTS, "hv1", {})["not_recoverable"]["a"] == "no other hypervisor answered"


def test_fence_refused_without_a_command_and_runs_the_operators_command(tmp_path):
    with pytest.raises(fleet.Failed, match="no fence command"):
        recovery.fence(recovery.fence_config({}), "hv1")
    script = tmp_path / "fence.sh"
    script.write_text(f'#!/bin/sh\necho "off: $1" ; echo "$1" > {tmp_path}/ran; exit ${{2:-0}}\n')
    script.chmod(0o755)
    cfg = recovery.fence_config({"fence": {"command": [str(script), "{host}"], "timeout": 5}})
    assert recovery.fence(cfg, "hv1") == {"command": [str(script), "hv1"], "rc": 0, "output": "off: hv1"}
    assert (tmp_path / "ran").read_text() == "hv1\n"
    cfg = recovery.fence_config({"fence": {"command": [str(script), "{host}", "3"]}})
    assert recovery.fence(cfg, "hv1")["rc"] == 3
    slow = recovery.fence_config({"fence": {"command": ["sleep", "5"], "timeout": 0.2}})
    assert recovery.fence(slow, "hv1")["rc"] is None


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"fence": "fence-host {host}"}, "must be a mapping"),
        ({"fence": {"command": "fence-host {host}"}}, "list of arguments"),
        ({"fence": {"command": []}}, "list of arguments"),
        ({"fence": {"command": ["x"], "timeout": 0}}, "above 0"),
        ({"fence": {"cmd": ["x"]}}, "unknown key"),
    ],
)
def test_fence_config_bad_input(conf, message):
    with pytest.raises(SaltInvocationError, match=message):
        recovery.fence_config(conf)


def test_recovery_config():
    assert recovery.recovery_config({})["probes"] == 2
    with pytest.raises(SaltInvocationError, match="must contain"):
        recovery.recovery_config({"recovery": {"probe_uri": "qemu+tls://hv1/system"}})
    with pytest.raises(SaltInvocationError, match="unknown key"):
        recovery.recovery_config({"recovery": {"probe": 1}})
    assert (
        recovery.probe_uri("qemu+unix:///system?socket=/x/{host}/sock", "hv1")
        == "qemu+unix:///system?socket=/x/hv1/sock"
    )


class Peers:
    """Stands in for :class:`saltvirt.fleet.publish.Fleet`: what the peers answered is data here; the real
    publication to real minions is tests/integration/test_recovery.py."""

    def __init__(self, answers):
        self.answers = answers

    def ret(self, minion, fun, *args, **kwargs):
        ans = self.answers[minion]
        if isinstance(ans, Exception):
            raise ans
        return ans


CFG = recovery.recovery_config({})


def test_verify_down_refuses_when_either_side_answers():
    for status in ("up", "error", "timeout"):
        hosts = dict(HOSTS, hv1={"status": status})
        with pytest.raises(fleet.Failed, match="refusing to recover hv1: its minion"):
            recovery.verify_down(Peers({}), "hv1", hosts, CFG)
    reached = Peers(
        {"hv2": {"uri": "u", "reachable": False}, "hv3": {"uri": "qemu+tls://hv1/system", "reachable": True}}
    )
    with pytest.raises(fleet.Failed, match="but its libvirtd does \\(reached from hv3 at qemu\\+tls://hv1/system\\)"):
        recovery.verify_down(reached, "hv1", HOSTS, CFG)
    unsure = Peers({"hv2": CommandExecutionError("down"), "hv3": {"uri": "u", "reachable": False, "down": "refused"}})
    with pytest.raises(fleet.Failed, match="hv2 could not check its libvirtd: down. Only 'connection refused'"):
        recovery.verify_down(unsure, "hv1", HOSTS, CFG)
    # a TLS error on the checking host proves nothing about hv1: it stops recovery, with the error
    tls = Peers(
        {
            "hv2": {"uri": "u", "reachable": False, "down": "refused"},
            "hv3": {"uri": "u", "reachable": None, "error": "Cannot read CA certificate '/etc/pki/CA/cacert.pem'"},
        }
    )
    with pytest.raises(fleet.Failed, match="hv3 could not check its libvirtd: Cannot read CA certificate"):
        recovery.verify_down(tls, "hv1", HOSTS, CFG)
    with pytest.raises(fleet.Failed, match="no other hypervisor answered"):
        recovery.verify_down(Peers({}), "hv1", {"hv1": HOSTS["hv1"]}, CFG)


def test_verify_down_both_ways():
    peers = Peers({"hv2": {"uri": "u", "reachable": False, "error": "refused"}, "hv3": {"reachable": False}})
    seen = recovery.verify_down(peers, "hv1", HOSTS, CFG)
    assert seen["minion"] == "down" and [p["from"] for p in seen["libvirt"]] == ["hv2", "hv3"]


class Fleet(Peers):
    """Also answers ``gather`` and publications (``publish.Fleet.run``): nothing to restart, so nothing else runs."""

    opts = {"id": "m1"}
    cfg = client = None

    def gather(self, fun):
        return HOSTS


def test_nothing_to_restart_is_not_fenced(tmp_path, monkeypatch):
    # the record and the peers' checks live in Salt's cache / come from minions: given as data here
    monkeypatch.setattr(recovery, "recall", lambda opts, host, store=None: rec(web1=vm()))
    monkeypatch.setattr(recovery, "check_peers", lambda *a: {"hv2": {"web1": ["no"]}, "hv3": {"web1": ["no"]}})
    peers = Fleet({"hv2": {"uri": "u", "reachable": False}, "hv3": {"uri": "u", "reachable": False}})
    out = recovery.recover(peers, "hv1", {}, store=object())
    assert out["fenced"] is None and out["recovered"] == {} and "was not fenced" in out["note"]
    assert "no other hypervisor can run it" in out["not_recoverable"]["web1"]


@pytest.fixture
def store(tmp_path):
    return local_store(tmp_path)


class Back(Fleet):
    """The host is back: hosts' facts and the undefine calls are data here (real ones: the integration test)."""

    def __init__(self, hosts):
        super().__init__({})
        self.hosts, self.undefined = hosts, []

    def gather(self, fun):
        return self.hosts

    def ret(self, minion, fun, *args, **kwargs):
        if fun == "virt.recovery_disarm":
            self.disarmed = (minion, args[0])
            return {n: n == "a" for n in args[0]}
        assert fun == "virt.undefine"
        self.undefined.append((minion, args[0]))
        return True


def test_reconcile_undefines_only_stale_stopped_copies(store):
    store.transact(
        recovery.RECOVERED,
        "hv1",
        lambda old: {
            "a": {"to": "hv2", "uuid": "u-a"},
            "b": {"to": "hv2", "uuid": "u-b"},
            "c": {"to": "hv3", "uuid": "u-c"},
            "d": {"to": "hv3", "uuid": "u-d"},
        },
    )
    hosts = {
        "hv1": up(
            a={"state": "shutoff", "uuid": "u-a"},
            b={"state": "running", "uuid": "u-b"},  # two copies running: never touched
            c={"state": "shutoff", "uuid": "u-c"},  # not defined elsewhere any more: the only copy
        ),  # d: already gone from hv1
        "hv2": up(a={"state": "running", "uuid": "u-a"}, b={"state": "running", "uuid": "u-b"}),
        "hv3": up(),
    }
    fleet_ = Back(hosts)
    out = recovery.reconcile(fleet_, "hv1", store)
    assert fleet_.undefined == [("hv1", "a")]
    assert fleet_.disarmed == ("hv1", ["a", "b", "c"]) and out["autostart_off"] == ["a"]  # first of all
    assert out["undefined"] == {"a": "undefined on hv1 (disks kept); it is on hv2 (running)"}
    assert out["conflicts"] == {"b": "running on hv1 AND defined on hv2 (running)"}
    assert "the only one, kept" in out["kept"]["c"]
    assert sorted(store.fetch(recovery.RECOVERED, "hv1")) == ["b", "c"]  # left for the next run
    with pytest.raises(fleet.Failed, match="reconcile it once it is back"):
        recovery.reconcile(Back(dict(hosts, hv1={"status": "down"})), "hv1", store)


# recover() end to end: three hypervisors on the test driver (tests/support/testfleet.py), real store ----------
WEB1 = "3f6ba1d4-1111-4c1b-9a40-0123456789ab"
TRUE = {"fence": {"command": ["true"], "timeout": 10}}  # the power switch: hv1's domains are stopped by hand


@pytest.fixture
def three(tmp_path, store):
    """hv1 ran web1 (disk on the shared directory) and was recorded; then it failed: its guest died
    with it (destroyed here) and its minion went silent."""
    hosts = TestFleet(tmp_path, opts=store.opts)
    disk = f"{hosts.shared}/web1.qcow2"
    open(disk, "wb").close()
    dom = hosts.conns["hv1"].defineXML(domain_xml("web1", disk, WEB1))
    dom.create()
    dom.setAutostart(1)
    assert recovery.refresh(hosts, store)["hv1"]["vms"] == ["web1"]
    dom.destroy()
    hosts.silent.add("hv1")
    yield hosts
    hosts.close()


class Stale(TestFleet):
    """A run whose snapshot (virt.full_info) was gathered before another run restarted the VM."""

    __test__ = False

    def __init__(self, live, snapshot):
        self.__dict__.update(live.__dict__)
        self.snapshot = snapshot

    def gather(self, fun):
        return self.snapshot


def test_overlapping_recovers_never_both_start_it(three, store):
    before = three.gather("virt.full_info")  # run B gathers here ...
    a = recovery.recover(three, "hv1", TRUE, store=store)  # ... run A restarts web1 meanwhile
    target = a["recovered"]["web1"]["host"]
    assert three.running("web1") == [target]
    b = recovery.recover(Stale(three, before), "hv1", TRUE, store=store)
    assert b["recovered"] == {} and f"is defined on {target} (running) now" in b["failed"]["web1"]["error"]
    assert three.running("web1") == [target]
    # the next layer on its own: B's last look cannot see that host (forced past its silence): the store refuses
    three.silent.add(target)
    rec = recovery.recall(store.opts, "hv1", store)
    pol = recovery.placement.make_policy()
    with pytest.raises(fleet.Failed, match="web1 was already recovered from hv1 to"):
        recovery.restart_one(three, rec, "web1", before, "hv1", pol, store, force=True)
    assert three.running("web1") == [target]  # libvirt on every host, the silent ones included


def test_a_silent_hypervisor_refuses_recovery_unless_forced(three, store, tmp_path):
    three.silent.add("hv3")
    with pytest.raises(fleet.Failed, match="refusing to recover hv1: hv3 did not answer, and may run hv1's VMs"):
        recovery.recover(three, "hv1", TRUE, store=store)
    assert three.running("web1") == []
    out = recovery.recover(three, "hv1", TRUE, store=store, force=True)
    assert out["recovered"]["web1"]["host"] == "hv2" and three.running("web1") == ["hv2"]


def test_a_probe_error_is_not_a_down_host(three, store, tmp_path):
    three.probe_uri = f"qemu+tls://hv1/system?pkipath={tmp_path}/no-pki"  # a TLS misconfiguration on the peers
    with pytest.raises(fleet.Failed, match="could not check its libvirtd: Cannot read CA certificate") as info:
        recovery.recover(three, "hv1", TRUE, store=store)
    assert all(p["reachable"] is None for p in info.value.details["down"]["libvirt"])
    assert three.running("web1") == []


class NoAnswer(TestFleet):
    """The target starts the VM, but its answer never reaches the master (link cut, minion killed)."""

    __test__ = False

    def __init__(self, live):
        self.__dict__.update(live.__dict__)

    def ret(self, minion, fun, *args, max_wait=None, **kwargs):
        ret = super().ret(minion, fun, *args, **kwargs)
        if fun == "virt.recovery_restart":
            raise fleet.Failed(f"{fun} on {minion}: no answer within 5 s", host=minion, status="timeout")
        return ret


def test_a_start_without_an_answer_is_never_tried_on_another_host(three, store):
    out = recovery.recover(NoAnswer(three), "hv1", TRUE, store=store)
    assert (
        out["recovered"] == {}
        and "web1 may be starting on hv2; not trying another host" in out["failed"]["web1"]["error"]
    )
    assert three.running("web1") == ["hv2"]  # once
    assert store.fetch(guard.VMS, "web1")["state"] == "recovering"
    again = recovery.recover(three, "hv1", TRUE, store=store, force=True)  # even forced: the last look sees it
    assert again["recovered"] == {} and "web1" in again["elsewhere"]
    assert three.running("web1") == ["hv2"]


def test_the_fenced_host_back_does_not_start_them_again(three, store):
    target = recovery.recover(three, "hv1", TRUE, store=store)["recovered"]["web1"]["host"]
    three.silent.discard("hv1")  # hv1 is back, with its stale definition (autostart on)
    assert three.conns["hv1"].lookupByName("web1").autostart() == 1
    out = recovery.reconcile(three, "hv1", store)
    assert out["autostart_off"] == ["web1"] and list(out["undefined"]) == ["web1"]
    assert [d.name() for d in three.conns["hv1"].listAllDomains(0)] == []
    assert three.running("web1") == [target]


def test_a_record_changed_in_the_shared_store_is_never_defined(three, store):
    """Issue 23 #7: write access to the shared store is not root on a hypervisor: a record this master did
    not sign (changed, or written by someone else) is refused before anything is defined."""
    old = recovery.recall(store.opts, "hv1", store)
    evil = dict(old)
    evil["vms"] = {
        n: dict(v, xml=v["xml"].replace("</devices>", "<hostdev/></devices>")) for n, v in old["vms"].items()
    }
    store.transact(recovery.HOSTS, "hv1", lambda _old: evil)
    with pytest.raises(fleet.Failed) as err:
        recovery.recover(three, "hv1", TRUE, store=store, force=True)
    assert str(err.value) == recovery.UNSIGNED_RECORD.format(host="hv1")
    unsigned = {k: v for k, v in old.items() if k != "mac"}
    store.transact(recovery.HOSTS, "hv1", lambda _old: unsigned)
    with pytest.raises(fleet.Failed, match="does not carry this master's MAC"):
        recovery.recover(three, "hv1", TRUE, store=store, force=True)
    assert three.running("web1") == [] and all(
        "web1" not in three.conns[h].listDefinedDomains() for h in ("hv2", "hv3")
    )


def test_only_the_selected_vms_are_restarted_and_the_others_alone_do_not_fence(three, store, tmp_path):
    """Automatic HA restarts a lost host's HA VMs only (recover(only=...)): VMs outside ``only`` are listed, not
    restarted, and a host with nothing selected to restart is not fenced."""
    fenced = tmp_path / "fenced"
    fence = {"fence": {"command": ["sh", "-c", f'echo "$0" >> {fenced}', "{host}"], "timeout": 10}}
    out = recovery.recover(three, "hv1", fence, store=store, only=["db9"])
    assert out["restart"] == [] and out["not_selected"] == ["web1"] and out["fenced"] is None
    assert not fenced.exists() and three.running("web1") == []
    out = recovery.recover(three, "hv1", fence, store=store, only=["web1"])
    assert out["not_selected"] == [] and list(out["recovered"]) == ["web1"]
    assert fenced.read_text().split() == ["hv1"]
