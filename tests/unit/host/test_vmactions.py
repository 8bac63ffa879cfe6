"""saltvirt.host.vmactions: a ``virt_vm`` resource's VM found by UUID and kept to it, and the two rules of a UUID
target (start only under libvirt's lock manager or the operator's opt-in; snapshot/backup only of a VM running
here) on libvirt's test driver (a fresh node per test). Through Salt's resource loaders:
tests/unit/loaders/test_resources_virt_vm.py."""

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.host import lifecycle, vmactions, vmresources

UUID_A = "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9a01"
UUID_B = "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9a02"
OPTS = {"virt": {"connection": {"uri": "test:///default"}}}  # shared in-process; virt_test removes what is defined


def define(conn, name, uuid):
    return conn.defineXML(
        f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>64</memory>"
        "<os><type>hvm</type></os></domain>"
    )


def config(**virt):
    return vmresources.opts_config({"virt": virt})


def test_the_library_acts_on_the_uuid_it_was_given_not_on_whoever_has_the_name_now(virt_test):
    """Between the lookup by UUID and the library's lookup by name, the VM is purged and a new VM takes its name:
    the start fails as for a VM that left, and the new VM is not started."""
    with vmresources.connect(OPTS) as conn:
        old = define(conn, "web1", UUID_A)
        with pytest.raises(CommandExecutionError, match=f"^VM {UUID_A} is no longer on this hypervisor$"):
            with vmactions.vm(OPTS, UUID_A) as (pinned, _dom):
                old.undefine()
                newcomer = define(conn, "web1", UUID_B)
                assert pinned.lookupByName("test").name() == "test"  # other names: the connection's own lookup
                assert pinned.getHostname() == conn.getHostname()
                lifecycle.start(pinned, "web1")
        assert not newcomer.isActive()


def test_the_vm_is_found_by_uuid_and_a_vm_that_left_is_an_error(virt_test):
    with vmresources.connect(OPTS) as conn:
        dom = define(conn, "web1", UUID_A)
        with vmactions.vm(OPTS, UUID_A.upper()) as (pinned, found):
            assert found.UUIDString() == UUID_A and pinned.lookupByName("web1").UUIDString() == UUID_A
        dom.undefine()
    with pytest.raises(CommandExecutionError, match=f"^VM {UUID_A} is no longer on this hypervisor$"):
        with vmactions.vm(OPTS, UUID_A):
            pass


@pytest.mark.parametrize("value, declared", [(None, None), ("", None), ("nop", None), ("lockd", "lockd")])
def test_the_lock_manager_is_what_the_minion_config_declares(value, declared):
    assert vmactions.lock_manager(config(lock_manager=value)) == declared
    assert vmactions.lock_manager(config()) is None


def test_an_unknown_lock_manager_is_a_configuration_error():
    with pytest.raises(CommandExecutionError, match="virt:lock_manager in the minion config is 'yes'"):
        vmactions.lock_manager(config(lock_manager="yes"))


def test_a_stopped_vm_starts_through_its_resource_only_under_a_guard(test_conn):
    dom = define(test_conn, "web1", UUID_A)
    with pytest.raises(CommandExecutionError) as refused:
        vmactions.refuse_start(config(), dom, "hyper1")
    assert str(refused.value) == (
        f"virt.start of VM web1 ({UUID_A}) through its virt_vm resource is refused on hyper1: a T@virt_vm:<uuid> "
        "target reaches every hypervisor with a definition of that VM (one stays behind on a host that was down "
        "while its VMs were recovered elsewhere), and nothing keeps a second copy from starting here (no "
        "virt:lock_manager in this minion's config). Start it with salt-run virt.start web1, which asks every "
        "hypervisor first"
    )
    vmactions.refuse_start(config(lock_manager="lockd"), dom, "hyper1")
    vmactions.refuse_start(config(resources={"unsafe_assume_one_definition": True}), dom, "hyper1")
    dom.create()
    vmactions.refuse_start(config(), dom, "hyper1")  # running already: starting it does nothing


def test_snapshot_and_backup_act_on_a_vm_running_here_only(test_conn):
    dom = define(test_conn, "web1", UUID_A)
    lockd = config(lock_manager="lockd")  # guards QEMU's opening of the disks, not qemu-img on a stopped VM
    with pytest.raises(CommandExecutionError) as refused:
        vmactions.refuse_offline(lockd, dom, "virt.snapshot", "hyper1", "Do it elsewhere")
    assert str(refused.value) == (
        f"virt.snapshot of VM web1 ({UUID_A}) through its virt_vm resource acts only on a VM running on its "
        "hypervisor, and it is not running on hyper1: a definition left behind here (its VM recovered elsewhere) "
        "may share its disk files with the copy running there. Do it elsewhere"
    )
    vmactions.refuse_offline(config(resources={"unsafe_assume_one_definition": "true"}), dom, "virt.backup", "h", "")
    dom.create()
    vmactions.refuse_offline(config(), dom, "virt.backup", "hyper1", "")


@pytest.mark.parametrize(
    "tgt_type, tgt",
    [
        ("compound", f"T@virt_vm:{UUID_A}"),
        ("compound", "T@virt_vm and G@group:db"),
        ("compound", ["T@virt_vm", "and", "G@tenant:acme"]),
        ("list", f"{UUID_B},{UUID_A}"),
        ("list", [UUID_A]),
        ("glob", UUID_A),
    ],
)
def test_a_job_that_names_vm_resources_acts_on_them(tgt_type, tgt):
    vmactions.refuse_untargeted("virt.stop", UUID_A, {"__pub_tgt": tgt, "__pub_tgt_type": tgt_type})


@pytest.mark.parametrize(
    "tgt_type, tgt",
    [
        ("glob", "hyper*"),  # the hypervisor's virt.shutdown web1: Salt runs it on every VM there too
        ("glob", "*"),
        ("pcre", "hyper.*"),
        ("pillar", "role:hypervisor"),
        ("ipcidr", "10.0.0.0/8"),
        ("grain", "tenant:acme"),
        ("compound", "hyper* and G@os:Debian"),
        ("list", f"hyper1,{UUID_B}"),
    ],
)
def test_a_job_aimed_at_hypervisors_does_not_act_on_their_vms(tgt_type, tgt):
    with pytest.raises(CommandExecutionError) as refused:
        vmactions.refuse_untargeted("virt.shutdown", UUID_A, {"__pub_tgt": tgt, "__pub_tgt_type": tgt_type})
    assert str(refused.value).startswith(
        "virt.shutdown acts on a VM resource only in a job whose target names VM resources (-C 'T@virt_vm:<uuid>'"
    )
    assert f"not in this {tgt_type} target" in str(refused.value)


def test_a_call_that_was_not_published_is_not_refused():
    vmactions.refuse_untargeted("virt.stop", UUID_A, {})  # salt-call, another module: no __pub_ data
