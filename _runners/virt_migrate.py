"""
Runner ``virt`` (continued): moving VMs between hypervisors, ``virt.migrate`` (one VM) and ``virt.evacuate`` (every
VM of one host) (``saltvirt.fleet.relocate``; placement: ``saltvirt.fleet.placement``), and ``virt.roll`` (rolling
maintenance, ``saltvirt.fleet.roll``). Salt's loader merges every runner file whose ``__virtualname__`` is ``virt``
into one ``virt`` runner. Migration, TLS and the master config: docs/topics/runner.md.
"""

import contextlib
import os
import sys
import types
from typing import TYPE_CHECKING, Any

import salt.client
from salt.exceptions import SaltException, SaltInvocationError

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
    from saltvirt.fleet import callers, hypervisors, placement, publish, relocate, runprogress, tenants, vmselect
    from saltvirt.fleet import roll as _roll

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext
    __jid_event__: Any

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt runner: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def _failed(exc):
    """The answer for a failure, as the other ``virt`` runner functions give it (``virt_query`` outputter)."""
    with contextlib.suppress(NameError):  # __context__ is injected by the loader
        __context__["retcode"] = 1
    return {"outputter": "virt_query", "data": publish.failure(exc)}


def _virt_conf():
    return config.master_virt(__opts__)[0]


def _fleet(client, tgt=None, tgt_type=None):
    """The transport to the hypervisors (``saltvirt.fleet.publish.Fleet``), narrowed to ``tgt`` for this call."""
    return publish.Fleet.of_master(__opts__, client, tgt=tgt, tgt_type=tgt_type)


def migrate(
    name=None,
    target=None,
    host=None,
    live=True,
    tunnel=None,
    copy_storage=None,
    max_downtime=None,
    max_bandwidth=None,
    tgt=None,
    tgt_type=None,
    transport=None,
    ignore_placement=False,
    select=None,
    test=False,
):
    """
    Move a VM to the hypervisor minion ``target``, live if it runs (its guest keeps running). The
    runner finds the VM's hypervisor, checks that the target may take it as ``virt.init`` checks a new
    VM (room for its memory and vCPUs, reserved there until the move ends; not in maintenance; no VM of
    its anti-affinity group there; for a tenant's VM, its quotas of the target's hypervisor groups), asks
    the target to prepare (storage it shares with the source
    is used in place, proven with a probe file; for the rest it checks room and creates disk files of
    the right size and format, qcow2 overlays onto its copy of the backing image), then the source's
    libvirtd migrates peer to peer, copying the disks that are not shared. The VM ends up defined on
    the target and undefined on the source.

    On failure the error says why and where the VM is (still on the source); what the target had
    prepared is removed again.

    transport
        the libvirtd-to-libvirtd connection: TLS (port 16514, the certificates ``virt.keys`` writes) unless
        ``transport=tcp`` asks for plaintext by name (the result then carries ``warnings``).
    tunnel
        tunnel the migration through the TLS libvirtd connection (port 16514); default: the master
        config's ``virt:tunnel``. libvirt cannot tunnel a disk copy: then the libvirtd connection is
        TLS and the data goes over a direct stream (reported as ``note``).
    copy_storage
        ``all`` (full copies) or ``inc`` (overlays onto the backing image, which the target must
        have); default: decided per VM (``inc`` when the target has every backing image).
    host
        the VM's hypervisor, if its name is ambiguous.
    max_downtime / max_bandwidth
        milliseconds the guest may pause at the switch-over / MiB/s for the migration stream.
    ignore_placement
        operators only: skip the placement checks and move it anyway (said in the answer's ``warnings``).

    select
        instead of ``name``: every VM a selection in Salt's compound syntax picks from the facts the hypervisors
        signed (docs/topics/resources.md, "Fleet operations on a selection"), one after the other to ``target``,
        each as a named call moves it (a VM already there is skipped); one result per VM. ``test=True`` only
        lists the selection. ``virt.evacuate select=`` lets placement choose each VM's host.

    Master config: ``virt:tunnel`` (bool), ``virt:migration_timeout`` (seconds, default 3600).

    CLI Example:

    .. code-block:: bash

        salt-run virt.migrate web1 hyper2
        salt-run virt.migrate db1 hyper3 tunnel=True max_downtime=300
        salt-run virt.migrate db1 hyper3 ignore_placement=True
        salt-run virt.migrate select='T@virt_vm and G@group:db' target=hyper3
        salt-run virt.migrate select='G@group:db and M@hyper1' target=hyper3 test=True
    """
    how = {
        "live": validate.to_bool(live),
        "copy_storage": copy_storage or None,
        "max_downtime": max_downtime,
        "max_bandwidth": max_bandwidth,
        "transport": transport or None,
    }
    try:
        if select is None:
            if name is None:
                raise SaltInvocationError(
                    "virt.migrate needs a VM name, or select=<selection> (docs/topics/resources.md)"
                )
            validate.vm_name(name)
        who = callers.job_caller(__opts__, globals(), __salt__)
        forced = validate.to_bool(ignore_placement)
        relocate.refuse_migrate_args(who, name, host, target, select, forced, test)
        pol = placement.make_policy(_virt_conf().get("placement"))
        tunnel, timeout = relocate.settings(_virt_conf(), tunnel)
        with salt.client.get_local_client(__opts__["conf_file"]) as client:
            remote = _fleet(client, tgt, tgt_type)

            def move(vm_name, source):
                return relocate.move_one(remote, who, vm_name, target, source, pol, forced, tunnel, timeout, how)

            if select is None:
                return move(name, host)
            _seen, selection = vmselect.fleet_selection(remote, who, select)
            selection = vmselect.unique_names(selection)
            if validate.to_bool(test):
                return vmselect.answer(selection, test=True)

            def act(vm):
                return {"skipped": f"already on {target}"} if vm["host"] == target else move(vm["name"], vm["host"])

            out = vmselect.answer(selection, vmselect.each(selection, act))
    except SaltException as exc:
        return _failed(exc)
    if out.get("retcode"):
        __context__["retcode"] = 1
    return out


def evacuate(
    host=None, live=True, tunnel=None, dry_run=False, tgt=None, tgt_type=None, transport=None, select=None, **policy
):
    """
    Move every VM off hypervisor minion ``host`` (for maintenance), one at a time, each to the host
    placement ranks best (see ``virt.next_host``: memory, vCPUs, anti-affinity groups, maintenance);
    a target that fails is skipped and the next one tried while the VM is still on ``host``. Add
    ``host`` to ``virt:placement:maintenance`` to keep new VMs off it meanwhile.

    dry_run
        only show where each VM would go.
    transport
        as in ``virt.migrate``: TLS unless ``tcp`` is asked for by name.

    Policy keys (``maintenance``, ``strategy``, ``mem_reserve_mib``, ...) apply to this call only.
    Exits non-zero if a VM could not be moved (listed under ``failed`` with the reasons).

    CLI Example:

    .. code-block:: bash

        salt-run virt.evacuate hyper1 dry_run=True
        salt-run virt.evacuate hyper1
        salt-run virt.evacuate select='T@virt_vm and G@group:db and M@hyper1' dry_run=True

    select
        instead of ``host``: move every VM a selection in Salt's compound syntax picks from the facts the
        hypervisors signed (docs/topics/resources.md, "Fleet operations on a selection") off its hypervisor, each
        to the host placement ranks best; the answer also says what was ``selected`` and ``refused``.
        ``tgt``/``tgt_type`` narrow where VMs are picked, not where they may go.
    """
    policy = {k: v for k, v in policy.items() if not k.startswith("__")}
    try:
        tenants.operator_only(callers.job_caller(__opts__, globals(), __salt__), "virt.evacuate")
        tunnel, timeout = relocate.settings(_virt_conf(), tunnel)
        pol = placement.make_policy(_virt_conf().get("placement"), **policy)
        how = {"live": validate.to_bool(live), "tunnel": tunnel, "dry_run": validate.to_bool(dry_run)}
        how.update(timeout=timeout, transport=transport or None)
        with salt.client.get_local_client(__opts__["conf_file"]) as client:
            if select is None:
                ret = relocate.evacuate(_fleet(client, tgt, tgt_type), host, pol, **how)
            else:
                ret = _evacuate_selection(client, host, select, tgt, tgt_type, pol, how)
    except SaltException as exc:
        return _failed(exc)
    if ret.get("failed") or ret.get("cannot_place") or ret.get("retcode"):
        __context__["retcode"] = 1
    return ret


def _evacuate_selection(client, host, select, tgt, tgt_type, pol, how):
    """``virt.evacuate select=``: the selection's VMs moved off their hypervisors (``relocate.move_off``), with
    the selection in the answer."""
    if host is not None:
        raise SaltInvocationError("virt.evacuate: select= picks the VMs: drop the hypervisor")
    who = callers.job_caller(__opts__, globals(), __salt__)
    facts, selection = vmselect.fleet_selection(_fleet(client, tgt, tgt_type), who, select)
    selection = vmselect.unique_names(selection)
    picks = [(vm["host"], vm["name"]) for vm in selection["selected"]]
    remote = _fleet(client)  # every hypervisor is a candidate target
    moves = relocate.move_off(remote, facts, picks, pol, **how)
    out = {**vmselect.answer(selection, {}), **moves}
    out.pop("results")  # moved / failed (plan / cannot_place) are the per-VM results
    return out


def _roll_progress(host, step, message):
    """A ``[progress]`` line under salt-run and ``salt/virt/roll/<step>`` on the bus (announcements only)."""
    with contextlib.suppress(NameError):  # __jid_event__ is injected by the runner client
        runprogress.show(__opts__, __jid_event__, message)
    runprogress.fire(__opts__, _roll.TAG + step, {"host": host, "step": step, "message": message})


def roll(
    tgt,
    state=None,
    reboot=False,
    batch=1,
    balance=False,
    timeout=None,
    test=False,
    tgt_type=None,
    transport=None,
    **policy,
):
    """
    Rolling maintenance of the hypervisors ``tgt`` matches (a glob, a list, a compound: among the configured
    hypervisors, as ``tgt=`` of the other ``virt`` runners), ``batch`` at a time: maintenance on (placement
    skips the host) -> every VM evacuated as ``virt.evacuate`` moves them -> the host's own states
    (``state``: SLS names, or ``highstate``) -> ``reboot=True``: reboot and wait for the host's signed answers
    (a new boot id, libvirtd) -> maintenance off; ``balance=True``: one ``virt.rebalance`` round at the end.
    Stops at the first failure (``stopped``: host, step, reason, a state's failed ids): that host stays out
    of service, the VMs moved so far keep running where they are, the hosts after it are untouched.
    ``test=True``: changes nothing, says what it would do (the states' own dry run). ``timeout``: seconds
    for one host's states, and for it to answer again after its reboot (default 900). Policy keys (``strategy``,
    ``mem_reserve_mib``, ...) apply to this call only. Exits non-zero if the roll stopped or a VM that ran
    before does not run exactly once after. See docs/topics/maintenance.md.

    CLI Example:

    .. code-block:: bash

        salt-run virt.roll 'hyper*' state=pkg_upgrade reboot=True test=True
        salt-run virt.roll hyper1,hyper2 tgt_type=list state=highstate reboot=True balance=True
    """
    policy = {k: v for k, v in policy.items() if not k.startswith("__")}
    try:
        tenants.operator_only(callers.job_caller(__opts__, globals(), __salt__), "virt.roll")
        states, reboot, batch, timeout = _roll.options(state, reboot, batch, timeout)
        tunnel, migrate_timeout = relocate.settings(_virt_conf())
        pol = placement.make_policy(_virt_conf().get("placement"), **policy)
        hosts = hypervisors.narrow(__opts__, tgt, tgt_type)
        with salt.client.get_local_client(__opts__["conf_file"]) as client:
            roller = _roll.Roll(
                _fleet(client),
                pol,
                states=states,
                reboot=reboot,
                test=validate.to_bool(test),
                timeout=timeout,
                migration={"tunnel": tunnel, "timeout": migrate_timeout, "transport": transport or None},
                progress=_roll_progress,
            )
            ret = _roll.roll(roller, hosts, batch=batch, balance=validate.to_bool(balance))
    except SaltException as exc:
        return _failed(exc)
    if ret["stopped"] or ret["vms"]["not_running"] or ret["vms"]["twice"]:
        __context__["retcode"] = 1
        ret["retcode"] = 1  # salt-run's exit code comes from the answer's own retcode
    return ret
