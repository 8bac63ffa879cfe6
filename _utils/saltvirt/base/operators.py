"""Who may call the ``virt`` execution module on a hypervisor: the users of minion config ``virt:operators``.

A job published to a hypervisor runs as root there, so a direct ``salt 'hyper*' virt.init ...`` by an
eauth user (salt-api's ``local`` client) or a ``publisher_acl`` user would bypass what the runner enforces
(tenants, quotas, the catalog, placement). Such calls are refused unless the job's user is an operator;
everybody else goes through the runner (``salt-run virt.<fn>``), whose own publications carry the master's
user and pass.

How the minion learns the job's user (Salt 3008, ``salt/minion.py`` ``load_args_and_kwargs``): the
publication's data (``user``, ``jid``, ``fun``, ...) is handed to a module function as ``__pub_<key>``
keywords, *after* the caller's own keywords, and only to functions that take ``**kwargs``. The master
always puts ``user`` in a publication (``ClearFuncs.publish``: the eauth/token name, or the OS user the
master authenticated by its key file), so a caller's ``__pub_user=`` is replaced by the real one. A call
with no ``__pub_user`` did not come from a publication: ``salt-call`` on the hypervisor, a state or
another module calling ``__salt__``, the minion's own schedule. Those are not refused.

The user a publication carries (``salt/client/__init__.py``, ``salt.utils.user.get_specific_user``):
``root`` (or the master's ``user:``, ``salt`` in Salt's packages) for whatever runs inside the master
(the runner's LocalClient, the reactor, peer publishing), ``sudo_<name>`` for root through sudo, the
eauth name for salt-api and ``--eauth`` users, the OS user for ``publisher_acl`` users (who may also claim
``root``: Salt accepts their own key for it, so no list here holds them back; docs/topics/delegation.md).

Every public function of every ``virt`` loader file is wrapped by :func:`guard_module` (its last line);
``tests/unit/base/test_operators.py`` walks the loaded ``virt.*`` functions and fails on one that is not.

The ``virt_vm`` resource functions (``_resources/virt_vm/modules``) are wrapped the same way, with one more
way in: a function of :data:`TENANT_RESOURCE_FUNCTIONS` also passes for a user whom the resource type's
:data:`TENANT_GATE` (``_resources/virt_vm``: the master's tenant membership in the hypervisor's pillar, the
VM's recorded owner in libvirt) finds a member of the tenant that owns the targeted VM. Only a module Salt's
resource loader loaded has ``__resource_funcs__``: the ``virt`` execution module stays operator-only.
"""

import fnmatch
import functools
import inspect
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError

from saltvirt.base import validate
from saltvirt.base.config import virt_conf

# root; Salt's packaged master user; root through sudo (also what a master started with sudo publishes as)
DEFAULT_OPERATORS = ("root", "salt", "sudo_*")
MARK = "__virt_operators_only__"  # set on every guarded function (the coverage test looks for it)
PUB = "__pub_"
# what a refused call on a virt_vm resource (_resources/virt_vm/modules) is told to do instead
RESOURCE_ADVICE = (
    "a tenant's user reaches its own tenant's VMs only; tenants ask about their VMs with salt-run virt.query, "
    "or ask the operator"
)
# the virt_vm resource functions a tenant's user may call on its own tenant's VMs (docs/topics/resources.md):
# what the runner lets tenants do to their VMs (salt-run virt.start/stop/...: no snapshot, purge or migrate),
# never cmd.run (the guest agent's guest-exec is operator-only, whatever the gate lets tenants call)
TENANT_RESOURCE_FUNCTIONS = frozenset(
    {"test.ping", "grains.items", "grains.get"}
    | {f"virt.{f}" for f in ("start", "stop", "shutdown", "force_off", "reboot", "reset", "pause", "resume")}
)
# the resource type's function (``__resource_funcs__``) that answers whether a Salt user's tenant owns the VM
TENANT_GATE = "virt_vm.tenant_owns"


def operators(opts: Any) -> tuple[str, ...]:
    """``virt:operators`` of the minion config ``opts`` (never pillar, grains or the call): Salt user names,
    ``fnmatch`` globs allowed; :data:`DEFAULT_OPERATORS` when unset."""
    conf = virt_conf(opts)
    return validate.config_names(conf.get("operators", DEFAULT_OPERATORS), "virt:operators")


def is_operator(opts: Any, user: str) -> bool:
    """True if Salt user ``user`` matches an entry of :func:`operators`."""
    return any(fnmatch.fnmatchcase(user, entry) for entry in operators(opts))


def refusal(fun: str, user: Any, advice: str | None = None) -> str:
    """The one wording of the refusal (``fun``: ``virt.<name>``; ``advice``: what to do instead, when the runner
    has no function of that name)."""
    advice = advice or f"use the runner (salt-run {fun}, or salt-api's runner client), or ask the operator"
    who = f"user {user!s:.64} is not in this minion's virt:operators"
    return f"{fun} on a hypervisor is for operators, and {who}: {advice}"


def check(
    opts: Any,
    fun: str,
    kwargs: dict[str, Any],
    advice: str | None = None,
    tenant_owns: Callable[[str], bool] | None = None,
) -> None:
    """Refuse (CommandExecutionError) a published call of ``fun`` whose job user is no operator; with
    ``tenant_owns`` (a resource function a tenant may call: :func:`tenant_gate`), one whose user it finds a
    member of the owner tenant of the targeted VM passes too. One wording, whatever the reason."""
    if f"{PUB}user" not in kwargs:
        return  # no publication: salt-call on the hypervisor, another module or state, the schedule
    user = kwargs[f"{PUB}user"]
    if isinstance(user, str) and user and is_operator(opts, user):
        return
    if isinstance(user, str) and user and tenant_owns is not None and tenant_owns(user) is True:
        return
    raise CommandExecutionError(refusal(fun, user, advice))


def tenant_gate(namespace: dict[str, Any], fun: str) -> Callable[[str], bool] | None:
    """The resource type's :data:`TENANT_GATE` when ``fun`` is a function of :data:`TENANT_RESOURCE_FUNCTIONS`
    in a module Salt's resource loader loaded (it injects ``__resource_funcs__``); None otherwise: a ``virt.*``
    function of the hypervisor's own ``virt`` module (same names, no ``__resource_funcs__``) stays
    operator-only."""
    if fun not in TENANT_RESOURCE_FUNCTIONS:
        return None
    funcs = namespace.get("__resource_funcs__")
    if funcs is None or TENANT_GATE not in funcs:
        return None
    return funcs[TENANT_GATE]


def guard(
    func: Callable[..., Any], fun: str, namespace: dict[str, Any], advice: str | None = None
) -> Callable[..., Any]:
    """``func`` (Salt name ``fun``) refusing non-operators. The wrapper's signature is ``func``'s plus
    ``**kwargs`` when it has none, so that Salt hands it the ``__pub_*`` data; those keywords are passed
    on only to a ``func`` that takes ``**kwargs``. ``namespace``: the loader module's globals (its
    ``__opts__``, injected by Salt's loader, is read at call time)."""
    sig = inspect.signature(func)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check(namespace.get("__opts__"), fun, kwargs, advice, tenant_gate(namespace, fun))
        if not takes_kwargs:
            kwargs = {k: v for k, v in kwargs.items() if not k.startswith(PUB)}
        return func(*args, **kwargs)

    # Salt's argspec follows __wrapped__ (salt.utils.args.get_function_argspec): it must see the wrapper's
    # **kwargs, or it would not hand over the publication's user
    del wrapper.__wrapped__
    if not takes_kwargs:
        extra = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)
        sig = sig.replace(parameters=[*sig.parameters.values(), extra])
    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    setattr(wrapper, MARK, func)
    return wrapper


def guard_module(namespace: dict[str, Any], advice: str | None = None) -> None:
    """Wrap every public function defined in the loader module whose globals are ``namespace`` (call it as
    the module's last line: ``_operators.guard_module(globals())``); ``advice``: see :func:`refusal`."""
    virtualname = namespace.get("__virtualname__") or namespace["__name__"].rsplit(".", 1)[-1]
    aliases = namespace.get("__func_alias__") or {}
    for name, obj in list(namespace.items()):
        if name.startswith("_") or not inspect.isfunction(obj) or hasattr(obj, MARK):
            continue
        if obj.__module__ != namespace["__name__"]:
            continue  # imported: Salt's loader does not load it as this module's function
        namespace[name] = guard(obj, f"{virtualname}.{aliases.get(name, name)}", namespace, advice)
