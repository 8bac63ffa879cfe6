"""
Runner ``virt`` (continued): ``salt-run virt.backup`` backs VMs up on their hypervisors with retention,
``salt-run virt.restore`` restores one where it cannot run twice (``saltvirt.fleet.backups``; the
hypervisor side: ``saltvirt.vm.backup``, ``saltvirt.vm.restore``). Salt's loader merges every
runner file whose ``__virtualname__`` is ``virt`` into one ``virt`` runner. Nightly runs and the master
config: docs/topics/backups.md.
"""

import contextlib
import logging
import os
import sys
import time
import types
from typing import TYPE_CHECKING

from salt.exceptions import CommandExecutionError, SaltException, SaltInvocationError

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
    from saltvirt.fleet import backups, callers, fleetstate, publish, quota, runprogress, tenants, vmselect

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from salt.utils.event import NamespacedEvent

    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext
    __jid_event__: NamespacedEvent

log = logging.getLogger(__name__)
__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt runner: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def _show(message):
    """A ``[progress]`` line under salt-run (not with machine outputs); never fails the work."""
    runprogress.show(__opts__, globals().get("__jid_event__"), message)  # injected only under a RunnerClient


def backup(
    name="all",
    incremental=True,
    per_host=None,
    timeout=None,
    tgt=None,
    tgt_type=None,
    tenant=None,
    select=None,
    test=False,
    **retention,
):
    """
    Back up VM ``name`` (or every VM, ``all``) on the hypervisor that defines it: incremental from the
    last backup when possible (``incremental=False``: full), ``per_host`` at a time on one hypervisor
    (default ``virt:backup:per_host``, 1), then apply retention (``keep=N``, ``keep_daily=N``,
    ``keep_weekly=N``; default ``virt:backup:retention``; a backup another one builds on is never
    pruned). With ``virt:tenants``, a tenant member backs up its own tenant's VMs only, with the master
    config's ``per_host``, ``timeout`` and retention (passing them is refused); an operator may pass
    ``tenant=NAME`` to back up that tenant's VMs only. Returns ``{made: {vm: {host, id, type,
    size, ...}}, pruned: {vm: {pruned, kept}}, failed: {vm: why}, down: [hosts]}`` and, when a tenant has a
    ``backup_mib`` quota, ``backup_mib: {tenant: {used, quota}}`` (a tenant's VM is backed up only while its
    backups take less); the exit code is 1 when anything failed.

    CLI Example::

        salt-run virt.backup all keep_daily=7 keep_weekly=4
        salt-run virt.backup web1 incremental=False
        salt-run virt.backup all tenant=acme
        salt-run virt.backup select='T@virt_vm and G@group:db'
        salt-run virt.backup select='G@group:db' test=True

    ``select``: back up the VMs a selection in Salt's compound syntax picks, from the facts the hypervisors signed
    (docs/topics/resources.md, "Fleet operations on a selection"); the answer also says what was ``selected`` and
    ``refused``; ``test=True`` only lists the selection.
    """
    try:
        who = callers.job_caller(__opts__, globals(), __salt__)
        backups.operator_args(who, "virt.backup", {"per_host": per_host, "timeout": timeout, **retention})
        tconf = tenants.config(__opts__)
        only = backups.scope(who, tenant, tconf)
        conf = config.master_virt(__opts__)[0].get("backup")
        cfg = backups.settings(conf, per_host, timeout, **retention)
        fleet = publish.Fleet.of_master(__opts__, tgt=tgt, tgt_type=tgt_type)
        quotas = backups.backup_quotas(tconf, only)
        selection, hosts, owners, work, problems = backups.work(fleet, who, name, only, select, test, bool(quotas))
        if selection is not None and validate.to_bool(test):
            return vmselect.answer(selection, test=True)
        budget = backups.budget(fleet, quotas, owners) if quotas else None

        def call(host, fun, args, kwargs, max_wait):
            return fleet.call(host, fun, args, kwargs, max_wait=max_wait)[0]

        count = sum(len(v) for v in work.values())
        _show(f"backing up {count} VM(s) on {len(work)} hypervisor(s), {cfg['per_host']} at a time per host")
        out = backups.run(call, work, cfg, incremental=validate.to_bool(incremental), progress=_show, budget=budget)
    except SaltException as exc:
        with contextlib.suppress(NameError):
            __context__["retcode"] = 1
        return {"error": str(exc), "retcode": 1}
    out["failed"].update(problems)
    out["down"] = publish.down_hosts(hosts)
    if budget:
        out["backup_mib"] = budget.report()
    if selection is not None:
        out = {**vmselect.answer(selection, {}), **out}
        out.pop("results")  # made / pruned / failed are the per-VM results
    if out["failed"] or out.get("retcode"):
        __context__["retcode"] = 1
        out["retcode"] = 1  # what salt-run's exit code follows (as the other virt runner functions do)
    return out


def restore(name, id, host=None, as_name=None, start=False, force=None, ignore_down=None, **kwargs):
    """
    Restore backup ``id`` of VM ``name`` on hypervisor ``host`` (one that mounts the backup directory;
    default: the hypervisor that defines ``name``, a restore in place) with its ``virt.restore``. Every
    hypervisor is asked first, so that one VM never runs twice: under the same name the restore is
    refused while ``name`` is defined on another hypervisor, or while a hypervisor does not answer
    (``ignore_down=True``: you know it runs nothing); ``as_name=NEW`` (or ``as=NEW``) restores a copy
    with a new name, uuid and MAC addresses, refused while ``NEW`` is defined anywhere. ``force`` and
    ``start`` are those of the module; ``force`` and ``ignore_down`` are the operator's.

    With ``virt:tenants``, a tenant member restores its own tenant's backups only (the owner the backup
    recorded in the VM's domain XML), in place only over its own stopped VM, on its hypervisors; a restore that
    makes a VM (``as=NEW``, or a VM defined nowhere) takes it from the tenant's quota as ``virt.init`` does,
    and one in place of a bigger backup what it grows the VM by, as ``virt.update`` does.

    CLI Example::

        salt-run virt.restore web1 20260101T020000Z host=hyper2
        salt-run virt.restore web1 20260101T020000Z host=hyper2 as=web1-copy start=True
    """
    as_name = as_name or kwargs.pop("as", None)
    unknown = sorted(k for k in kwargs if not k.startswith("__"))
    try:
        if unknown:
            raise SaltInvocationError(f"unknown argument(s) {', '.join(unknown)} to virt.restore")
        who = callers.job_caller(__opts__, globals(), __salt__)
        backups.operator_args(who, "virt.restore", {"force": force, "ignore_down": ignore_down})
        validate.vm_name(name)
        new = validate.vm_name(as_name, "as_name") if as_name else name
        conf = config.master_virt(__opts__)[0].get("backup")
        wait = backups.settings(conf)["timeout"]
        fleet = publish.Fleet(__opts__, publish.config(config.master_opts(__opts__)))  # every hypervisor
        with _restore_lock(who, name, as_name, fleet) as lease:
            try:
                since = time.time()
                fun = "virt.vm_state" if who.operator else "virt.full_info"  # a tenant's: who owns what
                full = fleet.gather(fun)
                hosts = full if who.operator else backups.vm_states(full)
                if not who.operator:  # first: restore_host's refusals name any VM's hypervisor
                    backups.tenant_names(who, full, name, as_name)
                where, down = backups.restore_host(hosts, name, host, as_name, validate.to_bool(ignore_down))
                if not who.operator:
                    _tenant_restore(who, full, name, id, where, as_name, fleet, lease, since)
                args = {"as_name": as_name, "start": validate.to_bool(start), "force": validate.to_bool(force)}
                _show(f"restoring backup {id} of VM {name} on {where}" + (f" as {as_name}" if as_name else ""))
                ans = fleet.call(where, "virt.restore", [name, id], args, max_wait=wait)[0]
                if ans.get("status") in ("down", "timeout"):  # it may still make the VM: its quota stays a while
                    quota.finish(lease.store, lease, "unknown", keep_for=wait)
                if ans.get("status") != "up":
                    raise CommandExecutionError(f"virt.restore on {where}: {ans.get('error') or ans.get('status')}")
                quota.finish(lease.store, lease, "settled")
            finally:  # refused or failed: the quota it took is given back (no-op once ended)
                quota.finish(lease.store, lease, "failed")
    except SaltException as exc:
        with contextlib.suppress(NameError):
            __context__["retcode"] = 1
        return {"error": str(exc), "retcode": 1}
    return {"name": new, "host": where, "down": down, "result": ans["ret"]}


@contextlib.contextmanager
def _restore_lock(who, name, as_name, fleet):
    """The per-name lock of the VM a restore makes; a tenant member that finds it held is told whose call
    holds it only when it restores its own VM in place (``saltvirt.fleet.backups.tenant_held``)."""
    with contextlib.ExitStack() as stack:
        try:
            lease = stack.enter_context(fleetstate.lock(__opts__, [as_name or name], kind="virt.restore"))
        except fleetstate.HeldError:
            if not who.operator:
                backups.tenant_held(who, lambda: fleet.gather("virt.full_info"), name, as_name)
            raise
        yield lease


def _tenant_restore(who, full, name, bid, where, as_name, fleet, lease, since):
    """A tenant member's restore: its own backup (``virt.backup_list`` on ``where``), and what it adds taken
    from its quota (``saltvirt.fleet.backups.reserve_restore``)."""
    listing = fleet.call(where, "virt.backup_list", [name])[0]
    if listing.get("status") != "up":
        raise CommandExecutionError(f"virt.backup_list on {where}: {listing.get('error') or listing.get('status')}")
    tconf = tenants.config(__opts__)["tenants"][who.tenant]
    backups.reserve_restore(lease, who, tconf, full, listing["ret"], name, bid, where, since, as_name)
