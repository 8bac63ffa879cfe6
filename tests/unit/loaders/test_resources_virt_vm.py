"""_resources/virt_vm (the ``virt_vm`` resource type) through Salt 3008's real resource loaders, as a minion
builds them for a type its pillar declares (no daemons; libvirt's test:///default driver): discovery, the
connection module's grains/ping, the type's own ``test.ping`` / ``grains.*`` with ``__resource__`` set as the
minion's job thread sets it, the operator gate, and nothing else reachable. The real master + minion path:
tests/integration/test_resources.py."""

import subprocess

import libvirt
import pytest
import salt.loader.context
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import operators
from saltvirt.host import vmresources
from saltvirt.xml.domxml import METADATA_NS
from tests.support.paths import ROOT
from tests.support.saltloader import make_minion_mods, make_resource_loaders


@pytest.fixture
def loaders(tmp_path, virt_test):
    return make_resource_loaders(tmp_path, "test:///default")


@pytest.fixture
def web1(virt_test):
    """A stopped VM of tenant acme on test:///default (virt_test removes it afterwards)."""
    import libvirt

    conn = libvirt.open("test:///default")
    yield conn.defineXML(
        "<domain type='test'><name>web1</name><memory unit='MiB'>64</memory><metadata>"
        f"<sv:vm xmlns:sv='{METADATA_NS}'><sv:owner tenant='acme' creator='alice'/><sv:group>db</sv:group></sv:vm>"
        "</metadata><os><type>hvm</type></os></domain>"
    )
    conn.close()


def on(resource_id, func, *args, **kwargs):
    """``func`` run as Salt's ``_thread_return`` runs a resource job: ``resource_ctxvar`` set to the target."""
    token = salt.loader.context.resource_ctxvar.set({"id": resource_id, "type": vmresources.TYPE})
    try:
        return func(*args, **kwargs)
    finally:
        salt.loader.context.resource_ctxvar.reset(token)


def test_discover_lists_the_vms_by_uuid(loaders, web1):
    funcs, modules = loaders
    got = funcs["virt_vm.discover"](modules.opts)
    assert web1.UUIDString() in got and "web1" not in got


def test_a_vm_with_no_minion_inside_answers_through_its_hypervisor(loaders, web1):
    funcs, modules = loaders
    uuid = web1.UUIDString()
    assert on(uuid, modules["test.ping"]) is False  # defined, not running
    web1.create()
    assert on(uuid, modules["test.ping"]) is True
    items = on(uuid, modules["grains.items"])
    assert (items["name"], items["tenant"], items["group"], items["hypervisor"]) == ("web1", "acme", "db", "hyper-test")
    assert on(uuid, modules["grains.get"], "state") == "running"
    assert on(uuid, modules["grains.get"], "nothing", "dflt") == "dflt"
    assert on(uuid, funcs["virt_vm.grains"]) == items


def test_a_vm_that_left_the_host_is_an_error_not_empty_grains(loaders, web1):
    funcs, modules = loaders
    uuid = web1.UUIDString()
    web1.undefine()
    assert on(uuid, modules["test.ping"]) is False
    with pytest.raises(CommandExecutionError, match=f"VM {uuid} is no longer on this hypervisor"):
        on(uuid, modules["grains.items"])


def test_published_calls_are_for_operators_only(loaders, web1):
    """As ``virt.*``: a tenant's eauth user (salt-api's local client) gets no answer about any VM; the master's
    own publications (root: the CLI, the runner) pass."""
    _, modules = loaders
    uuid = web1.UUIDString()
    args = {"grains.get": ("name",)}
    web1.create()
    for fun in modules:  # every function of the type, virt.* too: refused before anything is done (web1 stays as is)
        with pytest.raises(CommandExecutionError, match="is for operators, and user alice is not") as refused:
            on(uuid, modules[fun], *args.get(fun, ()), __pub_user="alice", __pub_jid="1")
        assert str(refused.value).endswith(
            ": tenants ask about their VMs with salt-run virt.query, or ask the operator"
        )
    assert on(uuid, modules["test.ping"], __pub_user="root", __pub_jid="1") is True
    assert web1.isActive() and not web1.snapshotNum(0)


def test_only_the_types_own_functions_are_reachable(loaders):
    """Salt's per-type loader is deny-by-default: cmd.run, the hypervisor's virt.* and the rest of the minion's
    modules are not reachable through a VM resource (a guest command would need an opt-in of its own); the
    type's own virt.* (_resources/virt_vm/modules/virt_vm_virt.py) are."""
    _, modules = loaders
    power = ["backup", "force_off", "reboot", "shutdown", "snapshot", "start", "stop"]
    assert sorted(modules) == ["grains.get", "grains.items", "test.ping", *(f"virt.{f}" for f in power)]


def test_salts_resource_matcher_sees_the_discovered_vms(loaders, web1):
    """``T@virt_vm`` / ``T@virt_vm:<uuid>`` as the minion evaluates them (salt/matchers/resource_match.py) over
    what discovery put into ``opts["resources"]``; a name is not an id."""
    from salt.matchers import resource_match

    funcs, modules = loaders
    opts = {"resources": {vmresources.TYPE: funcs["virt_vm.discover"](modules.opts)}}
    uuid = web1.UUIDString()
    assert resource_match.match("virt_vm", opts=opts)
    assert resource_match.match(f"virt_vm:{uuid}", opts=opts)
    assert not resource_match.match("virt_vm:web1", opts=opts)


# virt.* of a VM resource: the hypervisor's library calls on the VM found by its UUID ---------------------------
def state(dom):
    return vmresources.query.state_name(dom.state()[0])


def test_power_functions_change_the_vms_state_in_libvirt(loaders, web1):
    _, modules = loaders
    uuid = web1.UUIDString()
    web1.create()
    assert on(uuid, modules["virt.stop"]) is True and state(web1) == "shutoff"  # hard power-off
    web1.create()
    assert on(uuid, modules["virt.shutdown"], timeout=5) is True and state(web1) == "shutoff"
    web1.create()
    assert on(uuid, modules["virt.reboot"]) is True and state(web1) == "running"
    got = on(uuid, modules["virt.force_off"])
    assert got == {"name": "web1", "action": "force off", "state": "shutoff", "previous": "running"}
    with pytest.raises(CommandExecutionError, match="cannot force off VM 'web1': it is shutoff"):
        on(uuid, modules["virt.stop"])


def test_start_is_refused_without_a_guard_against_a_second_copy(loaders, web1):
    """A UUID target also reaches a definition left behind on another hypervisor: without libvirt's lock manager
    (virt:lock_manager) the resource does not start a stopped VM, and says how to."""
    _, modules = loaders
    with pytest.raises(CommandExecutionError, match="Start it with salt-run virt.start web1, which asks every"):
        on(web1.UUIDString(), modules["virt.start"])
    assert state(web1) == "shutoff"


@pytest.mark.parametrize("guard", [{"lock_manager": "lockd"}, {"resources": {"unsafe_assume_one_definition": True}}])
def test_start_under_the_lock_manager_or_the_operators_opt_in(tmp_path, virt_test, web1, guard):
    _, modules = make_resource_loaders(tmp_path, "test:///default", **guard)
    assert on(web1.UUIDString(), modules["virt.start"]) is True and state(web1) == "running"
    assert on(web1.UUIDString(), modules["virt.start"]) is True  # running: left as is


def test_a_snapshot_appears_in_libvirt_with_the_hypervisors_answer(loaders, web1):
    _, modules = loaders
    uuid = web1.UUIDString()
    try:
        with pytest.raises(CommandExecutionError, match="salt <that hypervisor> virt.snapshot web1$"):
            on(uuid, modules["virt.snapshot"])  # stopped here: may be a definition left behind
        assert not web1.snapshotNum(0)
        web1.create()
        assert on(uuid, modules["virt.snapshot"], name="before", suffix="upgrade") == {
            "name": "before-upgrade",
            "memory": True,
        }
        assert [s.getName() for s in web1.listAllSnapshots(0)] == ["before-upgrade"]
    finally:
        for snap in web1.listAllSnapshots(0):  # virt_test's cleanup cannot undefine a VM that has snapshots
            snap.delete(0)


def test_a_vm_that_left_the_host_is_a_clear_error_for_every_function(loaders, web1):
    _, modules = loaders
    uuid = web1.UUIDString()
    web1.undefine()
    for fun in ("virt.start", "virt.stop", "virt.shutdown", "virt.reboot", "virt.force_off", "virt.snapshot"):
        with pytest.raises(CommandExecutionError, match=f"^VM {uuid} is no longer on this hypervisor$"):
            on(uuid, modules[fun])


def test_a_backup_of_a_vm_here_is_the_hypervisors_backup(tmp_path, virt_test):
    """Offline here (libvirt's live backup needs QEMU: tests/integration/test_backup_real.py), so only under the
    operator's opt-in; without it a stopped VM is refused and pointed at the runner."""
    disk = tmp_path / "bk1.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "1M"], check=True)
    (tmp_path / "backups").mkdir()
    conn = libvirt.open("test:///default")
    dom = conn.defineXML(
        "<domain type='test'><name>bk1</name><memory unit='MiB'>64</memory><os><type>hvm</type></os><devices>"
        f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk}'/>"
        "<target dev='vda' bus='virtio'/></disk></devices></domain>"
    )
    backup = {"dir": str(tmp_path / "backups")}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, modules = make_resource_loaders(tmp_path / "a", "test:///default", backup=backup)
    with pytest.raises(CommandExecutionError, match="Back it up with salt-run virt.backup bk1, which asks every"):
        on(dom.UUIDString(), modules["virt.backup"])
    opt_in = {"unsafe_assume_one_definition": True}
    _, modules = make_resource_loaders(tmp_path / "b", "test:///default", backup=backup, resources=opt_in)
    with pytest.raises(CommandExecutionError, match="virt.backup on a hypervisor is for operators, and user alice"):
        on(dom.UUIDString(), modules["virt.backup"], __pub_user="alice")
    made = on(dom.UUIDString(), modules["virt.backup"], __pub_user="root")
    assert (made["uuid"], made["type"], made["live"]) == (dom.UUIDString(), "full", False)
    assert [d["target"] for d in made["disks"]] == ["vda"] and made["dir"].startswith(str(tmp_path / "backups"))
    conn.close()


def test_a_job_aimed_at_the_hypervisors_leaves_their_vms_alone(loaders, web1):
    """``salt 'hyper*' virt.shutdown web1`` is the hypervisor's virt.shutdown, and Salt runs it on every VM resource
    of the minion too (a glob with a wildcard): the resource's virt.* refuse such a job, and act in one whose target
    names the VM (Salt's publication data, which the minion hands over as __pub_tgt / __pub_tgt_type)."""
    _, modules = loaders
    uuid = web1.UUIDString()
    web1.create()
    glob = {"__pub_user": "root", "__pub_tgt": "hyper*", "__pub_tgt_type": "glob"}
    for fun in ("virt.shutdown", "virt.stop", "virt.reboot", "virt.force_off", "virt.snapshot", "virt.start"):
        with pytest.raises(CommandExecutionError, match="acts on a VM resource only in a job whose target names"):
            on(uuid, modules[fun], **glob)
    assert state(web1) == "running" and not web1.snapshotNum(0)
    aimed = {"__pub_user": "root", "__pub_tgt": f"T@virt_vm:{uuid}", "__pub_tgt_type": "compound"}
    assert on(uuid, modules["virt.shutdown"], timeout=5, **aimed) is True and state(web1) == "shutoff"
    with pytest.raises(SaltInvocationError, match="virt.stop: unknown argument"):
        on(uuid, modules["virt.stop"], timeout=5, **aimed)  # the hypervisor's virt.stop takes none either


def test_no_module_of_the_type_shares_a_file_name_with_a_minion_module():
    """Salt's loaders import every extension module as ``salt.loaded.ext.module.<file name>`` (salt/loader/lazy.py
    ``_load_module``), the resource type's as the minion's: a ``modules/virt.py`` here was executed into the
    module object of ``_modules/virt.py``, and the hypervisor's ``virt.backup`` became the resource's."""
    ours = {p.name for p in (ROOT / "_resources" / "virt_vm" / "modules").glob("*.py")} - {"__init__.py"}
    assert not ours & {p.name for p in (ROOT / "_modules").glob("*.py")}


def test_the_minions_virt_functions_stay_the_hypervisors_once_the_types_are_loaded(tmp_path, loaders):
    """Both loaders in one process (as on a minion managing VM resources): each ``virt.*`` keeps its own code."""
    _, modules = loaders
    assert modules["virt.backup"]  # the resource's module is loaded
    mods = make_minion_mods(tmp_path / "m", "test:///default")

    def source(loaded):
        func = loaded.func
        return getattr(func, operators.MARK, func).__code__.co_filename  # the guarded function's own file

    for fun in ("virt.start", "virt.stop", "virt.snapshot", "virt.backup", "virt.force_off"):
        assert "/_modules/" in source(mods[fun]), fun
        assert source(modules[fun]).endswith("/resources/virt_vm/modules/virt_vm_virt.py"), fun
