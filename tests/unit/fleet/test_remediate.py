"""saltvirt.fleet.remediate: each kind and each guard through the master's real signed transport (hypervisors hv1
and hv2 that sign their answers with their own keys, tests/support/signedfleet.py), each answering with the real
host-layer code on its own libvirt test:/// node (web1 runs on hv1), the real shared store (localfs) and Salt's
real reactor renderer for salt-virt.remediate.sls. A hint the test gives ``remediate`` is what a tenant's forged
event would give it: the test driver's VM state is the truth. Real daemons (a QEMU killed, the reactor, a tenant
minion's forgery): tests/integration/test_events.py."""

import libvirt
import pytest
import salt.config
import salt.utils.reactor

from saltvirt.fleet import fleetstate, remediate
from saltvirt.host import hostrecord, lifecycle, query
from tests.support import signedfleet
from tests.support.fleetfacts import MIGRATION_STEPS
from tests.support.paths import ROOT, TEST_NODE_XML
from tests.support.testfleet import domain_xml

HVS = ["hv1", "hv2"]
WEB1 = "3f6ba1d4-1111-4c1b-9a40-0123456789ab"
T0 = 1_800_000_000.0


class Lab:
    """hv1 and hv2 on private test:/// nodes, web1 running on hv1. ``agent``: the guest agent state a VM's guest
    shows (the test driver has no agent); ``reason``: a state reason the test driver cannot make (a disk error's
    pause), laid over its real answer. ``resets``: what ``virt.reset`` reached."""

    def __init__(self, tmp_path, balance=None, **remediate_conf):
        self.conns = {h: libvirt.open(f"test://{TEST_NODE_XML}") for h in HVS}
        virt = {"remediate": remediate_conf, "placement": {"mem_reserve_mib": 0}}
        if balance is not None:
            virt["balance"] = balance
        self.opts = signedfleet.fleet_opts(tmp_path, HVS, **virt)
        self.agent, self.reason, self.resets = {}, {}, []
        self.client = signedfleet.SigningClient(self._answers())
        self.fired, self.slept = [], []
        disk = tmp_path / "web1.qcow2"
        disk.touch()
        self.conns["hv1"].defineXML(domain_xml("web1", disk, WEB1)).create()

    def close(self):
        for conn in self.conns.values():
            conn.close()

    def _answers(self):
        def on(fun):
            def answer_for(host):
                return lambda *args, tenant=None, **kwargs: fun(host, self.conns[host], *args, **kwargs)

            return {h: answer_for(h) for h in HVS}

        def condition(host, conn, name):
            cond = query.condition(conn, name)
            if name in self.agent:
                cond["guest_agent"] = self.agent[name]
            return {**cond, **self.reason.get(name, {})}

        def reset(host, conn, name):
            self.resets.append((host, name))
            return bool(lifecycle.reset(conn, name))

        def migrate(host, conn, name, *_args, **_kwargs):  # libvirt's offline migration: the definition moves
            target = self.conns[next(h for h in HVS if h != host)]
            dom = conn.lookupByName(name)
            target.defineXML(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
            dom.undefine()
            return dict(MIGRATION_STEPS["virt.migrate"], live=False)

        return {
            "virt.vm_condition": on(condition),
            "virt.start": on(lambda _h, conn, name: bool(lifecycle.start(conn, name))),
            "virt.reset": on(reset),
            "virt.recovery_where": on(lambda _h, conn, name, uuid=None: hostrecord.where(conn, name, uuid)),
            "virt.full_info": on(lambda _h, conn: query.full_info(conn, agent_timeout=0.1)),
            "virt.migrate_source_info": on(lambda _h, _c, _name: {"active": False, "probes": {}}),
            "virt.migrate_prepare": on(lambda _h, _c, *_a, **_k: MIGRATION_STEPS["virt.migrate_prepare"]),
            "virt.migrate": on(migrate),
            "virt.migrate_finish": on(lambda h, _c, _n: dict(MIGRATION_STEPS["virt.migrate_finish"], host=h)),
        }

    def run(self, kind, host="hv1", name="web1", uuid=WEB1, at=T0):
        return remediate.remediate(
            self.opts, kind, host, name, uuid, client=self.client, now=at, fire=self.on_fire, sleep=self.slept.append
        )

    def on_fire(self, tag, data):
        self.fired.append((tag, data["decision"]))

    def crash(self, host="hv1", name="web1"):
        self.conns[host].lookupByName(name).coreDump("/dev/null", libvirt.VIR_DUMP_CRASH)  # shut off, reason crashed

    def state(self, host="hv1", name="web1"):
        """web1's state by libvirt on ``host`` (None: not defined there)."""
        try:
            return query.condition(self.conns[host], name)["state"]
        except Exception:  # noqa: BLE001 - not defined there
            return None

    def published(self, fun):
        return [tgt for f, tgt in self.client.published if f == fun]

    def log(self):
        return [(e["kind"], e["decision"]) for e in remediate.JOURNAL.history(fleetstate.Store(self.opts))]


@pytest.fixture
def lab(tmp_path):
    made = []

    def make(**conf):
        made.append(Lab(tmp_path, **conf))
        return made[-1]

    yield make
    for one in made:
        one.close()


CRASH_ON = {"crashed": {"enabled": True, "max_restarts": 3}}


# the switches ---------------------------------------------------------------------------------------------------
def test_every_kind_is_off_by_default_and_asks_nothing(lab):
    hosts = lab()
    hosts.crash()
    for kind in remediate.KINDS:
        out = hosts.run(kind)
        assert (out["acted"], out["decision"]) == (False, remediate.OFF)
        assert f"virt:remediate:{kind}:enabled: True" in out["reason"]
    assert hosts.client.published == [] and hosts.fired == [] and hosts.log() == []
    assert hosts.state() == "shutoff"


def test_one_kinds_switch_does_not_turn_on_another(lab):
    hosts = lab(**CRASH_ON)
    assert hosts.run("io_error")["decision"] == remediate.OFF
    assert hosts.run("agent")["decision"] == remediate.OFF
    assert hosts.client.published == []


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"crash": {}}, "^virt:remediate: unknown kind"),
        ({"crashed": {"enabled": True, "retries": 3}}, "^virt:remediate:crashed: unknown key"),
        ({"crashed": {"backoff": "soon"}}, "^virt:remediate:crashed:backoff must be a number of seconds"),
        ({"agent": {"max_resets": 0}}, "^virt:remediate:agent:max_resets"),
        ({"beacon": ["enabled"]}, "^virt:remediate:beacon must be a mapping"),
    ],
)
def test_a_bad_config_says_what_to_fix(conf, message):
    with pytest.raises(remediate.SaltInvocationError, match=message):
        remediate.config({"remediate": conf})


# crashed: restart with backoff, then give up or move -----------------------------------------------------------------
def test_a_crashed_vm_restarts_with_doubling_backoff_then_is_left_stopped(lab):
    hosts = lab(**CRASH_ON)
    for n, delay in enumerate((30, 60, 120)):
        hosts.crash()
        out = hosts.run("crashed", at=T0 + n)
        assert (out["acted"], out["decision"], out["delay"]) == (True, remediate.RESTARTED, delay)
        assert f"restart {n + 1} of 3" in out["reason"]
        assert hosts.state() == "running"  # libvirt: started again on hv1
    assert hosts.slept == [30, 60, 120]
    hosts.crash()
    out = hosts.run("crashed", at=T0 + 3)
    assert out["decision"] == remediate.GAVE_UP and "left stopped" in out["reason"]
    assert hosts.state() == "shutoff" and hosts.slept == [30, 60, 120]
    assert hosts.published("virt.start") == [["hv1"]] * 3
    assert hosts.log() == [("crashed", remediate.RESTARTED)] * 3 + [("crashed", remediate.GAVE_UP)]
    assert hosts.fired == [("salt/virt/remediate/crashed", d) for _k, d in hosts.log()]
    # once the window passed, the count starts again
    assert hosts.run("crashed", at=T0 + 3 + 3600)["decision"] == remediate.RESTARTED
    assert hosts.slept[-1] == 30


def test_a_forged_crash_of_a_running_or_stopped_vm_changes_nothing(lab):
    hosts = lab(**CRASH_ON)
    out = hosts.run("crashed")  # web1 runs: the event lies
    assert (out["acted"], out["decision"]) == (False, remediate.NOTHING)
    assert "running (booted), not crashed" in out["reason"]
    hosts.conns["hv1"].lookupByName("web1").destroy()  # the operator's power-off: shut off, destroyed
    assert hosts.run("crashed")["decision"] == remediate.NOTHING
    assert hosts.state() == "shutoff" and hosts.published("virt.start") == [] and hosts.slept == []
    assert hosts.log() == [] and hosts.fired == []  # a forger cannot push real entries out of the log


def test_a_vm_started_during_the_backoff_is_not_started_again(lab):
    hosts = lab(**CRASH_ON)
    hosts.crash()
    hosts.slept = type("Wait", (list,), {"append": lambda self, s: hosts.conns["hv1"].lookupByName("web1").create()})()
    out = hosts.run("crashed")
    assert out["decision"] == remediate.NOTHING and "after the backoff" in out["reason"]
    assert hosts.published("virt.start") == []


def test_a_crashed_copy_is_not_restarted_while_the_vm_is_defined_elsewhere(lab, tmp_path):
    """HA recovered web1 on hv2 (same UUID, running there) and hv1's stale copy reports a crash: starting it would
    run the VM twice. Every other hypervisor is asked first (virt.recovery_where, as virt.recover's last look)."""
    hosts = lab(**CRASH_ON)
    hosts.crash()
    hosts.conns["hv2"].defineXML(domain_xml("web1", tmp_path / "web1.qcow2", WEB1)).create()
    out = hosts.run("crashed")
    assert out["decision"] == remediate.GAVE_UP and "(UUID 3f6ba1d4-1111-" in out["reason"], out
    assert "is defined on hv2 (running)" in out["reason"] and "left stopped on hv1" in out["reason"]
    assert hosts.state("hv1") == "shutoff" and hosts.published("virt.start") == []


def test_a_crashed_vm_is_not_restarted_while_another_hypervisor_is_silent(lab):
    """hv2 does not answer: it may run web1 (migrated there since), so hv1's crashed copy stays stopped."""
    hosts = lab(**CRASH_ON)
    hosts.crash()
    del hosts.client.answers["virt.recovery_where"]["hv2"]
    out = hosts.run("crashed")
    assert out["decision"] == remediate.GAVE_UP and "hv2 (down: " in out["reason"], out
    assert hosts.state("hv1") == "shutoff" and hosts.published("virt.start") == []


def test_a_crashed_vm_another_call_holds_is_left_to_it(lab):
    """A virt.migrate or virt.recover of web1 holds its lock: the restart waits for nothing and starts nothing."""
    hosts = lab(**CRASH_ON)
    hosts.crash()
    with fleetstate.lock(hosts.opts, ["web1"], kind="virt.migrate", store=fleetstate.Store(hosts.opts)):
        out = hosts.run("crashed")
    assert out["decision"] == remediate.BUSY and "virt.migrate" in out["reason"], out
    assert hosts.state("hv1") == "shutoff" and hosts.published("virt.start") == []


def test_hints_that_do_not_hold_are_refused(lab):
    hosts = lab(**CRASH_ON)
    hosts.crash()
    with pytest.raises(remediate.Refused, match="^tenant1 is not one of the hypervisors"):
        hosts.run("crashed", host="tenant1")  # a tenant's minion naming itself
    assert hosts.client.published == []
    with pytest.raises(remediate.Refused, match="^hv2 did not confirm VM web1's condition .*not defined"):
        hosts.run("crashed", host="hv2")  # web1 is not there
    with pytest.raises(remediate.Refused, match="has UUID 3f6ba1d4-1111-.*not the event's 00000000-"):
        hosts.run("crashed", uuid="00000000-0000-4000-8000-000000000000")
    with pytest.raises(remediate.SaltInvocationError, match="name"):
        hosts.run("crashed", name="../web1")
    assert hosts.state() == "shutoff" and hosts.published("virt.start") == [] and hosts.log() == []


def test_a_panicked_vm_its_operator_preserves_is_left_for_inspection(lab):
    hosts = lab(**CRASH_ON)
    hosts.reason["web1"] = {"state": "crashed", "reason": "panicked"}  # on_crash=preserve: QEMU keeps it
    out = hosts.run("crashed")
    assert out["decision"] == remediate.GAVE_UP and "left for inspection" in out["reason"]
    assert hosts.published("virt.start") == [] and hosts.slept == []


def test_one_remediation_of_a_vm_at_a_time(lab):
    hosts = lab(**CRASH_ON)
    hosts.crash()
    store = fleetstate.Store(hosts.opts)
    with fleetstate.lock(hosts.opts, ["virt.remediate:web1"], kind="virt.remediate", store=store):
        out = hosts.run("crashed")
    assert out["decision"] == remediate.BUSY and hosts.client.published == []


def test_after_its_restarts_a_crashed_vm_moves_once_per_window(lab):
    hosts = lab(crashed={"enabled": True, "max_restarts": 1, "move": True})
    hosts.crash()
    assert hosts.run("crashed")["decision"] == remediate.RESTARTED
    hosts.crash()
    out = hosts.run("crashed", at=T0 + 1)
    assert (out["decision"], out["to"]) == (remediate.MOVED, "hv2"), out
    assert (hosts.state("hv1"), hosts.state("hv2")) == (None, "running")  # libvirt: moved, started there
    hosts.crash("hv2")
    assert hosts.run("crashed", host="hv2", at=T0 + 2)["decision"] == remediate.RESTARTED  # a new count there
    hosts.crash("hv2")
    out = hosts.run("crashed", host="hv2", at=T0 + 3)
    assert out["decision"] == remediate.GAVE_UP and "moved within" in out["reason"]
    assert (hosts.state("hv1"), hosts.state("hv2")) == (None, "shutoff")


def test_without_move_the_limit_alerts_and_moves_nothing(lab):
    hosts = lab(crashed={"enabled": True, "max_restarts": 1})
    hosts.crash()
    hosts.run("crashed")
    hosts.crash()
    assert hosts.run("crashed", at=T0 + 1)["decision"] == remediate.GAVE_UP
    assert hosts.published("virt.migrate") == [] and hosts.state("hv2") is None


# io_error: kept paused and alerted -------------------------------------------------------------------------------
def test_a_vm_paused_by_enospc_stays_paused_and_is_alerted_once(lab):
    hosts = lab(io_error={"enabled": True})
    hosts.conns["hv1"].lookupByName("web1").suspend()
    hosts.reason["web1"] = {"reason": "ioerror", "disk_errors": {"vda": "no_space"}}  # QEMU's ENOSPC pause
    out = hosts.run("io_error")
    assert (out["acted"], out["decision"], out["enospc"]) == (True, remediate.KEPT_PAUSED, True)
    assert "vda is full (ENOSPC)" in out["reason"] and "stays paused" in out["reason"]
    assert hosts.state() == "paused" and hosts.published("virt.resume") == []
    assert hosts.run("io_error", at=T0 + 60)["decision"] == remediate.NOTHING  # alerted already
    assert hosts.fired == [("salt/virt/remediate/io_error", remediate.KEPT_PAUSED)]
    assert hosts.run("io_error", at=T0 + 3600)["decision"] == remediate.KEPT_PAUSED  # repeat_after


def test_a_forged_io_error_of_a_vm_running_or_paused_by_its_operator_changes_nothing(lab):
    hosts = lab(io_error={"enabled": True})
    assert hosts.run("io_error")["decision"] == remediate.NOTHING
    hosts.conns["hv1"].lookupByName("web1").suspend()  # paused by the operator: reason user
    out = hosts.run("io_error")
    assert out["decision"] == remediate.NOTHING and "paused (user), not paused by an I/O error" in out["reason"]
    assert hosts.log() == [] and hosts.fired == []


# agent: a reset after a long silence ----------------------------------------------------------------------------
def test_a_guest_agent_silent_for_silent_after_is_reset(lab):
    hosts = lab(agent={"enabled": True, "silent_after": 300, "max_resets": 1})
    hosts.agent["web1"] = "disconnected"
    assert hosts.run("agent")["decision"] == remediate.SILENT
    assert hosts.run("agent", at=T0 + 100)["decision"] == remediate.NOTHING  # not long enough
    swept = remediate.remediate(hosts.opts, "agent", client=hosts.client, now=T0 + 300, fire=hosts.on_fire)
    assert swept["vms"]["web1"]["decision"] == remediate.RESET and hosts.resets == [("hv1", "web1")]
    out = hosts.run("agent", at=T0 + 600)  # still silent after the reset: max_resets spent
    assert out["decision"] == remediate.GAVE_UP and hosts.resets == [("hv1", "web1")]
    assert hosts.log() == [("agent", d) for d in (remediate.SILENT, remediate.RESET, remediate.GAVE_UP)]


def test_an_agent_that_connects_again_is_no_longer_watched(lab):
    hosts = lab(agent={"enabled": True, "silent_after": 300})
    hosts.agent["web1"] = "disconnected"
    hosts.run("agent")
    hosts.agent["web1"] = "connected"
    assert hosts.run("agent", at=T0 + 10)["decision"] == remediate.AGENT_BACK
    hosts.agent["web1"] = "disconnected"
    swept = remediate.remediate(hosts.opts, "agent", client=hosts.client, now=T0 + 400)
    assert swept == {"kind": "agent", "acted": False, "vms": {}} and hosts.resets == []


def test_a_forged_agent_event_changes_nothing(lab):
    hosts = lab(agent={"enabled": True, "silent_after": 1})
    hosts.agent["web1"] = "connected"
    assert hosts.run("agent")["decision"] == remediate.NOTHING
    assert hosts.run("agent", at=T0 + 10)["decision"] == remediate.NOTHING
    hosts.conns["hv1"].lookupByName("web1").destroy()
    hosts.agent["web1"] = "disconnected"  # a stopped VM's agent is silent: no reset of a stopped VM
    assert hosts.run("agent", at=T0 + 20)["decision"] == remediate.NOTHING
    assert hosts.resets == [] and hosts.log() == []


# beacon: one balancing round -------------------------------------------------------------------------------------
def test_a_hypervisors_beacon_runs_one_balancing_round_per_min_interval(lab):
    hosts = lab(balance={"enabled": True}, beacon={"enabled": True, "min_interval": 300})
    out = hosts.run("beacon", name=None, uuid=None)
    assert out["decision"] == remediate.BALANCED and out["moved"] == []  # the round reads signed facts: balanced
    assert hosts.published("virt.full_info") == [HVS]
    assert hosts.run("beacon", host="hv2", name=None, uuid=None, at=T0 + 10)["decision"] == remediate.NOTHING
    assert hosts.published("virt.full_info") == [HVS]  # no second round within min_interval
    assert hosts.run("beacon", name=None, uuid=None, at=T0 + 300)["decision"] == remediate.BALANCED


def test_a_beacon_respects_balancings_own_switch_and_hypervisors_only(lab):
    hosts = lab(beacon={"enabled": True})
    out = hosts.run("beacon", name=None, uuid=None)
    assert out["decision"] == remediate.BALANCED and "continuous balancing is off" in out["reason"]
    assert hosts.client.published == []
    with pytest.raises(remediate.Refused, match="^tenant1 is not one of the hypervisors"):
        hosts.run("beacon", host="tenant1", name=None, uuid=None, at=T0 + 1000)


# the reactor SLS, rendered by Salt's own reactor ----------------------------------------------------------------
@pytest.fixture(scope="module")
def reactor():
    opts = salt.config.master_config(None)
    opts.update(file_client="local", reactor=[])
    made = salt.utils.reactor.Reactor(opts)
    yield made
    made.minion.destroy()


@pytest.fixture
def reactions(reactor):
    """The low chunks Salt's reactor makes of salt-virt.remediate.sls for an event ``(tag, data)``."""
    return lambda tag, data: reactor.reactions(tag, data, [str(ROOT / "salt-virt.remediate.sls")])


def args(chunks):
    """``(runner function, its keyword arguments)`` of each chunk."""
    assert all(c["state"] == "runner" for c in chunks)
    return [(c["fun"], {k: v for a in c["args"] for k, v in a.items()}) for c in chunks]


def test_the_reactor_hands_the_runner_the_hints_only(reactions):
    data = {"name": "web1", "uuid": WEB1, "event": "crashed", "detail": "failed", "host": "lie", "id": "lie"}
    event = {"id": "hv1", "cmd": "_minion_event", "tag": "salt/virt/hv1/domain/web1/crashed", "data": data}
    hint = {"kind": "crashed", "host": "hv1", "name": "web1", "uuid": WEB1}
    assert args(reactions("salt/virt/hv1/domain/web1/crashed", event)) == [("virt.remediate", hint)]
    assert args(reactions("salt/virt/hv1/domain/web1/panicked", event)) == [("virt.remediate", hint)]
    for event_name, kind in (("io_error", "io_error"), ("agent_disconnected", "agent"), ("agent_connected", "agent")):
        assert args(reactions(f"salt/virt/hv1/domain/web1/{event_name}", event)) == [
            ("virt.remediate", dict(hint, kind=kind))
        ]
    beacon = {"id": "hv2", "memusage": 97.5}
    hint = {"kind": "beacon", "host": "hv2"}
    assert args(reactions("salt/beacon/hv2/memusage/", beacon)) == [("virt.remediate", hint)]


def test_the_reactor_ignores_other_events_and_quotes_hostile_names(reactions):
    event = {"id": "hv1", "cmd": "_minion_event", "data": {"name": "web1"}}
    assert reactions("salt/virt/hv1/domain/web1/started", event) == []
    assert reactions("salt/virt/hv1/domain/web1/crashed", dict(event, data="web1")) == []
    assert reactions("salt/virt/hv1/domain/web1/crashed", dict(event, cmd="other")) == []
    hostile = {"name": "a'\n  - fun: x\nb: {{c}}", "uuid": None}
    (chunk,) = args(reactions("salt/virt/hv1/domain/x/crashed", dict(event, data=hostile)))
    assert chunk == ("virt.remediate", {"kind": "crashed", "host": "hv1", "name": hostile["name"], "uuid": None})
