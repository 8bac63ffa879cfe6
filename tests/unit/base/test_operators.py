"""saltvirt.base.operators: a published virt.* call by a user not in the minion's virt:operators is refused,
for every function of the ``virt`` execution module, through Salt's real loader and its real
``load_args_and_kwargs`` (what the minion does with a publication)."""

import inspect

import pytest
import salt.minion
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import operators
from tests.support.saltloader import make_minion_mods

REFUSED = "on a hypervisor is for operators, and user mallory is not in this minion's virt:operators: use the runner"


def virt_functions(mods):
    return {name: mods[name] for name in mods if name.startswith("virt.")}


def published(func, user, args=(), **kwargs):
    """``(args, kwargs)`` as the minion builds them from a publication by ``user`` (Salt's own code)."""
    data = {"fun": "virt.x", "jid": "20260101000000000000", "user": user, "tgt": "hyper1", "ret": ""}
    arg = [*args, dict(kwargs, __kwarg__=True)] if kwargs else list(args)
    return salt.minion.load_args_and_kwargs(func, arg, data)


def test_every_virt_function_refuses_a_published_call_by_a_non_operator(virt_test):
    """The coverage proof: every function Salt's loader loads as virt.* (all files, new ones included) is
    guarded, gets the publication's user from Salt, and refuses a non-operator before doing anything."""
    funcs = virt_functions(virt_test)
    assert len(funcs) > 80 and "virt.init" in funcs and "virt.recovery_restart" in funcs
    unguarded = sorted(name for name, func in funcs.items() if not hasattr(func, operators.MARK))
    assert unguarded == []
    for name, func in funcs.items():
        args, kwargs = published(func, "mallory")
        assert kwargs["__pub_user"] == "mallory", name  # Salt hands the user over: the signature has **kwargs
        with pytest.raises(CommandExecutionError) as err:
            func(*args, **kwargs)
        assert str(err.value) == operators.refusal(name, "mallory"), name
        assert REFUSED in str(err.value) and f"salt-run {name}" in str(err.value)


def test_a_callers_own_pub_user_is_replaced_by_the_publications(virt_test):
    func = virt_test["virt.define_xml_str"]
    args, kwargs = published(func, "mallory", ["<domain/>"], __pub_user="root")
    assert kwargs["__pub_user"] == "mallory"
    with pytest.raises(CommandExecutionError, match=REFUSED):
        func(*args, **kwargs)


def test_operators_and_unpublished_calls_pass(virt_test):
    # get_hypervisor takes no **kwargs: the __pub_* keywords are not passed on to it
    func = virt_test["virt.get_hypervisor"]
    assert list(inspect.signature(func).parameters) == ["connection", "kwargs"]
    for user in ("root", "salt", "sudo_admin"):
        args, kwargs = published(func, user)
        assert func(*args, **kwargs) == {"type": "test", "reason": "libvirt test driver"}
    assert func() == {"type": "test", "reason": "libvirt test driver"}  # salt-call, a state, another module
    # a state-changing function with **kwargs of its own still gets the job id (sealed secrets use it)
    args, kwargs = published(virt_test["virt.init"], "root", ["op1", 1, 64], nic=None, disk=None, start=False)
    assert virt_test["virt.init"](*args, **kwargs)["state"] == "shutoff"
    assert "op1" in virt_test["virt.list_domains"]()


def test_the_operator_list_comes_from_the_minion_config(tmp_path):
    mods = make_minion_mods(tmp_path, "test:///default", operators=["ops", "auto-*"])
    func = mods["virt.list_domains"]
    for user in ("ops", "auto-deploy"):
        args, kwargs = published(func, user)
        assert "test" in func(*args, **kwargs)
    for user in ("root", "alice", "", None, ["ops"]):
        args, kwargs = published(func, user)
        with pytest.raises(CommandExecutionError, match="is for operators"):
            func(*args, **kwargs)


def test_a_bad_operator_list_is_an_error_saying_what_to_fix():
    for bad in ({"x": 1}, [1], [""]):
        with pytest.raises(SaltInvocationError, match=r"virt:operators in the minion config must be a list of names"):
            operators.operators({"virt": {"operators": bad}})
    assert operators.operators({"virt": {"operators": "ops"}}) == ("ops",)
    assert operators.operators({}) == operators.DEFAULT_OPERATORS


def test_the_refusal_never_echoes_a_long_user_name():
    assert "x" * 65 not in operators.refusal("virt.init", "x" * 500)


def resource_module(owns):
    """The globals of a resource execution module as ``_resources/virt_vm/modules/virt.py`` (power functions) has
    them once Salt's resource loader loaded it: ``__resource_funcs__`` holds the type's tenant gate (``owns``)."""
    namespace = {
        "__name__": "salt.loaded.ext.resource.virt_vm.virt",
        "__virtualname__": "virt",
        "__opts__": {},
        "__resource_funcs__": {operators.TENANT_GATE: owns},
    }
    exec("def start(**kwargs):\n    return 'started'\n\ndef snapshot(name):\n    return name\n", namespace)
    operators.guard_module(namespace, advice=operators.RESOURCE_ADVICE)
    return namespace


def test_a_resource_module_lets_a_tenant_in_on_the_allow_list_only():
    """guard_module gives every resource module the tenant gate, for the functions of TENANT_RESOURCE_FUNCTIONS
    only (a power function the runner lets tenants call); anything else (a snapshot: tenants have none in the
    runner) and a module with no ``__resource_funcs__`` (the hypervisor's own virt.start) stay operator-only."""
    asked = []
    mod = resource_module(lambda user: asked.append(user) or user == "alice")
    assert mod["start"](__pub_user="alice", __pub_jid="1") == "started"
    with pytest.raises(CommandExecutionError) as err:
        mod["start"](__pub_user="bob", __pub_jid="1")
    assert str(err.value) == operators.refusal("virt.start", "bob", operators.RESOURCE_ADVICE)
    with pytest.raises(CommandExecutionError, match="virt.snapshot on a hypervisor is for operators, and user alice"):
        mod["snapshot"]("s1", __pub_user="alice", __pub_jid="1")
    assert asked == ["alice", "bob"]  # never asked for a function off the list, nor for an operator:
    assert mod["snapshot"]("s1", __pub_user="root", __pub_jid="1") == "s1"
    assert asked == ["alice", "bob"]
    assert "cmd.run" not in operators.TENANT_RESOURCE_FUNCTIONS

    del mod["__resource_funcs__"]  # the hypervisor's own module: no resource loader, no tenant gate
    with pytest.raises(CommandExecutionError, match="virt.start on a hypervisor is for operators, and user alice"):
        mod["start"](__pub_user="alice", __pub_jid="1")


def test_a_tenant_gate_that_does_not_say_true_refuses():
    for answer in (None, "yes", 1, False):
        mod = resource_module(lambda user, answer=answer: answer)
        with pytest.raises(CommandExecutionError, match="is for operators, and user alice"):
            mod["start"](__pub_user="alice", __pub_jid="1")
