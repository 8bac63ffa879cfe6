"""saltvirt.fleet.ha: automatic HA's rounds over three hypervisors on libvirt's test driver
(tests/support/testfleet.py: the real hostrecord answers, the real shared store and host records), the master's
real connection view (Salt's CkMinions.connected_ids over real TCP connections to the publish port, one loopback
address per minion) and a real fence command. Each refusal path is its own test."""

import socket

import pytest
import salt.cache
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import fleetstate, ha, recovery
from saltvirt.fleet import recovery_guard as guard
from tests.support.testfleet import TestFleet, domain_xml, local_store

WEB1 = "3f6ba1d4-1111-4c1b-9a40-0123456789ab"
DB1 = "3f6ba1d4-2222-4c1b-9a40-0123456789ab"
LOST_AFTER = 30
T0 = 1_000_000.0


class Wire:
    """The master's publish port and the hypervisors' connections to it: each minion connects from its own
    loopback address (127.0.0.1x), the address its grains in the minion data cache list, as Salt's presence
    detection expects; :meth:`cut` closes one (the master's transport no longer sees it)."""

    def __init__(self, opts, ids):
        self.server = socket.create_server(("127.0.0.1", 0))
        opts["publish_port"] = self.server.getsockname()[1]
        cache = salt.cache.factory(opts)
        self.addr = {mid: f"127.0.0.{11 + i}" for i, mid in enumerate(sorted(ids))}
        for mid, addr in self.addr.items():
            cache.store("grains", mid, {"id": mid, "ipv4": [addr]})
        self.links = {}
        for mid in self.addr:
            self.connect(mid)

    def connect(self, mid):
        client = socket.socket()
        client.bind((self.addr[mid], 0))
        client.connect(self.server.getsockname())
        accepted, _peer = self.server.accept()
        self.links[mid] = (client, accepted)

    def cut(self, mid):
        for sock in self.links.pop(mid):
            sock.close()

    def close(self):
        for mid in list(self.links):
            self.cut(mid)
        self.server.close()


@pytest.fixture
def fence_log(tmp_path):
    """A real fence command: it writes the host it was given to ``fenced`` and exits 0."""
    script = tmp_path / "fence.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path}/fenced\n')
    script.chmod(0o755)
    return script, tmp_path / "fenced"


@pytest.fixture
def cluster(tmp_path, fence_log):
    """hv1 runs web1 (HA: virt:ha:vms) and db1 (not HA), both on the shared directory, and was recorded; every
    hypervisor answers and is connected. :meth:`Cluster.fail` makes hv1 fail."""
    store = local_store(tmp_path)
    opts = store.opts
    opts["virt"] = {
        "fence": {"command": [str(fence_log[0]), "{host}"], "timeout": 10},
        "ha": {"enabled": True, "vms": ["web*"], "lost_after": LOST_AFTER},
    }
    hosts = TestFleet(tmp_path, opts=opts)
    for name, uuid in (("web1", WEB1), ("db1", DB1)):
        disk = f"{hosts.shared}/{name}.qcow2"
        open(disk, "wb").close()
        hosts.conns["hv1"].defineXML(domain_xml(name, disk, uuid)).create()
    assert recovery.refresh(hosts, store)["hv1"]["vms"] == ["db1", "web1"]
    wire = Wire(opts, hosts.conns)
    yield Cluster(hosts, store, wire, fence_log[1])
    wire.close()
    hosts.close()


class Cluster:
    def __init__(self, hosts, store, wire, fenced):
        self.hosts, self.store, self.wire, self.fenced_file = hosts, store, wire, fenced
        self.opts = store.opts
        self.events = []

    def fail(self, host="hv1", answers=False, linked=False):
        """``host`` fails: its guests die with it; its minion stops answering (unless ``answers``) and its
        connection to the master goes (unless ``linked``)."""
        for dom in self.hosts.conns[host].listAllDomains(1):  # active ones
            dom.destroy()
        if not answers:
            self.hosts.silent.add(host)
        if not linked:
            self.wire.cut(host)

    def round(self, at, opts=None):
        return ha.run_round(
            opts or self.opts, remote=self.hosts, now=at, fire=lambda tag, data: self.events.append((tag, data))
        )

    def fenced(self):
        return self.fenced_file.read_text().split() if self.fenced_file.exists() else []

    def kinds(self, answer):
        return [(d["host"], d["decision"]) for d in answer.get("decisions") or []]


def test_a_host_lost_both_ways_for_lost_after_is_fenced_and_only_its_ha_vms_restarted(cluster):
    assert cluster.round(T0) == {"enabled": True, "ran": True, "decisions": []}  # all well: nothing logged
    cluster.fail()
    first = cluster.round(T0 + 1)
    assert cluster.kinds(first) == [("hv1", ha.LOST)]
    assert "acts at" in first["decisions"][0]["reason"]
    assert cluster.kinds(cluster.round(T0 + LOST_AFTER)) == []  # not yet: lost for 29 s
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []
    done = cluster.round(T0 + 1 + LOST_AFTER)
    assert cluster.kinds(done) == [("hv1", ha.RECOVERED)]
    decision = done["decisions"][0]
    target = decision["recovered"]["web1"]
    assert cluster.fenced() == ["hv1"]
    assert cluster.hosts.running("web1") == [target] and target != "hv1"
    assert cluster.hosts.running("db1") == []  # not HA: left alone
    assert decision["not_ha"] == ["db1"] and decision["vms"] == {"web1": "virt:ha:vms lists web*"}
    assert f"web1 on {target}" in decision["reason"]
    assert [tag for tag, _data in cluster.events] == ["salt/virt/ha/lost", "salt/virt/ha/recovered"]
    assert [d["decision"] for d in ha.JOURNAL.history(cluster.store)] == [ha.LOST, ha.RECOVERED]
    # never twice: the host stays handled while it is lost
    assert cluster.kinds(cluster.round(T0 + 100 * LOST_AFTER)) == []
    assert cluster.fenced() == ["hv1"] and cluster.hosts.running("web1") == [target]


def test_an_acting_round_waits_once_and_briefly_on_the_lost_host(cluster):
    """The bound (docs/topics/recovery.md): an acting round gathers once, with virt:ha:down_after (shorter than
    the runner's down_after), and the recovery plans from that gather and never asks the fenced host again."""
    cluster.fail()
    cluster.round(T0)
    cluster.hosts.calls.clear()
    cluster.hosts.gathers.clear()
    done = cluster.round(T0 + LOST_AFTER)
    assert cluster.kinds(done) == [("hv1", ha.RECOVERED)]
    assert cluster.hosts.gathers == [ha.DEFAULTS["down_after"]]  # the round's own, not recover's second one
    assert [c for c in cluster.hosts.calls if c[0] == "hv1"] == []  # silent and fenced: never waited on again


def test_a_silent_minion_still_connected_is_not_lost(cluster):
    cluster.fail(linked=True)
    answers = [cluster.round(T0 + t) for t in (0, LOST_AFTER, 10 * LOST_AFTER)]
    assert [cluster.kinds(a) for a in answers] == [[("hv1", ha.ONE_SIGNAL)], [], []]  # logged once
    assert "its connection to the master is still up" in answers[0]["decisions"][0]["reason"]
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []


def test_a_host_that_answers_without_a_connection_is_not_lost(cluster):
    cluster.fail(answers=True)
    answers = [cluster.round(T0 + t) for t in (0, LOST_AFTER, 10 * LOST_AFTER)]
    assert cluster.kinds(answers[0]) == [("hv1", ha.ONE_SIGNAL)]
    assert "the master sees no connection from it" in answers[0]["decisions"][0]["reason"]
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []


def test_one_round_that_sees_the_host_starts_the_count_anew(cluster):
    cluster.fail()
    cluster.round(T0)
    cluster.wire.connect("hv1")  # its connection is back for one round
    assert cluster.kinds(cluster.round(T0 + 20)) == [("hv1", ha.ONE_SIGNAL)]
    cluster.wire.cut("hv1")
    assert cluster.kinds(cluster.round(T0 + LOST_AFTER + 1)) == [("hv1", ha.LOST)]  # lost since now, not T0
    assert cluster.fenced() == []
    assert cluster.kinds(cluster.round(T0 + 2 * LOST_AFTER + 1)) == [("hv1", ha.RECOVERED)]


def test_without_the_minion_data_cache_the_master_cannot_tell_connections(cluster):
    cluster.opts["minion_data_cache"] = False
    cluster.fail()
    assert cluster.kinds(cluster.round(T0)) == [("hv1", ha.ONE_SIGNAL)]
    assert cluster.kinds(cluster.round(T0 + 10 * LOST_AFTER)) == []
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []


def test_manual_fencing_only_alerts(cluster):
    cluster.opts["virt"]["ha"]["fence"] = "manual"
    cluster.fail()
    cluster.round(T0)
    alert = cluster.round(T0 + LOST_AFTER)
    assert cluster.kinds(alert) == [("hv1", ha.ALERT)]
    assert "salt-run virt.recover hv1" in alert["decisions"][0]["reason"]
    assert alert["decisions"][0]["vms"] == {"web1": "virt:ha:vms lists web*"}
    assert cluster.events[-1][0] == "salt/virt/ha/alert"
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []
    assert cluster.kinds(cluster.round(T0 + 10 * LOST_AFTER)) == []  # alerted once


def test_a_host_without_ha_vms_is_neither_fenced_nor_recovered(cluster):
    cluster.opts["virt"]["ha"]["vms"] = ["other*"]
    cluster.fail()
    cluster.round(T0)
    out = cluster.round(T0 + LOST_AFTER)
    assert cluster.kinds(out) == [("hv1", ha.NO_HA_VMS)]
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == cluster.hosts.running("db1") == []


def test_a_second_masters_round_while_the_first_holds_the_lock_does_nothing(cluster):
    cluster.fail()
    cluster.round(T0)
    other = dict(cluster.opts, id="m2")  # another master on the same shared store, in its round
    lease = fleetstate.Lease(fleetstate.Store(other), other, "virt.ha", [ha.ROUND_LOCK]).acquire()
    try:
        out = cluster.round(T0 + LOST_AFTER)
    finally:
        lease.release()
    assert out["ran"] is False and "another HA round is at work" in out["reason"]
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []
    assert cluster.kinds(cluster.round(T0 + LOST_AFTER)) == [("hv1", ha.RECOVERED)]  # once it is free


def test_a_recovery_at_work_stops_the_round(cluster):
    cluster.fail()
    cluster.round(T0)
    with fleetstate.lock(cluster.opts, ["web1"], kind="virt.recover", store=cluster.store):  # salt-run virt.recover
        out = cluster.round(T0 + LOST_AFTER)
    assert out["ran"] is False and "a recovery holds web1" in out["reason"]
    cluster.store.transact(guard.VMS, "web1", lambda _old: {"state": "recovering", "from": "hv1", "to": "hv2"})
    out = cluster.round(T0 + LOST_AFTER)
    assert out["ran"] is False and "did not settle" in out["reason"]
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []


def test_a_refused_recovery_restarts_nothing_and_is_tried_again_later(cluster):
    cluster.hosts.probe_uri = "test:///default"  # the peers reach "its libvirtd": it may still run its VMs
    cluster.fail()
    cluster.round(T0)
    out = cluster.round(T0 + LOST_AFTER)
    assert cluster.kinds(out) == [("hv1", ha.REFUSED)]
    assert "but its libvirtd does" in out["decisions"][0]["reason"]
    assert cluster.fenced() == [] and cluster.hosts.running("web1") == []
    assert cluster.kinds(cluster.round(T0 + LOST_AFTER + 1)) == []  # not every round
    cluster.hosts.probe_uri = None
    assert cluster.kinds(cluster.round(T0 + 2 * LOST_AFTER)) == [("hv1", ha.RECOVERED)]


def test_a_host_that_comes_back_starts_nothing(cluster):
    cluster.fail()
    cluster.round(T0)
    target = cluster.round(T0 + LOST_AFTER)["decisions"][0]["recovered"]["web1"]
    cluster.hosts.silent.discard("hv1")
    cluster.wire.connect("hv1")
    back = cluster.round(T0 + 2 * LOST_AFTER)
    assert cluster.kinds(back) == [("hv1", ha.BACK)]
    assert "run salt-run virt.reconcile hv1" in back["decisions"][0]["reason"]
    assert cluster.hosts.running("web1") == [target] and cluster.hosts.running("db1") == []
    assert cluster.fenced() == ["hv1"]
    assert cluster.kinds(cluster.round(T0 + 3 * LOST_AFTER)) == []


def test_off_by_default(cluster):
    cluster.opts["virt"]["ha"]["enabled"] = False
    cluster.fail()
    assert cluster.round(T0) == {"enabled": False, "ran": False, "reason": ha.DISABLED}


# which VMs are HA, and the settings (pure) ----------------------------------------------------------------------
def record(**vms):
    return {"vms": vms}


def test_selected_by_name_and_by_group_a_tenants_only_if_the_operator_allows_it():
    cfg = ha.config({"fence": {"command": ["x"]}, "ha": {"vms": ["db*"], "groups": ["web"]}})
    rec = record(
        db1={"group": None, "owner": {"tenant": "t1"}},  # the operator named it: HA whoever owns it
        web1={"group": "web", "owner": None},  # the operator's VM in an HA group
        web2={"group": "web", "owner": {"tenant": "t1", "creator": "u"}},  # a tenant chose the group
        web3={"group": "web"},  # recorded by an older salt-virt: the owner is unknown
        app1={"group": "app", "owner": None},
    )
    assert ha.selected(rec, cfg) == {"db1": "virt:ha:vms lists db*", "web1": "its group web is in virt:ha:groups"}
    allowed = dict(cfg, tenant_groups=True)
    assert sorted(ha.selected(rec, allowed)) == ["db1", "web1", "web2", "web3"]


def test_selected_by_the_vms_own_flag_a_tenants_only_if_the_operator_allows_it():
    """``ha: True`` in the record (virt.init/virt.update ha=True): the operator's VMs always count; a tenant's
    only with virt:ha:tenant_flag (its restarts take capacity the operator keeps), as a tenant's group."""
    cfg = ha.config({"fence": {"command": ["x"]}, "ha": {"groups": ["web"]}})
    assert cfg["tenant_flag"] is False
    rec = record(
        ops1={"ha": True, "owner": None},  # made on the hypervisor by an operator: no owner recorded
        ops2={"ha": True, "owner": {"tenant": None, "creator": "root"}},  # salt-run virt.init by an operator
        web1={"group": "web", "owner": {"tenant": None, "creator": "root"}},  # the operator's, in an HA group
        t1vm={"ha": True, "owner": {"tenant": "t1", "creator": "u"}},  # a tenant flagged it
        old1={"ha": True},  # recorded by an older salt-virt (no owner): counts as a tenant's
        off1={"ha": False, "owner": None},
        none1={"owner": None},  # recorded before the flag existed
    )
    flagged = "its record says ha: True"
    assert ha.selected(rec, cfg) == {"ops1": flagged, "ops2": flagged, "web1": "its group web is in virt:ha:groups"}
    allowed = ha.config({"fence": {"command": ["x"]}, "ha": {"groups": ["web"], "tenant_flag": "yes"}})
    assert allowed["tenant_flag"] is True
    assert ha.selected(rec, allowed) == {
        "ops1": flagged,
        "ops2": flagged,
        "web1": "its group web is in virt:ha:groups",
        "t1vm": flagged,
        "old1": flagged,
    }
    assert ha.tenant_flag({}) is False and ha.tenant_flag({"ha": {"tenant_flag": True, "enabled": True}}) is True
    # an operator flagging a tenant's VM is told when the flag will not count (salt-run virt.init's warnings)
    assert "virt:ha:tenant_flag: True" in ha.flag_ignored({}, "t1", "t1vm", "yes")
    assert ha.flag_ignored({"ha": {"tenant_flag": True}}, "t1", "t1vm", True) is None
    assert ha.flag_ignored({}, None, "ops1", True) is ha.flag_ignored({}, "t1", "t1vm", False) is None


@pytest.mark.parametrize("tenant_flag", [False, True])
def test_a_round_restarts_the_vms_their_records_flag(cluster, tenant_flag):
    """No virt:ha:vms or groups: the flag virt.init/virt.update wrote into <metadata> reaches HA through the host
    record (salt-run virt.record) that the round reads once the host is dead."""
    from saltvirt.xml.domain.metadata import METADATA_NS

    cluster.opts["virt"]["ha"].update(vms=[], tenant_flag=tenant_flag)
    conn = cluster.hosts.conns["hv1"]
    for name, uuid, owner in (("web1", WEB1, "<sv:owner creator='root'/>"), ("db1", DB1, "<sv:owner tenant='t1'/>")):
        meta = f"<metadata><sv:vm xmlns:sv='{METADATA_NS}'>{owner}<sv:ha>true</sv:ha></sv:vm></metadata>"
        conn.defineXML(domain_xml(name, f"{cluster.hosts.shared}/{name}.qcow2", uuid).replace("<os>", meta + "<os>"))
    recovery.refresh(cluster.hosts, cluster.store)
    cluster.fail()
    cluster.round(T0)
    done = cluster.round(T0 + LOST_AFTER)["decisions"][0]
    assert done["decision"] == ha.RECOVERED
    want = {"web1": "its record says ha: True", **({"db1": "its record says ha: True"} if tenant_flag else {})}
    assert done["vms"] == want
    assert sorted(done["recovered"]) == sorted(want)
    assert cluster.hosts.running("db1") == ([done["recovered"]["db1"]] if tenant_flag else [])


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"ha": "on"}, "must be a mapping"),
        ({"ha": {"enable": True}}, "unknown key"),
        ({"ha": {"fence": "stonith"}}, "must be one of command, manual"),
        ({"ha": {"lost_after": 0}}, "above 0"),
        ({"ha": {"down_after": "soon"}}, "virt:ha:down_after"),
        ({"ha": {"groups": "web"}, "fence": {"command": ["x"]}}, None),  # one name is a list of one
        ({"ha": {"vms": [""]}}, "list of names"),
        ({"ha": {"enabled": True}}, "needs virt:fence:command"),
    ],
)
def test_config_bad_input(conf, message):
    if message is None:
        assert ha.config(conf)["groups"] == ["web"]
        return
    with pytest.raises(SaltInvocationError, match=message):
        ha.config(conf)


def test_config_defaults_and_manual_fencing_without_a_command():
    assert ha.config({}) == dict(ha.DEFAULTS, lost_after=60.0)
    assert ha.config({"ha": {"enabled": "yes", "fence": "manual"}})["enabled"] is True


def test_a_lost_host_drops_out_of_salts_resource_registry_and_only_once_both_signals_say_lost(cluster):
    """A lost host's VMs leave ``T@virt_vm`` targets (saltvirt.fleet.resourcereg); a host only silent, or only
    disconnected, keeps them."""
    import salt.utils.resource_registry as registry

    registry.reset_registry()
    reg = registry.get_registry(cluster.opts)
    reg.register_minion("hv1", {"virt_vm": [WEB1, DB1]})
    reg.register_minion("hv2", {"virt_vm": ["3f6ba1d4-3333-4c1b-9a40-0123456789ab"]})
    try:
        cluster.fail(linked=True)  # silent, still connected: not lost
        cluster.round(T0)
        assert sorted(reg.get_resources_for_minion("hv1")["virt_vm"]) == sorted([WEB1, DB1])
        cluster.wire.cut("hv1")
        assert cluster.kinds(cluster.round(T0 + 1)) == [("hv1", ha.LOST)]
        assert reg.get_resources_for_minion("hv1") == {}
        assert list(reg.get_resources_for_minion("hv2")) == ["virt_vm"]
    finally:
        registry.reset_registry()
