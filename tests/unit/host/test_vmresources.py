"""saltvirt.host.vmresources: a hypervisor's VMs as ``virt_vm`` resources (libvirt's test driver, a fresh
node per test): discovery by UUID, grains from libvirt and the domain's metadata only, ping; the registration
following lifecycle events (the debounced refresh, and the events watcher's hook that feeds it)."""

import time

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import events, vmresources
from saltvirt.xml.domain.metadata import METADATA_NS

UUID_A = "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9a01"
UUID_B = "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9a02"


def define(conn, name, uuid, tenant=None, group=None, start=False, image=None):
    meta = (f"<sv:owner tenant='{tenant}' creator='alice'/>" if tenant else "") + (
        f"<sv:group>{group}</sv:group>" if group else ""
    )
    meta += f"<sv:image>{image}</sv:image>" if image else ""
    dom = conn.defineXML(
        f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>256</memory>"
        f"<vcpu>2</vcpu><metadata><sv:vm xmlns:sv='{METADATA_NS}'>{meta}</sv:vm></metadata>"
        "<os><type>hvm</type></os><devices><interface type='network'><mac address='52:54:00:00:00:0a'/>"
        "<source network='default'/></interface></devices></domain>"
    )
    if start:
        dom.create()
    return dom


def test_discovery_lists_every_vm_by_uuid_not_by_name(test_conn):
    before = vmresources.discover(test_conn)  # the driver's own 'test' domain
    define(test_conn, "web1", UUID_B)
    define(test_conn, "web1-old", UUID_A)
    got = vmresources.discover(test_conn)
    assert sorted(set(got) - set(before)) == [UUID_A, UUID_B]
    assert got == sorted(got) and "web1" not in got


def test_grains_are_what_libvirt_and_the_definition_say(test_conn):
    define(test_conn, "web1", UUID_A, tenant="acme", group="db", start=True, image="debian12")
    assert vmresources.grains(test_conn, UUID_A, "hyper1") == {
        "id": UUID_A,
        "uuid": UUID_A,
        "name": "web1",
        "virt_vm": True,
        "hypervisor": "hyper1",
        "state": "running",
        "vcpus": 2,
        "mem_mib": 256,
        "group": "db",
        "tenant": "acme",
        "image": "debian12",
        "ha": False,
        "persistent": True,
        "autostart": False,
        "macs": ["52:54:00:00:00:0a"],
    }


def test_an_operators_vm_has_no_tenant(test_conn):
    define(test_conn, "ops1", UUID_A)  # and no recorded image: made by hand, or before virt.init recorded it
    got = vmresources.grains(test_conn, UUID_A, "hyper1")
    assert (got["tenant"], got["group"], got["image"], got["state"]) == (None, None, None, "shutoff")


def test_ping_is_true_only_for_a_running_vm_here(test_conn):
    dom = define(test_conn, "web1", UUID_A)
    assert vmresources.ping(test_conn, UUID_A) is False
    dom.create()
    assert vmresources.ping(test_conn, UUID_A) is True
    dom.destroy()
    dom.undefine()
    assert vmresources.ping(test_conn, UUID_A) is False
    assert vmresources.grains(test_conn, UUID_A, "hyper1") == {}  # purged or migrated away: nothing to report


@pytest.mark.parametrize("bad", ["web1", "", None, 7, "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9a0", "../etc/passwd"])
def test_a_resource_id_is_a_uuid(test_conn, bad):
    with pytest.raises(SaltInvocationError, match="is a VM's UUID"):
        vmresources.resource_id(bad)
    with pytest.raises(SaltInvocationError):
        vmresources.ping(test_conn, bad)


def test_a_uuid_is_taken_in_libvirts_form():
    assert vmresources.resource_id(UUID_A.upper()) == UUID_A
    assert vmresources.resource_id(UUID_A.replace("-", "")) == UUID_A


def test_the_connection_comes_from_the_minion_config_only(tmp_path):
    """discover(opts) runs in a loader without __salt__: the URI is read from opts["virt"], never from the
    pillar or grains inside opts (callers write those)."""
    opts = {"virt": {"connection": {"uri": "test:///default"}}, "pillar": {"virt": {"connection": {"uri": "x://"}}}}
    with vmresources.connect(opts) as conn:
        assert vmresources.discover(conn)  # the default test node's 'test' VM
    get = vmresources.opts_config({"grains": {"virt": {"connection": {"uri": "x://"}}}})
    assert get("virt:connection:uri") is None
    with pytest.raises(CommandExecutionError, match="cannot connect to libvirt"):
        with vmresources.connect({"virt": {"connection": {"uri": "test:///nonexistent.xml"}}}):
            pass


def test_the_tenant_gate_needs_the_masters_membership_and_the_vms_recorded_owner(test_conn):
    from saltvirt.model import tenancy

    define(test_conn, "web1", UUID_A, tenant="acme")
    define(test_conn, "db1", UUID_B)
    pillar = {tenancy.MEMBERS_PILLAR: {"alice": "acme", "bob": "beta"}}
    assert vmresources.owner_tenant(test_conn, UUID_A) == "acme"
    assert vmresources.owner_tenant(test_conn, UUID_B) is None  # an operator's VM
    assert vmresources.owner_tenant(test_conn, "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9aff") is None  # not here
    assert vmresources.member_tenant(pillar, "alice") == "acme"
    assert vmresources.tenant_owns(test_conn, UUID_A, pillar, "alice") is True
    for rid, user in ((UUID_A, "bob"), (UUID_A, "mallory"), (UUID_B, "alice")):
        assert vmresources.tenant_owns(test_conn, rid, pillar, user) is False, (rid, user)
    for bad in ({}, {tenancy.MEMBERS_PILLAR: "alice"}, {tenancy.MEMBERS_PILLAR: {"alice": ["acme"]}}, None):
        assert vmresources.tenant_owns(test_conn, UUID_A, bad, "alice") is False, bad


AGENT = "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"


def define_with_agent(conn, uuid, channel=AGENT):
    return conn.defineXML(
        f"<domain type='test'><name>ga1</name><uuid>{uuid}</uuid><memory unit='MiB'>64</memory>"
        f"<os><type>hvm</type></os><devices>{channel}</devices></domain>"
    )


def test_ping_of_a_vm_with_an_agent_channel_needs_its_agent_to_answer(test_conn, monkeypatch):
    """The test driver has no guest agent (virDomainQemuAgentCommand is not supported): a channel whose agent
    does not answer makes a running VM's ping False; an agent that answers guest-ping (libvirt_qemu's call,
    replaced here by one that answers as QEMU's agent does) makes it True, asked with a whole-second timeout."""
    import libvirt_qemu

    dom = define_with_agent(test_conn, UUID_A)
    dom.create()
    assert vmresources.agent_answers(dom) is False
    assert vmresources.ping(test_conn, UUID_A) is False  # running, but its agent is silent
    asked = []

    def agent(d, cmd, timeout, flags):
        asked.append((d.UUIDString(), cmd, timeout))
        return '{"return": {}}'

    monkeypatch.setattr(libvirt_qemu, "qemuAgentCommand", agent)
    assert vmresources.ping(test_conn, UUID_A, agent_timeout=0.3) is True
    assert asked == [(UUID_A, '{"execute": "guest-ping"}', 1)]
    dom.destroy()
    assert vmresources.ping(test_conn, UUID_A) is False  # stopped: the agent is not asked
    assert len(asked) == 1


def test_ping_of_a_vm_without_an_agent_channel_is_its_running_state(test_conn):
    dom = define_with_agent(test_conn, UUID_A, channel="")
    dom.create()
    assert vmresources.agent_answers(dom) is None
    assert vmresources.ping(test_conn, UUID_A) is True


def test_a_channel_libvirt_reports_disconnected_is_not_asked(monkeypatch):
    """QEMU's driver reports the channel's state on a running VM (the test driver does not): ``disconnected``
    means no agent listens, so it is not asked and waited for."""
    import libvirt_qemu

    class Dom:
        def XMLDesc(self, flags):
            return (
                "<domain><devices><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0' "
                "state='disconnected'/></channel></devices></domain>"
            )

        def UUIDString(self):
            return UUID_A

    monkeypatch.setattr(libvirt_qemu, "qemuAgentCommand", lambda *a: pytest.fail("asked a disconnected agent"))
    assert vmresources.agent_answers(Dom()) is False


# registration following lifecycle events -------------------------------------------------------------------------
class Fires:
    """A Refresher's ``fire``: counts the calls, with when they came."""

    def __init__(self):
        self.at = []

    def __call__(self):
        self.at.append(time.monotonic())

    def wait(self, count, bound=10.0):
        deadline = time.monotonic() + bound
        while len(self.at) < count:
            assert time.monotonic() < deadline, f"{len(self.at)} refresh(es), not {count}, within {bound} s"
            time.sleep(0.01)


def test_a_burst_of_lifecycle_events_is_one_refresh():
    fires = Fires()
    refresher = vmresources.Refresher(fires, quiet=0.2, max_wait=30, settle=30)
    t0 = time.monotonic()
    for _ in range(100):  # 100 VMs defined and started at once
        refresher.lifecycle("defined")
        refresher.lifecycle("started")
    fires.wait(1)
    time.sleep(0.4)  # what a second refresh would need: two quiet periods
    assert len(fires.at) == 1 and fires.at[0] - t0 >= 0.2


def test_events_that_change_neither_the_list_nor_a_grain_refresh_nothing():
    fires = Fires()
    refresher = vmresources.Refresher(fires, quiet=0.05)
    for event in ("rebooted", "io_error", "control_error", "agent_connected", "agent_disconnected"):
        refresher.lifecycle(event)
    time.sleep(0.3)
    assert fires.at == [] and refresher.thread is None


def test_a_burst_that_goes_on_is_refreshed_after_max_wait():
    fires = Fires()
    refresher = vmresources.Refresher(fires, quiet=0.3, max_wait=0.5, settle=30)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.2:  # never quiet for 0.3 s
        refresher.lifecycle("suspended")
        time.sleep(0.05)
    fires.wait(2)
    assert fires.at[0] - t0 == pytest.approx(0.5, abs=0.25)


def test_a_vm_that_migrated_in_makes_its_new_host_register_twice():
    """The destination registers again ``settle`` seconds after the first refresh (Salt's registry may lose the
    UUID when the source's registration lands with the destination's); an outgoing migration does not."""
    fires = Fires()
    refresher = vmresources.Refresher(fires, quiet=0.1, max_wait=5, settle=0.4)
    refresher.lifecycle("migrated", {"direction": "in"})
    refresher.lifecycle("resumed")
    fires.wait(2)
    assert fires.at[1] - fires.at[0] >= 0.4
    time.sleep(0.6)
    assert len(fires.at) == 2
    refresher.lifecycle("migrated", {"direction": "out"})
    refresher.lifecycle("undefined")
    fires.wait(3)
    time.sleep(0.6)
    assert len(fires.at) == 3


def test_a_failing_refresh_is_logged_and_the_next_burst_tries_again(caplog):
    calls = []

    def fire():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the minion's bus is away")

    refresher = vmresources.Refresher(fire, quiet=0.05)
    refresher.lifecycle("stopped")
    deadline = time.monotonic() + 10
    while not calls:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    refresher.lifecycle("started")
    while len(calls) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "could not ask the minion to register its VMs again: the minion's bus is away" in caplog.text


@pytest.mark.parametrize(
    ("pillar", "key", "expected"),
    [
        ({"resources": {"virt_vm": {}}}, None, True),
        ({"resources": {"dummy": {}}}, None, False),
        ({}, None, False),
        ({"resources": ["virt_vm"]}, None, False),  # not a mapping: Salt declares nothing
        ({"res": {"virt_vm": {}}, "resources": {}}, "res", True),
    ],
)
def test_only_a_minion_whose_pillar_declares_the_type_follows_events(pillar, key, expected):
    opts = {"pillar": pillar, **({"resource_pillar_key": key} if key else {})}
    assert vmresources.manages(opts) is expected


def lifecycle_fact(typ, detail):
    return (getattr(libvirt, f"VIR_DOMAIN_EVENT_{typ}"), getattr(libvirt, f"VIR_DOMAIN_EVENT_{typ}_{detail}"))


@pytest.mark.parametrize("options", [{}, {"tags": "libvirt_events"}, {"events": ["crashed"]}])
def test_the_events_watcher_tells_every_lifecycle_event_whatever_it_sends(options):
    """The engine's watcher hands each lifecycle event to the hook (the Refresher), in Salt's scheme only and with
    an event filter too; the others (a reboot) are not lifecycle events."""
    told = []
    watcher = events.Watcher("hyper1", None, lambda tag, data: None, options, on_lifecycle=lambda *a: told.append(a))
    who = ("web1", UUID_A, 3)
    watcher.handle("lifecycle", who, lifecycle_fact("STARTED", "MIGRATED"))
    watcher.handle("lifecycle", who, lifecycle_fact("UNDEFINED", "REMOVED"))
    watcher.handle("rebooted", who, ())
    assert told == [("migrated", {"direction": "in"}), ("undefined", {})]


def test_what_changed_while_libvirtd_was_away_is_told_too():
    told = []
    opts = {"reconcile": False}  # no reconciled events sent: the registration follows all the same
    watcher = events.Watcher("hyper1", None, lambda t, d: None, opts, on_lifecycle=lambda *a: told.append(a))
    watcher.known = {UUID_A: {"name": "a", "state": "running", "id": 1, "persistent": True}}
    watcher._reconcile({UUID_B: {"name": "b", "state": "shutoff", "id": -1, "persistent": True}})
    assert told == [("stopped", {}), ("undefined", {}), ("defined", {})]


def test_a_failing_hook_does_not_stop_the_events():
    sent = []

    def hook(*_a):
        raise RuntimeError("boom")

    watcher = events.Watcher("hyper1", None, lambda t, d: sent.append(t), {}, on_lifecycle=hook)
    watcher.handle("lifecycle", ("web1", UUID_A, 3), lifecycle_fact("STOPPED", "DESTROYED"))
    assert sent == ["salt/virt/hyper1/domain/web1/stopped"]


def test_nothing_is_fired_while_the_pillar_does_not_declare_the_type_and_it_is_asked_again_later():
    """An engine process starts before its minion has the pillar: whether the type is declared is asked when a
    refresh is due (the engine compiles the pillar), and that answer is used for ``recheck`` seconds."""
    fires, answers = Fires(), [False]
    asked = []

    def declared():
        asked.append(1)
        return answers[0]

    refresher = vmresources.Refresher(fires, quiet=0.05, declared=declared, recheck=0.5)
    refresher.lifecycle("defined")
    deadline = time.monotonic() + 10
    while not asked:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    refresher.lifecycle("started")  # within recheck: the same answer, not asked again
    time.sleep(0.3)
    assert fires.at == [] and len(asked) == 1
    answers[0] = True  # the operator declared it
    time.sleep(0.5)
    refresher.lifecycle("stopped")
    fires.wait(1)
    assert len(asked) == 2


def test_a_declaration_that_cannot_be_read_counts_as_declared(caplog):
    fires = Fires()

    def declared():
        raise RuntimeError("the master is away")

    vmresources.Refresher(fires, quiet=0.05, declared=declared).lifecycle("undefined")
    fires.wait(1)
    assert "could not tell whether this minion manages virt_vm resources: the master is away" in caplog.text


def test_the_watchers_first_session_is_told_too():
    """The minion's own discovery at its start may have found libvirtd not yet up: reaching it registers again."""
    told = []
    watcher = events.Watcher("hyper1", None, lambda t, d: None, {}, on_lifecycle=lambda *a: told.append(a))
    watcher._reconcile({UUID_A: {"name": "a", "state": "running", "id": 1, "persistent": True}})
    assert told == [("connected", {})]


def test_the_engine_compiles_the_pillar_with_the_master_its_minion_config_names(monkeypatch):
    """An engine's opts are the minion config from before it resolved its master: completed as Salt's minion
    completes them (master_uri), then the pillar compiled by the master says whether the type is declared."""
    import salt.minion
    import salt.pillar

    seen = {}

    class Compiled:
        def compile_pillar(self):
            return seen["pillar"]

        def destroy(self):
            seen["destroyed"] = True

    def get_pillar(opts, grains, minion_id, pillarenv=None):
        seen.update(uri=opts["master_uri"], grains=grains, id=minion_id)
        return Compiled()

    monkeypatch.setattr(salt.minion, "prep_ip_port", lambda opts: {"master": "salt.example"})
    monkeypatch.setattr(salt.minion, "resolve_dns", lambda opts: {"master_uri": f"tcp://{opts['master']}:4506"})
    monkeypatch.setattr(salt.pillar, "get_pillar", get_pillar)
    opts, grains = {"id": "hv1", "master": "salt.example:4506"}, {"os": "Debian"}
    seen["pillar"] = {"resources": {"virt_vm": {}}}
    assert vmresources.pillar_declares(opts, grains) is True
    assert seen == dict(seen, uri="tcp://salt.example:4506", grains=grains, id="hv1", destroyed=True)
    assert "master_uri" not in opts  # the engine's own copy is left as it was
    seen["pillar"] = {"resources": {}}
    assert vmresources.pillar_declares(dict(opts, master_uri="tcp://resolved:4506"), grains) is False
    assert seen["uri"] == "tcp://resolved:4506"  # already resolved: kept


def test_with_nothing_happening_the_vms_register_again_every_resync_period():
    """Salt's registry can lose a registration (bench/RESULTS.md, "Resources"): a host whose VMs see no event
    registers them again every ``every`` seconds, counted from its last refresh; none without ``every``."""
    fires = Fires()
    refresher = vmresources.Refresher(fires, quiet=0.1, max_wait=30, settle=30, every=0.5)
    refresher.lifecycle("connected")  # the watcher's first session starts it
    fires.wait(3)
    assert fires.at[1] - fires.at[0] >= 0.5 and fires.at[2] - fires.at[1] >= 0.5  # no event: one each period
    quiet = vmresources.Refresher(Fires(), quiet=0.1, max_wait=30, settle=30, every=None)
    quiet.lifecycle("connected")
    quiet.fire.wait(1)
    time.sleep(0.6)
    assert len(quiet.fire.at) == 1
