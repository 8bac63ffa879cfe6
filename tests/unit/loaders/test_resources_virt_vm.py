"""_resources/virt_vm (the ``virt_vm`` resource type) through Salt 3008's real resource loaders, as a minion
builds them for a type its pillar declares (no daemons; libvirt's test:///default driver): discovery, the
connection module's grains/ping, the type's own ``test.ping`` / ``grains.*`` with ``__resource__`` set as the
minion's job thread sets it, the operator gate, and nothing else reachable. The real master + minion path:
tests/integration/test_resources.py."""

import pytest
import salt.loader.context
from salt.exceptions import CommandExecutionError

from saltvirt.host import vmresources
from saltvirt.xml.domxml import METADATA_NS
from tests.support.saltloader import make_resource_loaders


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
    for fun in modules:  # every function of the type (test_only_the_types_own_functions_are_reachable: which)
        with pytest.raises(CommandExecutionError, match="is for operators, and user alice is not") as refused:
            on(uuid, modules[fun], *args.get(fun, ()), __pub_user="alice", __pub_jid="1")
        assert str(refused.value).endswith(
            ": tenants ask about their VMs with salt-run virt.query, or ask the operator"
        )
    assert on(uuid, modules["test.ping"], __pub_user="root", __pub_jid="1") is False


def test_only_the_types_own_functions_are_reachable(loaders):
    """Salt's per-type loader is deny-by-default: cmd.run, virt.* and the rest of the minion's modules are not
    reachable through a VM resource (a guest command would need an opt-in of its own)."""
    _, modules = loaders
    assert sorted(modules) == ["grains.get", "grains.items", "test.ping"]


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
