"""_resources/virt_vm (the ``virt_vm`` resource type) through Salt 3008's real resource loaders, as a minion
builds them for a type its pillar declares (no daemons; libvirt's test:///default driver): discovery, the
connection module's grains/ping, the type's own ``test.ping`` / ``grains.*`` with ``__resource__`` set as the
minion's job thread sets it, the operator gate and the tenant gate (the master's membership in the hypervisor's
pillar, the VM's recorded owner), ``cmd.run`` through the guest agent (operators only, off unless turned on), and
nothing else reachable. The real master + minion path: tests/integration/test_resources.py."""

import pytest
import salt.loader.context
from salt.exceptions import CommandExecutionError

from saltvirt.base import operators
from saltvirt.host import vmresources
from saltvirt.spec import tenancy
from saltvirt.xml.domxml import METADATA_NS
from tests.support.saltloader import make_resource_loaders, refresh_pillar

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


def test_only_the_types_own_functions_are_reachable(loaders):
    """Salt's per-type loader is deny-by-default: virt.* and the rest of the minion's modules are not reachable
    through a VM resource; cmd.run is the type's own (through the guest agent), and every one is guarded."""
    _, modules = loaders
    assert {"cmd.run", "grains.get", "grains.items", "test.ping"} <= set(modules)
    assert not [fun for fun in modules if not fun.startswith("virt.") and fun not in RESOURCE_FUNCTIONS]
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
