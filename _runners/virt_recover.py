"""
Runner ``virt`` (continued): host-failure recovery and automatic HA's log, rebalancing and continuous balancing's
rounds (``saltvirt.fleet.recovery``, ``saltvirt.fleet.ha``, ``saltvirt.fleet.rebalance``,
``saltvirt.fleet.balancer``), and what interrupted inits left (``saltvirt.fleet.leftovers``). Salt's loader merges
every runner file whose ``__virtualname__`` is ``virt`` into one ``virt`` runner, as it does for the execution
modules.

Master config (every key optional; without ``virt:fence:command`` ``virt.recover`` refuses)::

    virt:
      fence:
        command: [/usr/local/sbin/fence-host, '{host}']   # no shell; {host}: the hypervisor's minion id
        timeout: 60                                        # seconds; it must exit 0 once the host is off
      recovery:
        probe_uri: 'qemu+tls://{host}/system'   # how other hypervisors check the down host's libvirtd
                                                # (default: the URI a migration to it would use)
        probes: 2                               # how many other hypervisors check it
        probe_wait: 10                          # seconds each check may take
"""

import contextlib
import logging
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
    from saltvirt.fleet import balance as _balance
    from saltvirt.fleet import (
        balancer,
        callers,
        fleetstate,
        ha,
        leftovers,
        placement,
        publish,
        recovery,
        relocate,
        tenants,
    )
    from saltvirt.fleet import rebalance as _rebalance

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext

log = logging.getLogger(__name__)
__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt runner: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def _conf():
    return config.master_virt(__opts__)[0]


def _fleet(client, tgt=None, tgt_type=None):
    """The transport to the hypervisors (``saltvirt.fleet.publish.Fleet``), narrowed to ``tgt`` for this call."""
    return publish.Fleet.of_master(__opts__, client, tgt=tgt, tgt_type=tgt_type)


def _client():
    import salt.client

    return salt.client.get_local_client(__opts__["conf_file"])


def _operator(fun):
    """These functions act on whole hypervisors: operators only (the job's Salt user, never an argument)."""
    tenants.operator_only(callers.job_caller(__opts__, globals(), __salt__), fun)


def _failed(exc):
    with contextlib.suppress(NameError):  # __context__ is injected by the loader
        __context__["retcode"] = 1
    return publish.failure(exc)


def record(tgt=None, tgt_type=None):
    """
    Record every hypervisor's VM definitions, states and storage markers on the master (Salt's cache,
    shared by every master with the same ``cache:``), for ``virt.recover`` when a host is down. Hosts
    that do not answer keep their last record. Hosts a ``virt.init`` abandoned (published there, no
    answer, fell over) get ``virt.cleanup`` of that VM once they answer (``abandoned_init_cleanup``).
    Schedule it on the master, e.g.
    ``schedule: {virt-record: {function: virt.record, minutes: 5}}``.

    CLI Example:: salt-run virt.record
    """
    try:
        _operator("virt.record")
        with _client() as client:
            remote = _fleet(client, tgt, tgt_type)
            out = recovery.refresh(remote)
            # hosts a virt.init abandoned (no answer, fell over): cleaned once they answer again
            call = leftovers.publish_call(remote)
            defined = leftovers.publish_defined(remote)
            healed = leftovers.heal(call, defined, fleetstate.Store(__opts__))
    except SaltException as exc:
        return _failed(exc)
    return dict(out, **({"abandoned_init_cleanup": healed} if healed else {}))


def cleanup(name, tgt=None, tgt_type=None):
    """
    Remove what interrupted ``virt.init`` runs of ``name`` left on the hypervisors (``virt.cleanup NAME``
    on each: disks recorded in a manifest, seeding mounts, a domain whose init never finished), judged by
    UUID across the fleet: every hypervisor is first asked which VM uuids it defines, and a hypervisor
    deletes a manifest's files only when no other one defines the uuid it records (a VM of that name may
    run from a shared ``virt:images`` elsewhere). While a hypervisor does not answer nothing is deleted. A
    complete VM is never touched (``virt.purge`` removes it). ``tgt``/``tgt_type`` narrow where cleanup
    runs; every hypervisor is still asked. Returns ``{hypervisor: virt.cleanup's answer or {error}}``.

    CLI Example:: salt-run virt.cleanup web1
    """
    try:
        _operator("virt.cleanup")
        validate.vm_name(name)
        with _client() as client:
            remote = _fleet(client, tgt, tgt_type)
            report = leftovers.cleanup_everywhere(remote, name, fleetstate.Store(__opts__))
    except SaltException as exc:
        return _failed(exc)
    if any("error" in answer or answer.get("errors") for answer in report.values()):
        with contextlib.suppress(NameError):  # __context__ is injected by the loader
            __context__["retcode"] = 1
    return report


def recover(host, force=False, **policy):
    """
    Restart the VMs of hypervisor ``host`` that is down on the other hypervisors (see
    ``docs/topics/recovery.md``). Refused unless its minion does not answer AND other hypervisors
    cannot reach its libvirtd, and unless the fence command (``virt:fence:command``) ran and exited 0.
    Only VMs whose disks are all on storage the chosen host shares are restarted (from the master's
    record, ``virt.record``; its age is reported); the others are listed with the reason. Targets are
    chosen by placement (policy keys apply to this call only). Right before each start, every
    hypervisor is asked again and the VM is claimed in the shared store: a copy anywhere, or another
    run's claim, refuses. ``force=True``: go on although other hypervisors do not answer (they might
    run the VMs: know that they do not), or over a claim a run that died left behind.

    CLI Example:: salt-run virt.recover hyper1
    """
    policy = {k: v for k, v in policy.items() if not k.startswith("__")}
    try:
        _operator("virt.recover")
        conf = _conf()
        pol = placement.make_policy(conf.get("placement"), **policy)
        with _client() as client:
            ret = recovery.recover(_fleet(client), host, conf, pol, force=validate.to_bool(force))
    except SaltException as exc:
        return _failed(exc)
    if ret.get("failed"):
        __context__["retcode"] = 1
    return ret


def reconcile(host):
    """
    After ``virt.recover HOST``, once HOST is back: undefine there (its disks are kept: they are shared
    and in use) every VM ``virt.recover`` restarted on another hypervisor, after checking it is stopped on
    HOST and defined elsewhere with the same UUID. A copy running on HOST is never touched and is
    reported under ``conflicts`` (exit code 1): stop one of the two copies yourself.

    CLI Example:: salt-run virt.reconcile hyper1
    """
    try:
        _operator("virt.reconcile")
        with _client() as client:
            ret = recovery.reconcile(_fleet(client), host)
    except SaltException as exc:
        return _failed(exc)
    if ret["conflicts"]:
        __context__["retcode"] = 1
    return ret


def rebalance(
    apply=False, metric="mem", threshold=None, max_moves=10, transport=None, tgt=None, tgt_type=None, **policy
):
    """
    Propose (the default, a dry run) or perform (``apply=True``) live migrations that bring the
    hypervisors' load within ``threshold``: ``metric=mem`` (running VMs' memory / usable memory, default
    threshold 0.10) or ``metric=vms`` (running VMs, default 2). Placement rules (room, anti-affinity,
    soft affinity, maintenance) decide where each VM may go. Each move is a ``virt.migrate`` (per-VM
    lock, shared storage used in place, other disks copied); ``transport=tcp`` asks for plaintext by name.

    CLI Example:

    .. code-block:: bash

        salt-run virt.rebalance
        salt-run virt.rebalance metric=vms threshold=1 apply=True
    """
    policy = {k: v for k, v in policy.items() if not k.startswith("__")}
    try:
        _operator("virt.rebalance")
        conf = _conf()
        pol = placement.make_policy(conf.get("placement"), **policy)
        with _client() as client:
            remote = _fleet(client, tgt, tgt_type)
            proposal = _rebalance.plan(remote.gather("virt.full_info"), pol, metric, threshold, max_moves)
            if not validate.to_bool(apply):
                return dict(proposal, dry_run=True)
            tunnel, timeout = relocate.settings(conf)
            done = _rebalance.apply(remote, proposal, tunnel=tunnel, timeout=timeout, transport=transport or None)
            if done["moved"]:
                try:
                    recovery.refresh(remote)  # the record follows the VMs (virt.recover reads it)
                except SaltException as exc:  # the moves are done: report them, and that the record is behind
                    done["record"] = f"not recorded again ({exc}): run salt-run virt.record"
    except SaltException as exc:
        return _failed(exc)
    if done["failed"]:
        __context__["retcode"] = 1
    return dict(proposal, dry_run=False, **done)


def balance(dry_run=True):
    """
    Run one round of continuous balancing now (``virt:balance`` in the master config, opt-in with
    ``virt:balance:enabled: True``; see ``docs/topics/recovery.md``). ``dry_run=True`` (the default) shows the
    round's decisions (every move, host held back, host no VM could leave, with the reason) without committing,
    logging or moving anything. ``dry_run=False`` commits the round (unless another master committed it first:
    ``committed: False``, nothing moved) and performs its moves as ``virt.migrate`` would (per-VM lock,
    placement checks, a tenant's quotas), then fires ``salt/virt/balance/round``. Nothing runs while another round
    is at work or a previous round's migrations may still run (``ran: False`` with the reason). Exits non-zero if
    a move failed. The master engine ``virt_balance`` runs rounds continuously.

    CLI Example:

    .. code-block:: bash

        salt-run virt.balance
        salt-run virt.balance dry_run=False
    """
    try:
        _operator("virt.balance")
        with _client() as client:
            ret = balancer.run_round(__opts__, client=client, dry_run=validate.to_bool(dry_run))
    except SaltException as exc:
        return _failed(exc)
    if ret.get("failed"):
        __context__["retcode"] = 1
    return ret


def balance_log(last=20):
    """
    The decision log of continuous balancing, oldest first: the last ``last`` records (at most the 200 the
    shared store keeps) of the rounds' decisions (``move``, ``hold``, ``stay``, ``max_moves``, ``balanced``) and
    of what each move did (``moved``, ``move_failed``), each with its round, time and reason.

    CLI Example:

    .. code-block:: bash

        salt-run virt.balance_log
        salt-run virt.balance_log last=100
    """
    try:
        _operator("virt.balance_log")
        last = validate.int_in(last, "last", 1, _balance.JOURNAL.size)
        return {"entries": _balance.JOURNAL.history(fleetstate.Store(__opts__), last)}
    except SaltException as exc:
        return _failed(exc)


def ha_log(last=20):
    """
    The decision log of automatic HA (the ``virt_ha`` engine, ``virt:ha``; see ``docs/topics/recovery.md``), oldest
    first: the last ``last`` records (at most the 200 the shared store keeps), each with its time, host, decision
    (``lost``, ``one_signal``, ``alert``, ``recovered``, ``recover_failed``, ``refused``, ``no_ha_vms``, ``back``)
    and the reason.

    CLI Example:

    .. code-block:: bash

        salt-run virt.ha_log
        salt-run virt.ha_log last=100
    """
    try:
        _operator("virt.ha_log")
        last = validate.int_in(last, "last", 1, ha.JOURNAL.size)
        return {"entries": ha.JOURNAL.history(fleetstate.Store(__opts__), last)}
    except SaltException as exc:
        return _failed(exc)
