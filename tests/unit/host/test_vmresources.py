"""saltvirt.host.vmresources: a hypervisor's VMs as ``virt_vm`` resources (libvirt's test driver, a fresh
node per test): discovery by UUID, grains from libvirt and the domain's metadata only, ping."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import vmresources
from saltvirt.xml.domxml import METADATA_NS

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
    from saltvirt.spec import tenancy

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
