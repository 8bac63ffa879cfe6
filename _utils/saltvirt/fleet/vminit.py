"""``salt-run virt.init`` from its arguments to a created VM (master side; the runner keeps Salt's signature).

What is decided here, before anything is published: who the VM is for and from which image (a tenant member:
its tenant, its catalog images, what the operator gave it; an operator: any image, ``tenant=`` for a tenant's
quota and hypervisors), the ``wait=`` asked for, the placement request and policy, and the module's keywords
(sealed secrets refused, Salt's runner spellings mapped, what :mod:`saltvirt.model.vmargs` passes on, image
sources checked, where the guest finds this master). Then :func:`saltvirt.fleet.vmcreate.create` places and
creates it through the hypervisors' transport (:class:`saltvirt.fleet.publish.Fleet`) and
:func:`saltvirt.fleet.vmwait.wait` waits for it when asked.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import config, validate
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import catalog, ha, placement, publish, tenants, vmcreate, vmwait
from saltvirt.model import compat, vmspec


@dataclass
class Call:
    """The named arguments of ``salt-run virt.init`` as the caller gave them (the runner's docstring says what
    each means); every other keyword goes to the hypervisor's ``virt.init`` (``module_kwargs``)."""

    name: str
    cpu: Any
    mem: Any
    image: str | None = None
    host: str | None = None
    enable_qcow: Any = False
    enable_vnc: Any = False
    start: Any = True
    seed: Any = True
    group: str | None = None
    fallback: Any = True
    saltenv: str = "base"
    minion_id: str | None = None
    tgt: Any = None
    tgt_type: str | None = None
    wait: Any = None
    wait_timeout: Any = vmwait.DEFAULT_TIMEOUT
    affinity: Any = None
    tenant: str | None = None


def init(
    opts: SaltOpts,
    who: tenants.Caller,
    call: Call,
    module_kwargs: Data,
    progress: Any,
    connect: Callable[[], AbstractContextManager[Any]],
    job: str | None = None,
) -> Data:
    """Create the VM ``call`` asks for on behalf of ``who`` (Salt's caller of the job): ``vmcreate.create``'s
    answer, with ``warnings``, and ``wait`` (and ``retcode: 1`` when the wait did not end well: the VM is kept).
    ``progress``: the runner's progress callback; ``connect()``: a LocalClient for the publications (opened only
    once everything is checked); ``job``: the runner's jid (shown to whoever finds the name locked)."""
    module_kwargs = dict(module_kwargs)
    owner, image, entry = tenancy(opts, who, call, module_kwargs)
    wait, wait_timeout = vmwait.check(call.wait, call.wait_timeout, call.start)
    seed = validate.to_bool(call.seed)
    cfg = publish.config(config.master_opts(opts), tgt=call.tgt, tgt_type=call.tgt_type)
    disk, _note = (entry["min_size"], "catalog") if entry else vmcreate.image_mib(opts, image, call.saltenv)
    req = placement.make_request(call.cpu, call.mem, disk, call.group, affinity=call.affinity)
    conf = config.master_virt(opts)[0]
    pol = placement.make_policy(conf.get("placement"))
    vmcreate.refuse_sealed_args(module_kwargs)
    compat.refuse_operator_switches(module_kwargs)
    # Salt's runner spellings (hypervisor=, install=, serial_type=): mapped or refused before anything
    warnings = compat.init_args(module_kwargs, "salt-run virt.init")
    ignored = ha.flag_ignored(conf, owner["meta"].get("tenant"), call.name, module_kwargs.get("ha"))
    warnings += [ignored] if ignored else []  # an operator's ha=True for a tenant= VM
    module_kwargs = vmcreate.forward(module_kwargs)  # what the table (saltvirt.model.vmargs) says it passes on
    catalog.check_sources(opts, image, module_kwargs.get("disks"))  # no URL outside virt:image_sources
    module_kwargs = vmcreate.guest_master(opts, conf, module_kwargs)
    if owner["quota"]:  # the tenant's disk quota counts every disk the VM gets, not the image's only
        owner["quota"]["disk_mib"] = vmspec.new_disks_mib(module_kwargs.get("disks"), disk)
    module_kwargs.update(
        enable_qcow=validate.to_bool(call.enable_qcow),
        enable_vnc=validate.to_bool(call.enable_vnc),
        start=validate.to_bool(call.start),
        saltenv=call.saltenv,
        owner=owner["meta"],
    )
    if entry:  # the catalog's checksum is verified by the hypervisor before any (cached) copy is used
        module_kwargs["checksum"] = entry["checksum"]
        module_kwargs["catalog_image"] = call.image  # recorded in <metadata>: the VM's image grain
        for key in ("nic", "disk"):
            module_kwargs.setdefault(key, entry["profile"])
    with connect() as client:
        fleet = publish.Fleet(opts, cfg, client)
        created = vmcreate.create(
            opts,
            call.name,
            req,
            image,
            module_kwargs,
            policy=pol,
            fleet=fleet,
            host=call.host,
            fallback=validate.to_bool(call.fallback),
            seed=seed,
            minion_id=call.minion_id,
            progress=progress,
            job=job,
            tenant=owner["quota"],
            operator=who.operator,
            private=not who.operator,  # a tenant is not told whose a taken name is, nor where
        )
        if wait and wait_timeout is not None:  # the VM exists from here on: whatever the wait sees, it is kept
            created["wait"] = vmwait.wait(fleet, wait, created, wait_timeout)
            if created["wait"]["result"] != "ok":  # salt-run's exit code: the VM is there, the wait failed
                created["retcode"] = 1
    if warnings and isinstance(created, dict):
        created["warnings"] = warnings + list(created.get("warnings") or [])
    return created


def tenancy(opts: SaltOpts, who: tenants.Caller, call: Call, module_kwargs: Data) -> tuple[Data, Any, Data | None]:
    """What ``virt.init`` does for caller ``who``: ``({meta, quota}, image source, catalog entry)``. A tenant
    member creates in its own tenant, from its catalog images, with what the operator gave it; an operator
    may name ``tenant=`` (its quota and hypervisors apply) and any image."""
    conf = tenants.config(opts)
    tenant = call.tenant
    if not who.operator:
        if who.tenant is None:  # callers.resolve: an operator or a tenant's member, nobody else
            raise SaltInvocationError(f"user {who.user} is neither an operator nor a tenant's member")
        if tenant not in (None, who.tenant):
            raise SaltInvocationError(f"user {who.user} is in tenant {who.tenant}: tenant={tenant} is refused")
        tenant = who.tenant
        tconf = conf["tenants"][tenant]
        tenants.check_init(tconf, tenant, dict(module_kwargs, host=call.host))
        tenants.check_ha(tenant, module_kwargs, ha.tenant_flag(config.master_virt(opts)[0]), "virt.init")
        if call.minion_id not in (None, call.name):
            raise SaltInvocationError(f"tenant {tenant}: a VM's minion id is its name (minion_id= is refused)")
        entry, image = catalog.resolve(opts, call.image, tenant, tconf["images"])
    else:
        if tenant is not None and tenant not in conf["tenants"]:
            raise SaltInvocationError(f"no tenant named {tenant!r} in virt:tenants")
        entry, image = catalog.resolve(opts, call.image)
    if tenant is None:
        return {"meta": {"creator": who.user}, "quota": None}, image, entry
    return {"meta": {"tenant": tenant, "creator": who.user}, "quota": tenants.quota_of(conf, tenant)}, image, entry
