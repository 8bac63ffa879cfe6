"""Tenants of the private cloud: the operator's ``virt:tenants`` and ``virt:operators`` (master config).

::

    virt:
      operators: [ops, 'admins%']        # Salt users, and OS groups on the master written 'group%'
      hypervisor_groups: {gpu: ['gpu*']}   # named sets of hypervisors (minion id globs), for group_quotas
      tenants:
        acme:
          members: [alice, 'acme-devs%']
          quota: {vcpus: 16, mem: 32768, disk: 204800, vms: 10}   # mem/disk in MiB; a missing key: no limit
                                           # (also backup_mib: what its backups take in the backup directories)
          group_quotas: {gpu: {vcpus: 4}}  # per group of virt:hypervisor_groups: its VMs there, together
          images: [debian12]               # names in virt:catalog; tenants use catalog images only
          profiles: [default]              # nic/disk profiles (the minion's virt:nic / virt:disk); default [default]
          networks: [default]              # interfaces: [{source: <network or bridge>}]; default: none
          pools: []                        # disks: [{pool: <pool>}]; default: none
          hypervisors: ['hyper*']          # minion id globs the tenant's VMs may land on; default: all

Who is the caller and whether it is an operator: :mod:`saltvirt.fleet.callers`. What a tenant caller may
pass to ``virt.init``: :func:`check_init`.
"""

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import virt_conf
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import publish
from saltvirt.model import checks, tenancy, vmspec

QUOTA_KEYS = {"vcpus": "vCPUs", "mem": "MiB memory", "disk": "MiB disk", "vms": "VMs"}
# what the tenant's backups take in the backup directories (saltvirt.fleet.backups.Budget): not a VM's resource
BACKUP_QUOTA = "backup_mib"
TENANT_KEYS = ("members", "quota", "group_quotas", "images", "profiles", "networks", "pools", "hypervisors")
# what a tenant may pass to salt-run virt.init besides name/cpu/mem/image: no path, URI, device or trust flag
INIT_KWARGS = frozenset(
    {"nic", "disk", "interfaces", "disks", "start", "seed", "group", "affinity", "enable_qcow", "enable_vnc"}
    | {"wait", "wait_timeout", "saltenv", "cloud_init", "guest_agent", "host", "fallback", "ha"}
)
# what a tenant may pass to salt-run virt.update besides name/cpu/mem (Salt's nic_profile/disk_profile mapped first)
UPDATE_KWARGS = frozenset({"nic", "disk", "interfaces", "disks", "enable_vnc", "live", "test", "autostart", "ha"})
NIC_KEYS = frozenset({"name", "source", "network", "bridge", "type", "model", "mac"})
DISK_KEYS = frozenset({"name", "size", "format", "pool", "bus", "model"})  # no image, path or volume: a new disk


@dataclass(frozen=True)
class Caller:
    """The caller of one runner job: its Salt user, whether it is an operator, its tenant (or None).
    :func:`saltvirt.fleet.callers.resolve` decides it; it is defined here, below that module, because what a
    caller may see and do is decided here."""

    user: str
    operator: bool
    tenant: str | None = None
    why: str = ""  # how the role was decided (shown by salt-run virt.whoami)
    groups: tuple = field(default=())


def _keys(entry, allowed, what, tenant_name):
    if not isinstance(entry, dict):
        raise SaltInvocationError(f"{what} entries must be mappings, not {entry!r}")
    extra = sorted(set(entry) - allowed)
    if extra:
        raise SaltInvocationError(
            f"tenant {tenant_name} may not set {', '.join(extra)} in {what} (allowed: {', '.join(sorted(allowed))})"
        )


def _names(value, where):
    return [] if value is None else list(validate.config_names(value, where, "master config"))


def _quota(value, where, extra=()):
    value = value or {}
    known = [*QUOTA_KEYS, *extra]
    if not isinstance(value, dict):
        raise SaltInvocationError(f"{where} must be a mapping of {', '.join(known)}, not {value!r}")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise SaltInvocationError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    out = {}
    for key, limit in value.items():
        if limit is None:
            continue
        try:
            out[key] = int(limit)
        except (TypeError, ValueError):
            raise SaltInvocationError(f"{where}:{key} must be a whole number, not {limit!r}") from None
        if out[key] < 0:
            raise SaltInvocationError(f"{where}:{key} must be >= 0, not {limit!r}")
    return out


def _hypervisor_groups(value):
    """``virt:hypervisor_groups``: ``{group: [minion id globs]}``."""
    value = value or {}
    if not isinstance(value, dict):
        raise SaltInvocationError(f"virt:hypervisor_groups must be a mapping of group names, not {value!r}")
    return {validate.vm_name(g, "hypervisor group"): _names(v, f"virt:hypervisor_groups:{g}") for g, v in value.items()}


def _group_quotas(value, where, groups):
    """A tenant's ``group_quotas`` (``{group: quota}``, groups of ``virt:hypervisor_groups``) as
    ``{group: {hypervisors: [globs], quota: {...}}}``."""
    value = value or {}
    if not isinstance(value, dict):
        raise SaltInvocationError(f"{where} must be a mapping of hypervisor groups, not {value!r}")
    unknown = sorted(str(g) for g in value if g not in groups)
    if unknown:
        known = ", ".join(sorted(groups)) or "none"
        raise SaltInvocationError(
            f"{where}: {', '.join(unknown)} is no group of virt:hypervisor_groups (known: {known})"
        )
    return {g: {"hypervisors": groups[g], "quota": _quota(q, f"{where}:{g}")} for g, q in value.items()}


def in_groups(groups: Data, host: str | None) -> list[str]:
    """The names of ``groups`` (a tenant's checked ``groups``) whose hypervisors include ``host``."""
    return [g for g, conf in sorted(groups.items()) if host and host_allowed(conf, host)]


def config(opts: SaltOpts) -> Data:
    """``{operators: [...], tenants: {name: {members, quota, groups, images, profiles, networks, pools,
    hypervisors}}}`` checked (``groups``: ``{hypervisor group: {hypervisors, quota}}`` from the tenant's
    ``group_quotas`` and ``virt:hypervisor_groups``); an empty ``tenants`` means the feature is off."""
    virt = virt_conf(opts)
    raw = virt.get("tenants") or {}
    if not isinstance(raw, dict):
        raise SaltInvocationError(f"virt:tenants must be a mapping of tenant names, not {raw!r}")
    tenants: dict[str, Data] = {}
    owner: dict[str, str] = {}
    groups = _hypervisor_groups(virt.get("hypervisor_groups"))
    for name, given in raw.items():
        validate.vm_name(name, "tenant")
        conf = given or {}
        where = f"virt:tenants:{name}"
        if not isinstance(conf, dict):
            raise SaltInvocationError(f"{where} must be a mapping, not {conf!r}")
        unknown = sorted(set(conf) - set(TENANT_KEYS))
        if unknown:
            raise SaltInvocationError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(TENANT_KEYS)})")
        t = {key: _names(conf.get(key), f"{where}:{key}") for key in TENANT_KEYS if "quota" not in key}
        t["quota"] = _quota(conf.get("quota"), f"{where}:quota", extra=[BACKUP_QUOTA])
        t["groups"] = _group_quotas(conf.get("group_quotas"), f"{where}:group_quotas", groups)
        if "profiles" not in conf:
            t["profiles"] = ["default"]
        if "hypervisors" not in conf:
            t["hypervisors"] = ["*"]
        for member in t["members"]:
            if member in owner:
                raise SaltInvocationError(
                    f"{member} is a member of tenants {owner[member]} and {name}: a Salt user belongs to one tenant"
                )
            owner[member] = name
        tenants[name] = t
    return {"operators": _names(virt.get("operators"), "virt:operators"), "tenants": tenants}


def matches(entries: Iterable[str], user: str, groups: Iterable[str] = ()) -> bool:
    """True if ``user`` (or one of its ``groups``, written ``group%`` as Salt's ACLs) is in ``entries``."""
    for entry in entries:
        if entry.endswith("%"):
            if entry[:-1] in groups:
                return True
        elif entry == user:
            return True
    return False


def tenant(opts: SaltOpts, name: str) -> Data:
    """One tenant's checked configuration."""
    conf = config(opts)["tenants"]
    if name not in conf:
        raise SaltInvocationError(f"no tenant named {name!r} in virt:tenants (known: {', '.join(sorted(conf))})")
    return conf[name]


def host_allowed(conf: Data, host: str) -> bool:
    return any(fnmatch.fnmatchcase(host, pat) for pat in conf["hypervisors"])


def refuse(what: str, name: object, tenant_name: str, allowed: Iterable[str]) -> None:
    """The one wording for a tenant asking for something the operator did not give it."""
    listed = ", ".join(allowed) if allowed else "none"
    raise SaltInvocationError(f"tenant {tenant_name} may not use {what} {name!r} (allowed: {listed}): ask the operator")


def quota_of(conf: Data, tenant: str) -> Data:
    """``{name, quota, groups, allowed(host)}``: what ``virt.init``/``virt.update`` take from ``tenant``'s quota
    (``conf``: :func:`config`)."""
    tconf = conf["tenants"][tenant]
    return {
        "name": tenant,
        "quota": tconf["quota"],
        "groups": tconf["groups"],
        "allowed": lambda h: host_allowed(tconf, h),
    }


def check_init(conf: Data, tenant_name: str, kwargs: Data) -> None:
    """Refuse what a tenant caller may not pass to ``virt.init``: keywords outside :data:`INIT_KWARGS`
    (paths, URIs, devices, seeding and trust switches stay with the operator), profiles, networks and
    pools outside the tenant's lists, a ``host=`` outside its hypervisors."""
    _check(conf, tenant_name, {"nic": "default", "disk": "default", **kwargs}, INIT_KWARGS, "virt.init")


def check_update(conf: Data, tenant_name: str, kwargs: Data) -> None:
    """Refuse what a tenant caller may not pass to ``virt.update`` (Salt's spellings already mapped): keywords
    outside :data:`UPDATE_KWARGS`, and profiles, networks and pools outside the tenant's lists, as
    :func:`check_init` does."""
    _check(conf, tenant_name, kwargs, UPDATE_KWARGS, "virt.update")


def check_ha(tenant_name: str, kwargs: Data, allowed: bool, fun: str) -> None:
    """Refuse a tenant's ``ha=True`` unless the operator lets tenants mark their VMs HA (``allowed``: the master's
    ``virt:ha:tenant_flag``): automatic HA restarts them on other hypervisors, in capacity the operator keeps.
    ``ha=False`` is always taken."""
    if kwargs.get("ha") is not None and checks.flag(kwargs["ha"], "ha") and not allowed:
        raise SaltInvocationError(
            f"tenant {tenant_name} may not pass ha=True to {fun}: the operator has not let tenants mark their VMs "
            "for automatic HA (virt:ha:tenant_flag in the master config): ask the operator"
        )


def refuse_kwargs(tenant_name: str | None, passed: Iterable[str], allowed: Iterable[str], fun: str) -> None:
    """The one wording for arguments of ``fun`` a tenant caller passed (``passed``) that are not in ``allowed``."""
    extra = sorted(k for k in passed if k not in allowed)
    if extra:
        raise SaltInvocationError(
            f"tenant {tenant_name} may not pass {', '.join(extra)} to {fun} "
            f"(a tenant may pass: {', '.join(sorted(allowed))})"
        )


def _check(conf, tenant_name, kwargs, allowed, fun):
    refuse_kwargs(tenant_name, kwargs, allowed, fun)
    for key in ("nic", "disk"):
        profile = kwargs.get(key)
        if key in kwargs and profile not in conf["profiles"]:
            refuse(f"{key} profile", profile, tenant_name, conf["profiles"])
    for nic in vmspec.named_entries(kwargs.get("interfaces"), "interfaces"):
        _keys(nic, NIC_KEYS, "interfaces", tenant_name)
        source = nic.get("source") or nic.get("network") or nic.get("bridge")
        if not isinstance(source, str) or source not in conf["networks"]:
            refuse("network", source, tenant_name, conf["networks"])
    for disk in vmspec.named_entries(kwargs.get("disks"), "disks"):
        _keys(disk, DISK_KEYS, "disks", tenant_name)
        pool = disk.get("pool")
        if pool is not None and pool not in conf["pools"]:
            refuse("pool", pool, tenant_name, conf["pools"])
    host = kwargs.get("host")
    if host and not host_allowed(conf, host):
        refuse("hypervisor", host, tenant_name, conf["hypervisors"])


# what a tenant caller sees of the fleet --------------------------------------------------------------
def owned_by(vm: Data | None, tenant_name: str | None) -> bool:
    return ((vm or {}).get("owner") or {}).get("tenant") == tenant_name


def visible(hosts: dict[str, Data], caller: Caller, conf: Data) -> dict[str, Data]:
    """The part of a fleet answer (``virt.full_info`` per hypervisor) ``caller`` may see: everything for
    an operator; for a tenant member its hypervisors (and any other holding one of its VMs) with only
    the tenant's VMs (by the owner in their <metadata>)."""
    if caller.operator:
        return hosts
    tconf = conf["tenants"][caller.tenant]
    out = {}
    for host, ans in hosts.items():
        vms = (ans or {}).get("vm_info") or {}
        mine = {n: vm for n, vm in vms.items() if owned_by(vm, caller.tenant)}
        if mine or host_allowed(tconf, host):
            out[host] = dict(ans, vm_info=mine) if "vm_info" in (ans or {}) else dict(ans)
    return out


def locate(hosts: dict[str, Data], name: str, caller: Caller, host: str | None = None) -> str:
    """The hypervisor of VM ``name`` among ``hosts`` (what :func:`visible` gave ``caller``); to a tenant caller a
    VM it does not see is :func:`missing` (never "defined on another hypervisor")."""
    if not caller.operator and not any(name in (a.get("vm_info") or {}) for a in hosts.values()):
        down = publish.down_hosts(hosts)
        hint = f" (these hypervisors did not answer: {', '.join(down)})" if down else ""
        raise publish.Failed(missing(name, caller) + hint)
    return publish.locate(hosts, name, host)


def where(fleet: publish.Fleet, caller: Caller, name: str, host: str | None) -> tuple[str, dict[str, Data]]:
    """``(hypervisor of VM name, fleet snapshot)`` in one round trip through ``fleet``.
    An operator's: ``virt.vm_state``. A tenant caller finds its tenant's VMs only (by the owner in their
    <metadata>, read with ``virt.full_info``) on the hypervisors ``fleet``'s per-call tgt selects, in a snapshot
    of every hypervisor: what its quota counts (``virt.update``), whatever tgt it passes."""
    if caller.operator:
        hosts = fleet.gather("virt.vm_state")
        return publish.locate(hosts, name, host), hosts
    hosts = fleet.wide().gather("virt.full_info")
    seen = visible(fleet.within_target(hosts), caller, config(fleet.opts))
    return locate(seen, name, caller, host), hosts


def act(fleet: publish.Fleet, caller: Caller, name: str, fun: str, args: Any, host: str | None) -> tuple[str, Data]:
    """``(hypervisor, its signed answer)`` of ``fun`` run on VM ``name`` for ``caller``: the hypervisor found with
    :func:`where`, then ``fun(name, *args)`` there. A tenant caller's call names its tenant, so that the hypervisor
    itself refuses it unless the VM's recorded owner is that tenant (``virt.answer``). Raises
    :class:`saltvirt.fleet.publish.Failed` when the hypervisor did not answer."""
    host_of, _hosts = where(fleet, caller, name, host)
    tenant_name = None if caller.operator else caller.tenant
    ans, jid = fleet.call(host_of, fun, [name, *args], tenant=tenant_name)
    if ans["status"] != "up":
        raise publish.Failed(f"{fun} {name} on {host_of}: {ans['status']}: {ans.get('error')}", host=host_of, jid=jid)
    return host_of, ans


def missing(name: str, caller: Caller) -> str:
    """The one wording for a VM a tenant caller does not own (or that does not exist)."""
    return tenancy.missing(name, caller.tenant)


def name_taken(name: str) -> str:
    """The one wording for a VM name a tenant caller cannot take: a VM, its minion key or a call in flight has
    it. Whose it is and where are not said (another tenant's VM or its hypervisor)."""
    return f"the name {name} is taken: pick another name"


def operator_only(caller: Caller, fun: str) -> None:
    """Refuse ``fun`` (an operator's runner function) to a tenant caller."""
    if not caller.operator:
        raise SaltInvocationError(
            f"{fun} is for operators: user {caller.user} is a member of tenant {caller.tenant} "
            "(tenants use virt.init, virt.query, virt.list, virt.vm_info, virt.start/stop/..., virt.purge, "
            "virt.update, virt.migrate, virt.usage, virt.backup, virt.restore, virt.catalog, virt.snapshots, "
            "virt.snapshot, virt.revert_snapshot, virt.delete_snapshot, virt.backups and virt.job)"
        )
