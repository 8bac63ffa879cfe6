"""_resources/virt_vm (the ``virt_vm`` resource type) through Salt 3008's real resource loaders, as a minion
builds them for a type its pillar declares (no daemons; libvirt's test:///default driver): discovery, the
connection module's grains/ping, the type's own ``test.ping`` / ``grains.*`` with ``__resource__`` set as the
minion's job thread sets it, the operator gate and the tenant gate (the master's membership in the hypervisor's
pillar, the VM's recorded owner), ``cmd.run`` through the guest agent (operators only, off unless turned on), and
nothing else reachable. The real master + minion path: tests/integration/test_resources.py."""

import subprocess

import libvirt
import pytest
import salt.loader.context
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import operators
from saltvirt.host import vmresources
from saltvirt.model import tenancy
from saltvirt.xml.domain.metadata import METADATA_NS
from tests.support.paths import ROOT
from tests.support.saltloader import make_minion_mods, make_resource_loaders, refresh_pillar

MEMBERS = {tenancy.MEMBERS_PILLAR: {"alice": "acme", "bob": "beta"}}  # what the libvirt ext_pillar gives


@pytest.fixture
def loaders(tmp_path, virt_test):
    return make_resource_loaders(tmp_path, "test:///default")


def define(name, tenant=None):
    """A stopped VM on test:///default, of ``tenant`` (its <metadata> owner) or an operator's (virt_test removes
    it afterwards)."""
    import libvirt

    owner = f"<sv:owner tenant='{tenant}' creator='someone'/>" if tenant else ""
    conn = libvirt.open("test:///default")
    try:
        return conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory><metadata>"
            f"<sv:vm xmlns:sv='{METADATA_NS}'>{owner}<sv:group>db</sv:group></sv:vm>"
            "</metadata><os><type>hvm</type></os></domain>"
        )
    finally:
        conn.close()


@pytest.fixture
def web1(virt_test):
    """A stopped VM of tenant acme on test:///default (virt_test removes it afterwards)."""
    return define("web1", "acme")


@pytest.fixture
def tenanted(tmp_path, virt_test):
    """The resource loaders of a hypervisor whose pillar has the master's tenant membership (:data:`MEMBERS`)."""
    return make_resource_loaders(tmp_path, "test:///default", pillar=MEMBERS)


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


def test_published_calls_are_for_operators_only_without_the_masters_membership(loaders, web1):
    """As ``virt.*``: with no tenant membership in the hypervisor's pillar (no ``libvirt`` ext_pillar), a tenant's
    eauth user (salt-api's local client) gets no answer about any VM, its own included; the master's own
    publications (root: the CLI, the runner) pass."""
    _, modules = loaders
    uuid = web1.UUIDString()
    for fun in modules:  # every function of the type (test_only_the_types_own_functions_are_reachable: which)
        assert refused(modules, uuid, fun, "alice")
    assert call(modules, uuid, "test.ping", "root") is False
    assert not web1.isActive() and not web1.snapshotNum(0)  # refused before anything was done (virt.start too)


def test_only_the_types_own_functions_are_reachable(loaders):
    """Salt's per-type loader is deny-by-default: the hypervisor's virt.* and the rest of the minion's modules are
    not reachable through a VM resource; the type's own are (cmd.run through the guest agent, virt.* of
    _resources/virt_vm/modules/virt_vm_virt.py), and every one is guarded."""
    _, modules = loaders
    power = ["backup", "force_off", "reboot", "shutdown", "snapshot", "start", "stop"]
    assert sorted(modules) == sorted([*RESOURCE_FUNCTIONS, *(f"virt.{f}" for f in power)])
    assert [fun for fun in modules if not hasattr(modules[fun], operators.MARK)] == []


RESOURCE_FUNCTIONS = {"cmd.run", "grains.get", "grains.items", "test.ping"}  # besides virt.* (power, snapshot)
ARGS = {"grains.get": ("name",), "cmd.run": ("true",)}


def call(modules, uuid, fun, user):
    return on(uuid, modules[fun], *ARGS.get(fun, ()), __pub_user=user, __pub_jid="1")


def refused(modules, uuid, fun, user):
    with pytest.raises(CommandExecutionError) as err:
        call(modules, uuid, fun, user)
    assert str(err.value) == operators.refusal(fun, user, operators.RESOURCE_ADVICE), fun  # one wording
    return True


def test_a_tenants_user_reaches_its_own_tenants_vms_only(tenanted, web1):
    """alice (acme, by the master's membership in the pillar) gets test.ping and grains.* of acme's web1; on
    beta's VM, an operator's VM (no owner) and for cmd.run she is refused in the one wording; a user the
    membership does not list is refused everywhere; root (an operator) reaches every VM."""
    _, modules = tenanted
    mine, theirs, ops = web1.UUIDString(), define("web2", "beta").UUIDString(), define("db1").UUIDString()
    assert call(modules, mine, "test.ping", "alice") is False  # defined, not running: an answer, not a refusal
    assert call(modules, mine, "grains.items", "alice")["tenant"] == "acme"
    assert call(modules, mine, "grains.get", "alice") == "web1"
    for fun in ("test.ping", "grains.items", "grains.get"):
        assert refused(modules, theirs, fun, "alice")
        assert refused(modules, ops, fun, "alice")
        assert refused(modules, mine, fun, "mallory")
        assert call(modules, theirs, fun, "bob") is not None  # bob is beta's
    assert refused(modules, mine, "cmd.run", "alice")  # never a tenant's, on its own VM too
    for uuid in (mine, theirs, ops):
        assert call(modules, uuid, "grains.get", "root") in ("web1", "web2", "db1")


def test_cmd_run_is_for_operators_only_even_when_turned_on(tmp_path, virt_test, web1):
    """With ``virt:resources:guest_exec: True`` a tenant's user is still refused cmd.run on its own VM (the
    operator gate comes first); an operator gets through the gate to libvirt, whose test driver has no guest
    agent (the agent's requests and answers: tests/unit/host/test_guestexec.py)."""
    _, modules = make_resource_loaders(tmp_path, "test:///default", pillar=MEMBERS, resources={"guest_exec": True})
    uuid = web1.UUIDString()
    assert refused(modules, uuid, "cmd.run", "alice")
    web1.create()
    with pytest.raises(CommandExecutionError, match=f"running a command in VM {uuid} through its guest agent"):
        call(modules, uuid, "cmd.run", "root")


def test_cmd_run_is_off_unless_the_minion_config_turns_it_on(loaders, web1):
    _, modules = loaders
    with pytest.raises(CommandExecutionError, match="virt:resources:guest_exec: True in the hypervisor's minion"):
        call(modules, web1.UUIDString(), "cmd.run", "root")
    with pytest.raises(CommandExecutionError, match="is for operators, and user alice is not"):
        call(modules, web1.UUIDString(), "cmd.run", "alice")


def test_membership_changes_at_the_next_pillar_refresh(tenanted, web1):
    """The gate reads the membership from the minion's own pillar, which ``saltutil.refresh_pillar`` replaces
    (the resource loaders keep the copy they were built with: the gate must not read that one)."""
    funcs, modules = tenanted
    uuid = web1.UUIDString()
    assert call(modules, uuid, "grains.get", "alice") == "web1"
    refresh_pillar(funcs.pack["__salt__"], {tenancy.MEMBERS_PILLAR: {"alice": "beta"}})
    assert refused(modules, uuid, "grains.get", "alice")
    refresh_pillar(funcs.pack["__salt__"], {})
    assert refused(modules, uuid, "grains.get", "alice")


def test_a_pillar_the_master_did_not_shape_lets_no_tenant_in(tenanted, web1):
    funcs, modules = tenanted
    assert call(modules, web1.UUIDString(), "test.ping", "alice") is False  # the master's shape: let in
    for members in ("alice", ["alice"], {"alice": ["acme"]}, {"alice": ""}, None):
        refresh_pillar(funcs.pack["__salt__"], {tenancy.MEMBERS_PILLAR: members})
        assert refused(modules, web1.UUIDString(), "test.ping", "alice"), members


def test_the_hypervisors_own_virt_functions_stay_operator_only(tenanted, web1):
    """The same names as the tenant's resource functions (virt.start, ...) on the hypervisor's ``virt`` module:
    refused to a tenant's user whatever the pillar says (tenants use salt-run virt.start)."""
    funcs, modules = tenanted
    mods = funcs.pack["__salt__"]
    assert call(modules, web1.UUIDString(), "grains.get", "alice") == "web1"  # the resource function: let in
    for fun in sorted(f for f in operators.TENANT_RESOURCE_FUNCTIONS if f.startswith("virt.")):
        with pytest.raises(CommandExecutionError, match="is for operators, and user alice is not"):
            mods[fun]("web1", __pub_user="alice", __pub_jid="1")


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
