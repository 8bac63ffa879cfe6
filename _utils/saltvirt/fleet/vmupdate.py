"""The master side of ``salt-run virt.update``: one VM changed where it is defined, within its tenant's quota.

The runner finds the VM (for a tenant caller among its tenant's VMs only) and calls :func:`update`, which
holds the VM's per-name lock (the one ``virt.init`` and migrations take), takes what the change adds from
the tenant's quota (a growth entry, :func:`saltvirt.fleet.quota.reserve` with ``grow=True``: the same
compare-and-set as ``virt.init``'s), runs the hypervisor's ``virt.update`` and settles the quota with the
VM's new sizes (or gives it back when the update failed). An operator's update is not refused by a quota, but
what it gives a tenant's VM goes into that VM's ledger entry. The arguments are the module's
(:mod:`saltvirt.model.vmargs`); the hypervisor checks their values as for any ``virt.update``.
"""

import time
from collections.abc import Callable
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import fleetstate, publish, quota
from saltvirt.model import compat, vmargs

FUN = "virt.update"


def arguments(kwargs: Data) -> Data:
    """The keywords a runner call passes on to the hypervisor's ``virt.update``: the loader's ``__`` keys
    dropped, Salt's spellings mapped (``nic_profile`` -> ``nic``, ``disk_profile`` -> ``disk``), what the
    runner sets itself (``connection``) and names ``virt.update`` does not take refused."""
    kwargs = {k: v for k, v in kwargs.items() if not str(k).startswith("__")}
    for old, new in vmargs.update_renames().items():
        if old in kwargs:
            if new in kwargs:
                raise SaltInvocationError(f"salt-run virt.update: give {new}= or {old}= (Salt's name), not both")
            kwargs[new] = kwargs.pop(old)
    where = "salt-run virt.update"
    table = vmargs.BY_NAME
    refused = sorted(k for k in kwargs if k in table and table[k].update and table[k].runner == vmargs.REFUSE)
    if refused:
        raise SaltInvocationError(f"{where}: {refused[0]}= is not forwarded: {vmargs.BY_NAME[refused[0]].refusal}")
    compat.refuse_unknown(kwargs, [*vmargs.UPDATE_KWARGS, *vmargs.UPDATE_ONLY], where)
    return kwargs


def sizes(cpu: Any, mem: Any) -> tuple[int | None, int | None]:
    """A tenant's ``cpu``/``mem``: whole numbers (vCPUs, MiB) or not given (None, Salt's 0): what its quota
    counts (Salt's cpu/mem mappings, with host CPU pinning and NUMA placement, stay with the operator)."""

    def one(value: Any, what: str) -> int | None:
        return None if value in (None, 0, "0") else validate.positive_int(value, what)

    return one(cpu, "cpu"), one(mem, "mem (MiB)")


def growth(vm: Data, cpu: int | None, mem: int | None, added: Data | None = None) -> Data:
    """What an update adds to a VM (``vm``: its ``virt.full_info`` entry): ``{cpu, mem, disk_mib}``, the
    positive part of each change over what its quota counts (:func:`saltvirt.fleet.quota.size`); ``added``: the
    hypervisor's ``changes`` of a ``test=True`` run (new blank disks count with their size; an existing file
    attached is none of the quota's)."""
    disks = ((added or {}).get("disks") or {}).get("added") or []
    return {
        "cpu": max(0, cpu - quota.size(vm, "cpu")) if cpu else 0,
        "mem": max(0, mem - quota.size(vm, "mem")) if mem else 0,
        "disk_mib": sum(int(d.get("size") or 0) for d in disks if not d.get("attach")),
    }


def _record(store: fleetstate.Store, name: str, changes: Data | None) -> None:
    """An operator's update of a tenant's VM in its tenant's ledger entry (:func:`saltvirt.fleet.quota.record`):
    the new vCPUs and memory the hypervisor reports, and the new blank disks' sizes."""
    changes = changes or {}
    to = {k: (changes.get(k) or {}).get("new") for k in ("cpu", "mem")}
    to = {k: v for k, v in to.items() if isinstance(v, int) and not isinstance(v, bool)}
    added = growth({}, None, None, changes)["disk_mib"]
    if to or added:
        quota.record(store, name, to, added)


def _answer(where: str, name: str, ans: Data) -> Data:
    if ans.get("status") != "up":
        raise publish.Failed(f"{FUN} {name} on {where}: {ans.get('status')}: {ans.get('error')}", host=where)
    return ans["ret"]


def update(
    opts: SaltOpts,
    name: str,
    cpu: Any,
    mem: Any,
    kwargs: Data,
    *,
    locate: Callable[[], tuple[str, dict[str, Data]]],
    call: Callable[[str, str, list[Any], Data], Data],
    tenant: Data | None = None,
    job: str | None = None,
    store: fleetstate.Store | None = None,
) -> Data:
    """Update VM ``name`` where it is defined; the module's answer with ``host``.

    ``locate()``: ``(host, fleet snapshot)`` taken now (``virt.full_info`` of every hypervisor when ``tenant`` is
    given: what its quota counts, :func:`saltvirt.fleet.tenants.where`);
    ``call(host, fun, args, kwargs)``: one hypervisor's answer (:meth:`saltvirt.fleet.publish.Fleet.call`);
    ``tenant``: ``{name, quota, groups}`` whose quota (and quotas per hypervisor group) the growth is taken
    from (a tenant caller), or None (an operator: not counted). Raises
    :class:`saltvirt.fleet.quota.QuotaError` when the growth does not fit. A tenant caller is told whose
    call holds the VM's lock only for its own VM: for another (another tenant's VM being created, moved or
    changed), ``locate()``'s refusal, as for a VM that does not exist."""
    try:
        return _update(opts, name, cpu, mem, kwargs, locate, call, tenant, job, store)
    except fleetstate.HeldError:
        if tenant is not None:
            locate()  # a VM the tenant does not see: the same refusal as for a name nobody has
        raise


def _update(opts, name, cpu, mem, kwargs, locate, call, tenant, job, store):
    test = validate.to_bool(kwargs.get("test", False))
    with fleetstate.lock(opts, [name], kind=FUN, job=job, store=store) as lease:
        try:
            since = time.time()
            where, hosts = locate()
            args = dict(kwargs, cpu=cpu, mem=mem)
            if tenant and not test:
                trial = None
                if "disks" in kwargs or "disk" in kwargs:  # the disks it adds, as the hypervisor builds them
                    trial = _answer(where, name, call(where, FUN, [name], dict(args, test=True)))["changes"]
                grown = growth(hosts[where]["vm_info"][name], cpu, mem, trial)
                if any(grown.values()):
                    to = {"cpu": cpu, "mem": mem}
                    quota.reserve(
                        lease.store,
                        lease,
                        tenant["name"],
                        name,
                        grown,
                        hosts,
                        since,
                        tenant["quota"],
                        grow=to,
                        host=where,
                        groups=tenant.get("groups"),
                    )
            lease.check()  # never change a VM whose lock we no longer hold
            lease.note(host=where)
            ans = call(where, FUN, [name], args)
            if ans.get("status") in ("down", "timeout"):  # it may still apply: the growth stays counted a while
                quota.finish(lease.store, lease, "unknown")
            ret = _answer(where, name, ans)
            quota.finish(lease.store, lease, "settled")
            if not tenant and not test:  # an operator's change: not refused, but the tenant's usage shows it
                _record(lease.store, name, ret.get("changes"))
        finally:  # refused, failed, or the hypervisor said no: the growth is given back (no-op once ended)
            quota.finish(lease.store, lease, "failed")
    return dict(ret, host=where)
