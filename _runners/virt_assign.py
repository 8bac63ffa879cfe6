"""
Runner ``virt`` (continued): ``virt.provision_assigned``, creating the VMs the master's pillar assigns
to a hypervisor (the reactor example ``salt-virt.reactor.sls`` runs it when a hypervisor fires
``salt/virt/hypervisor/ready``). Salt's loader merges every runner file whose ``__virtualname__`` is
``virt``. The logic lives in ``saltvirt.fleet.assign``; each VM is created by ``virt.init`` of this runner.

Trust: an event is data a minion sends, and root in any VM can send any event. The host must be one
of ``virt:hypervisors`` (master config, accepted key); what to create comes only from that host's
pillar as this master compiles it (``virt:assigned_vms``; pillar_roots only, no grains, no
ext_pillar), never from the event; a VM defined anywhere is skipped.
"""

import contextlib
import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltException

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{runners,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import config, validate
    from saltvirt.fleet import assign, callers, hypervisors, publish, tenants

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt runner: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def _failed(message, **extra):
    with contextlib.suppress(NameError):  # __context__ is injected by the loader
        __context__["retcode"] = 1
    return {"error": message, **extra, "retcode": 1}


def provision_assigned(host, dry_run=False, saltenv="base", pillarenv=None, ready_nonce=None):
    """
    Create the VMs that the master's pillar assigns to hypervisor ``host`` (``virt:assigned_vms`` in
    that host's pillar: ``{name: {cpu, mem, image, ...any virt.init keyword}}``) and are defined on no
    hypervisor yet, each with ``virt.init`` on ``host`` (no fallback to another host). VMs defined
    anywhere are listed under ``existing`` and left alone, so a second run creates nothing.

    ``host`` must be one of the hypervisors in the master config (``virt:hypervisors``); nothing is
    taken from the caller but the host's id (the reactor passes the id the master authenticated).

    dry_run
        only report what would be created.

    ready_nonce
        the nonce of the hypervisor's ready event (``virt.ready``; the reactor example passes it): ``host``
        is asked whether it sent it, and nothing happens unless it says yes. Required when the reactor
        runs this (any minion can forge an event's tag and data).

    Returns ``{host, created: {name: virt.init's answer}, failed: {name: error}, existing: {name:
    [hosts]}, invalid: {name: why}, down: [hypervisors that did not answer]}``; exits non-zero when
    something failed or was invalid.

    CLI Example:

    .. code-block:: bash

        salt-run virt.provision_assigned host=hyper1
        salt-run virt.provision_assigned host=hyper1 dry_run=True
    """
    try:
        who = callers.job_caller(__opts__, globals(), __salt__)
        tenants.operator_only(who, "virt.provision_assigned")
        opts = config.master_opts(__opts__)
        hypervisors.require(opts, host, "provisioning the VMs assigned to it")
        if ready_nonce is not None or who.user == callers.REACTOR:
            assign.confirm_ready(publish.Fleet.of_master(__opts__), host, ready_nonce)
        assigned, invalid = assign.entries(assign.host_pillar(__opts__, host, saltenv, pillarenv))
        hosts = publish.Fleet.of_master(__opts__).gather("virt.vm_state")
    except SaltException as exc:
        return _failed(getattr(exc, "error", None) or str(exc), host=host)
    ret = {"host": host, "created": {}, "failed": {}, "invalid": invalid, "down": publish.down_hosts(hosts)}
    to_create, ret["existing"] = assign.plan(assigned, hosts)
    if host in ret["down"]:
        return _failed(f"{host} did not answer: {hosts[host].get('error')}", **ret, assigned=sorted(assigned))
    if validate.to_bool(dry_run):
        ret["would_create"] = to_create
        return ret
    for name in to_create:
        spec = dict(assigned[name])
        cpu, mem, image = spec.pop("cpu"), spec.pop("mem"), spec.pop("image", None)
        answer = __salt__["virt.init"](name, cpu, mem, image, host=host, fallback=False, saltenv=saltenv, **spec)
        data = answer.get("data", answer) if isinstance(answer, dict) else answer
        if isinstance(data, dict) and "error" not in data:
            ret["created"][name] = data
        else:
            ret["failed"][name] = data.get("error") if isinstance(data, dict) else data
    if ret["failed"] or ret["invalid"]:
        with contextlib.suppress(NameError):
            __context__["retcode"] = 1
    return ret
