"""
Control a fleet of libvirt/KVM hypervisors from the master: ``salt-run virt.<function>``.

Every function publishes once to all hypervisor minions (in parallel, bounded waits) through
LocalClient; hypervisors that do not answer are listed as ``down``, never dropped. The logic lives in
``saltvirt.fleet.publish`` (fan-out), ``saltvirt.fleet.minionkeys`` (keys), ``saltvirt.fleet.vmcreate``
(VM creation) and ``saltvirt.fleet.placement`` (host choice). Salt's loader merges every runner file whose
``__virtualname__`` is ``virt`` into this one runner: tenants' ``virt.usage``/``virt.whoami`` are in
``virt_tenants.py``, ``virt.migrate``/``virt.evacuate`` in ``virt_migrate.py``.

Master config: ``virt:hypervisors`` (required: which minions are hypervisors, by minion id, and how long
to wait for them), ``virt:placement``, ``virt:guest_master``, ... Every key with its default and meaning:
``docs/configuration.md``; placement, keys and migration: ``docs/topics/runner.md``.

Every function also takes ``tgt=`` / ``tgt_type=`` to narrow the hypervisors for one call (never to
add a minion to them); for ``virt.init`` it narrows where the VM may go, for a tenant caller where its VM
is looked for, never where names and a tenant's quota are checked (every hypervisor).

Trust: every VM is a minion of this master and root in it controls its grains
and answers, so who is a hypervisor (fan-out, placement, sealed keys, migration targets) comes only
from ``virt:hypervisors`` and the keys this master accepted (``docs/topics/trust.md``).

Progress events (master event bus) while ``virt.init`` works, one tag prefix per VM,
``salt/virt/init/<vm>/<step>``. From this runner (``data.source: runner``): ``placed`` (host, score,
per-resource scores, reason), ``key_accepted`` (minion id, fingerprint), ``fallback`` (host that did
not answer, next host), ``done`` (host, seconds), ``failed`` (error). From the hypervisor's
``virt.init``: ``image_cached``, ``disks_ready``, ``seeded``, ``defined``, ``started``. ``salt-run``
shows both as ``[progress]`` lines as they happen (not with ``--out=json``/``yaml``, whose output
stays plain data).

Trust model for the new minion's key (``virt.init``): the key pair is generated here, on the master,
in memory. The public key is stored as *accepted* under the new minion's id (refused if the master
already has any key for that id). The private key leaves this process only sealed to the chosen
hypervisor's accepted minion key (RSA-OAEP + AES-256-GCM, ``saltvirt.pki.envelope``): the publication is
readable by every minion holding the AES session key and is stored in the job cache, but only that
hypervisor can open it; it writes the key into the guest's disk and returns only the fingerprint. The
hypervisor is trusted with the guest's key (it owns the guest's disk anyway); other minions and
readers of the job cache are not. On failure the key this call stored is removed again, and if the
hypervisor seeded a different key (or none) the pre-accepted one is taken back. Limits: the sealed
envelope stays in the job cache (``keep_jobs``), so a later theft of that hypervisor's minion key would
open it. Each hypervisor tried gets its own fresh key pair: a VM created late by a hypervisor that
did not answer in time holds a key the master does not accept (and ``virt.*`` actions on that name
then refuse the ambiguity until one copy is purged).
"""

import contextlib
import logging
import os
import sys
import time
import types
from typing import TYPE_CHECKING

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
    from saltvirt.base import install as _install
    from saltvirt.fleet import (
        callers,
        fleetstate,
        ha,
        hypervisors,
        leftovers,
        minionkeys,
        placement,
        publish,
        quota,
        runprogress,
        tenants,
        vmcreate,
        vminit,
        vmrates,
        vmselect,
        vmupdate,
    )

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from salt.utils.event import NamespacedEvent

    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext
    __jid_event__: NamespacedEvent

log = logging.getLogger(__name__)
__virtualname__ = "virt"
__func_alias__ = {"list_": "list"}
OUTPUTTER = "virt_query"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt runner: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    _install.warn_saltext_virt(log)  # a file_roots install has no entry point to say it
    return __virtualname__


# helpers ------------------------------------------------------------------------------------------
def _virt_conf():
    """The master's ``virt`` mapping, old flat keys (``virt.tunnel: True``) included (warned in the log)."""
    return config.master_virt(__opts__)[0]


def _fleet(client, tgt=None, tgt_type=None, timeout=None):
    """The transport to the hypervisors (``saltvirt.fleet.publish.Fleet``), narrowed to ``tgt`` for this call."""
    return publish.Fleet.of_master(__opts__, client, tgt=tgt, tgt_type=tgt_type, timeout=timeout)


def _client():
    import salt.client

    return salt.client.get_local_client(__opts__["conf_file"])


def _store():
    return fleetstate.Store(__opts__)


def _out(data):
    """Runner answer rendered by the virt_query outputter (``--out=json`` gives ``data`` as is)."""
    return {"outputter": OUTPUTTER, "data": data}


def _failed(exc, **extra):
    """The runner's answer for a failure: the real message, details, and a non-zero exit code."""
    with contextlib.suppress(NameError):  # __context__ is injected by the loader
        __context__["retcode"] = 1
    return _out(publish.failure(exc, **extra))


def _gather(fun, tgt=None, tgt_type=None, timeout=None):
    with _client() as client:
        return _fleet(client, tgt, tgt_type, timeout).gather(fun)


def _who():
    """The caller of this job as Salt authenticated it (``__user__``, never an argument) and its role."""
    return callers.job_caller(__opts__, globals(), __salt__)


def _seen(who, tgt=None, tgt_type=None, timeout=None):
    """Every hypervisor's ``virt.full_info``, cut to what ``who`` may see (a tenant: its own VMs)."""
    return tenants.visible(_gather("virt.full_info", tgt, tgt_type, timeout), who, tenants.config(__opts__))


def _operator(fun):
    """Refuse operator functions to tenant callers (raises SaltInvocationError)."""
    tenants.operator_only(_who(), fun)


# fleet queries ------------------------------------------------------------------------------------
def query(tgt=None, tgt_type=None, timeout=None, rates=False, interval=2):
    """
    Every VM on every hypervisor (state, cpu, memory, graphics, disks, NICs with the running VMs' IPs
    and their source: guest agent, DHCP lease or ARP) plus each hypervisor's capacity, in one round trip.
    Hypervisors that do not answer are listed with ``status: down``; one in maintenance (the master's
    ``virt:placement:maintenance``) has ``maintenance: <the pattern that matches it>``.

    rates
        also measure each running VM's CPU %, disk and network bytes/s (and disk requests/s) over
        ``interval`` seconds (two samples of ``virt.vm_stats_sample``): ``vm_info:<vm>:rates``.

    CLI Example:

    .. code-block:: bash

        salt-run virt.query
        salt-run virt.query --out=json
        salt-run virt.query tgt='hyper[1-3]'
        salt-run virt.query rates=True interval=5
    """
    try:
        who = _who()
        data = _seen(who, tgt, tgt_type, timeout)
        if validate.to_bool(rates):
            _add_rates(data, tgt, tgt_type, timeout, interval)
        return _out(placement.mark_maintenance(data, placement.make_policy(_virt_conf().get("placement"))))
    except SaltException as exc:
        return _failed(exc)


def _add_rates(data, tgt, tgt_type, timeout, interval):
    try:
        interval = float(interval)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"interval must be a number of seconds, not {interval!r}") from None
    if not 0 < interval <= 300:
        raise SaltInvocationError(f"interval must be between 0 and 300 seconds, not {interval}")
    first = _gather("virt.vm_stats_sample", tgt, tgt_type, timeout)
    time.sleep(interval)
    second = _gather("virt.vm_stats_sample", tgt, tgt_type, timeout)
    vmrates.add(data, first, second)  # data: what the caller may see; only its VMs get rates


def list_(tgt=None, tgt_type=None, timeout=None):
    """
    The VMs of every hypervisor with their state (``{host: {status, vms: {name: state}}}``).

    CLI Example:

    .. code-block:: bash

        salt-run virt.list
    """
    try:
        who = _who()
        if who.operator:
            return _out(_gather("virt.vm_state", tgt, tgt_type, timeout))
        seen = _seen(who, tgt, tgt_type, timeout)  # the owner is in <metadata>: vm_state does not read it
        return _out({h: _states(a) for h, a in seen.items()})
    except SaltException as exc:
        return _failed(exc)


def _states(ans):
    """A ``virt.full_info`` answer in ``virt.vm_state``'s shape (``{status, vms: {name: state}}``)."""
    if ans.get("status") != "up":
        return ans
    out = {k: v for k, v in ans.items() if k not in ("vm_info", "host", "freecpu", "freemem", "node_info")}
    out["vms"] = {n: vm.get("state") for n, vm in (ans.get("vm_info") or {}).items()}
    return out


def host_info(tgt=None, tgt_type=None, timeout=None):
    """
    Capacity and usage of every hypervisor: memory, vCPUs, VMs, free space in ``virt:images``.

    CLI Example:

    .. code-block:: bash

        salt-run virt.host_info
    """
    try:
        _operator("virt.host_info")
        return _out(_gather("virt.host_info", tgt, tgt_type, timeout))
    except SaltException as exc:
        return _failed(exc)


def next_host(cpu=1, mem=512, image=None, group=None, saltenv="base", tgt=None, tgt_type=None, affinity=None, **policy):
    """
    Where a VM with ``cpu`` vCPUs and ``mem`` MiB (and a full copy of ``image``, in anti-affinity
    ``group``) would be placed, and why: every host's score with its parts, every excluded host
    with the reasons. Policy keys (``maintenance``, ``strategy``, ``mem_reserve_mib``, ...) may be
    given to try a policy for this call only. ``affinity``: soft affinity terms
    (``[{group: db, weight: 2}]``, negative weights for soft anti-affinity), shown as ``affinity:<group>``
    score parts.

    CLI Example:

    .. code-block:: bash

        salt-run virt.next_host
        salt-run virt.next_host cpu=4 mem=8192 image=salt://images/centos.qcow2 group=web
        salt-run virt.next_host maintenance=hyper1,hyper2 strategy=pack
    """
    policy = {k: v for k, v in policy.items() if not k.startswith("__")}
    try:
        _operator("virt.next_host")
        disk, note = vmcreate.image_mib(__opts__, image, saltenv)
        req = placement.make_request(cpu, mem, disk, group, affinity=affinity)
        pol = placement.make_policy(_virt_conf().get("placement"), **policy)
        with _client() as client:  # capacity only: placement needs no VM's full facts
            hosts = _fleet(client, tgt, tgt_type).capacities()
        plan = placement.rank(hosts, req, pol, top=placement.RANK_TOP)
    except SaltException as exc:
        return _failed(exc)
    plan["request"]["disk_note"] = note
    return _out(plan)


# creating a VM ------------------------------------------------------------------------------------
def init(
    name,
    cpu,
    mem,
    image=None,
    host=None,
    enable_qcow=False,
    enable_vnc=False,
    start=True,
    seed=True,
    group=None,
    fallback=True,
    saltenv="base",
    minion_id=None,
    tgt=None,
    tgt_type=None,
    wait=None,
    wait_timeout=300,
    affinity=None,
    tenant=None,
    **kwargs,
):
    """
    Create a VM on the best hypervisor: place it (see ``virt.next_host``), generate the new minion's
    key pair and pre-accept its public key on this master, run ``virt.init`` on the chosen hypervisor
    (image cached and cloned, seeded with the minion config and the key before its first boot,
    started), and return the host and the VM's info.

    host
        put it on this hypervisor (it must fit); with ``fallback=True`` (default) the next-best host
        is used if it is down.
    tgt / tgt_type
        narrow the hypervisors the VM may go to, nothing else: the name is checked on every hypervisor
        (and refused while one does not answer: always for a tenant member, for an operator when a
        tenant's quota ledger has it), and a tenant's quota counts its VMs on every hypervisor.
    enable_qcow / enable_vnc / start / seed / group / saltenv
        as in the execution module's ``virt.init``; ``group`` is an anti-affinity group.
    affinity
        soft affinity terms for the placement (``[{group: db, weight: 2}]``; see ``virt.next_host``).
    minion_id
        the new minion's id (default: the VM name).
    image
        a name from the operator's image catalog (``virt:catalog``: source, checksum and size come
        from it), or a ``salt://``/``https://`` source (operators only).
    tenant
        operators only: create the VM for this tenant (its quota, hypervisors, <metadata> owner). A
        tenant member's VMs always belong to its own tenant (see docs/topics/tenants.md).
    wait / wait_timeout
        ``wait=ip``: return once the VM has an IP address on one of its NICs (``vm_info``: guest agent,
        DHCP lease or ARP, named as the source); ``wait=minion``: once its own minion answers
        ``test.ping``. At most ``wait_timeout`` seconds (default 300); when that runs out the VM is kept,
        ``wait`` in the answer says what was seen, and salt-run exits non-zero.

    Any other keyword of the module's ``virt.init`` (``boot``, ``nic``, ``disk``, ``interfaces``, ``disks``,
    ``graphics``, ``master``, ``minion_config``, ``seed_backend``, ``cloud_init``, ...) is passed to it; an
    unknown one, and ``pub_key``/``priv_key`` (this runner makes the key pair), are refused before anything
    happens (the table: ``saltvirt.model.vmargs``, docs/topics/vm-arguments.md).

    On failure: a clear error with the hypervisor's real message; the key this call stored is
    removed and ``virt.init`` on the hypervisor removes what it created. Only a hypervisor that did
    not answer at all makes the runner try the next one; an error (bad input, no bridge, ...) is
    reported, never retried elsewhere.

    CLI Example:

    .. code-block:: bash

        salt-run virt.init centos1 2 512 salt://centos.img
        salt-run virt.init web1 2 1024 salt://images/web.qcow2 enable_qcow=True enable_vnc=True group=web
        salt-run virt.init db1 4 4096 salt://images/db.qcow2 host=hyper2
        salt-run virt.init web2 1 1024 salt://images/web.qcow2 wait=minion wait_timeout=600
    """
    progress = runprogress.InitProgress(name, __opts__, globals().get("__jid_event__"), OUTPUTTER)
    call = vminit.Call(
        name,
        cpu,
        mem,
        image=image,
        host=host,
        enable_qcow=enable_qcow,
        enable_vnc=enable_vnc,
        start=start,
        seed=seed,
        group=group,
        fallback=fallback,
        saltenv=saltenv,
        minion_id=minion_id,
        tgt=tgt,
        tgt_type=tgt_type,
        wait=wait,
        wait_timeout=wait_timeout,
        affinity=affinity,
        tenant=tenant,
    )
    try:
        validate.vm_name(name)
        hypervisors.refuse_vm_id(__opts__, name, minion_id)  # a VM is never taken for a hypervisor
        who = _who()
        module_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
        # the loader injects __jid__: shown to whoever finds the name locked
        created = vminit.init(__opts__, who, call, module_kwargs, progress, _client, job=globals().get("__jid__"))
    except SaltException as exc:
        progress("failed", error=getattr(exc, "error", None) or str(exc))
        return _failed(exc)
    if isinstance(created, dict):
        if created.get("retcode"):  # salt-run's exit code: the VM is there, the wait failed
            __context__["retcode"] = 1
        created["timeline"] = progress.timeline
    return _out(created)


# one VM -------------------------------------------------------------------------------------------
def vm_info(name=None, host=None, tgt=None, tgt_type=None):
    """
    Information about one VM (found on whichever hypervisor has it), or about all VMs without a name.

    CLI Example:

    .. code-block:: bash

        salt-run virt.vm_info web1
    """
    if not name:
        return query(tgt, tgt_type)
    try:
        who = _who()
        hosts = _seen(who, tgt, tgt_type)
        where = tenants.locate(hosts, name, who, host)
    except SaltException as exc:
        return _failed(exc)
    return _out({where: {"status": "up", "vm_info": {name: hosts[where]["vm_info"][name]}}})


def _action(name, fun, host=None, tgt=None, tgt_type=None, args=(), select=None, test=False):
    """Find the VM's hypervisor (one round trip), run ``fun`` there, report its real answer. A tenant
    caller acts on its tenant's VMs only (found by the owner in their <metadata>). ``select``: on every VM a
    selection picks instead (:func:`_on_selection`)."""
    if select is not None:
        return _on_selection(name, host, fun, select, tgt, tgt_type, args, test)
    try:
        if validate.to_bool(test):  # never ignored: a named call has no dry run
            raise SaltInvocationError(f"{fun}: test=True lists what select= picks; a call naming a VM has no dry run")
        if name is None:
            raise SaltInvocationError(f"{fun} needs a VM name, or select=<selection> (docs/topics/resources.md)")
        validate.vm_name(name)
        who = _who()
        with _client() as client:
            where, ans = tenants.act(_fleet(client, tgt, tgt_type), who, name, fun, args, host)
    except SaltException as exc:
        return _failed(exc)
    return _out({"name": name, "host": where, "result": ans["ret"]})


def _on_selection(name, host, fun, select, tgt, tgt_type, args, test):
    """``fun`` on every VM ``select`` picks from the hypervisors' signed facts (``saltvirt.fleet.vmselect``):
    the selection, one result per VM, exit code 1 when one failed or was refused or a hypervisor did not answer."""
    try:
        if name is not None or host is not None:
            raise SaltInvocationError(f"{fun}: select= picks the VMs: drop the VM name and host=")
        who = _who()
        with _client() as client:
            out = vmselect.run(_fleet(client, tgt, tgt_type), who, select, fun, args, validate.to_bool(test))
    except SaltException as exc:
        return _failed(exc)
    if out.get("retcode"):
        __context__["retcode"] = 1
    return _out(out)


def update(name, cpu=None, mem=None, host=None, tgt=None, tgt_type=None, **kwargs):
    """
    Change VM ``name`` where it is defined with the hypervisor's ``virt.update``: the same arguments
    (``cpu``, ``mem``, ``nic``/``nic_profile``, ``disk``/``disk_profile``, ``disks``, ``interfaces``,
    ``enable_vnc``, ``graphics``, ``live``, ``test``, ``autostart``, ...; docs/topics/vm-arguments.md) and
    its answer (``definition``, ``cpu``, ``mem``, ``disk``, ``interface``, ``changes``, ``plan``, ...) with
    the ``host``. The VM's per-name lock is held meanwhile (no ``virt.init`` or migration of it).

    A tenant member updates its tenant's VMs only, with whole-number ``cpu``/``mem``, its profiles,
    networks and pools, new blank ``disks`` (no path or device), ``enable_vnc``, ``live``, ``test`` and
    ``autostart``; what the change adds (vCPUs, memory, new disks) is taken from its quota first, in the
    same compare-and-set as ``virt.init`` (docs/topics/tenants.md). An operator's update is not refused by
    a quota; what it gives a tenant's VM is recorded in the tenant's usage. ``tgt``/``tgt_type`` narrow where
    the VM is looked for, never what the quota counts (the tenant's VMs on every hypervisor).

    CLI Example:

    .. code-block:: bash

        salt-run virt.update web1 cpu=4 mem=4096
        salt-run virt.update web1 disks='[{name: data, size: 10240}]' live=False
        salt-run virt.update web1 cpu=2 test=True
    """
    try:
        validate.vm_name(name)
        who = _who()
        kwargs = vmupdate.arguments(kwargs)
        tenant = None
        if not who.operator:
            conf = tenants.config(__opts__)
            tenants.check_update(conf["tenants"][who.tenant], who.tenant, kwargs)
            tenants.check_ha(who.tenant, kwargs, ha.tenant_flag(_virt_conf()), "virt.update")
            cpu, mem = vmupdate.sizes(cpu, mem)
            tenant = tenants.quota_of(conf, who.tenant)
        with _client() as client:
            fleet = _fleet(client, tgt, tgt_type)
            owner = None if who.operator else who.tenant  # the hypervisor checks the VM's owner too

            def call(where, fun, args, kwarg):
                return fleet.call(where, fun, args, kwarg, tenant=owner)[0]

            ret = vmupdate.update(
                __opts__,
                name,
                cpu,
                mem,
                kwargs,
                locate=lambda: tenants.where(fleet, who, name, host),
                call=call,
                tenant=tenant,
                job=globals().get("__jid__"),
            )
    except SaltException as exc:
        return _failed(exc)
    return _out(ret)


def start(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Start a VM wherever it is defined.

    CLI Example:: salt-run virt.start web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.start", host, tgt, tgt_type, select=select, test=test)


def stop(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Hard power-off, as the module's ``virt.stop`` (Salt's meaning). ``virt.shutdown`` asks the guest.

    CLI Example:: salt-run virt.stop web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.stop", host, tgt, tgt_type, select=select, test=test)


def shutdown(name=None, timeout=0, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Ask a VM to shut down (ACPI); ``timeout`` seconds to wait for it. ``virt.stop`` pulls the plug.

    CLI Example:: salt-run virt.shutdown web1 timeout=60

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.shutdown", host, tgt, tgt_type, args=(timeout,), select=select, test=test)


def force_off(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Hard power-off (the VM stays defined, its disks stay).

    CLI Example:: salt-run virt.force_off web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.force_off", host, tgt, tgt_type, select=select, test=test)


def reset(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Hard reset (the reset button).

    CLI Example:: salt-run virt.reset web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.reset", host, tgt, tgt_type, select=select, test=test)


def reboot(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Ask the guest to reboot.

    CLI Example:: salt-run virt.reboot web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.reboot", host, tgt, tgt_type, select=select, test=test)


def pause(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Pause a running VM.

    CLI Example:: salt-run virt.pause web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.pause", host, tgt, tgt_type, select=select, test=test)


def resume(name=None, host=None, tgt=None, tgt_type=None, select=None, test=False):
    """
    Resume a paused VM.

    CLI Example:: salt-run virt.resume web1

    ``select='T@virt_vm and G@group:db'``: every VM the selection picks (``test=True``: only list them);
    docs/topics/resources.md, "Fleet operations on a selection".
    """
    return _action(name, "virt.resume", host, tgt, tgt_type, select=select, test=test)


def console(name, pubkey, host=None, tgt=None, tgt_type=None):
    """
    A one-time ticket to running VM ``name``'s VNC console (the web console's noVNC): its hypervisor sets
    a fresh password valid for ``virt:console:lifetime`` seconds and spent at its first use, and answers
    ``{vm, host, port, tls, valid_until, password}`` with the password encrypted to ``pubkey`` (the caller's
    ephemeral RSA-OAEP public key, SPKI base64), so neither this job nor the event bus carries it in clear.
    A tenant member gets tickets to its tenant's VMs only; docs/topics/console.md.

    CLI Example:: salt-run virt.console web1 pubkey=MIIBIjANBgkqh...
    """
    return _action(name, "virt.console", host, tgt, tgt_type, args=(pubkey,))


def purge(name, delete_key=True, minion_id=None, host=None, tgt=None, tgt_type=None):
    """
    Power off and undefine a VM and delete the disks salt-virt created for it (see the module's
    ``virt.purge``); then delete its minion's key on this master (``delete_key=False`` keeps it).

    A VM defined nowhere (every hypervisor answered) is what an interrupted ``virt.init`` leaves:
    then ``virt.cleanup`` runs on every hypervisor (disks with a manifest, seeding mounts, loop
    devices, FUSE exports, stale init locks); no key is deleted then (nothing records which key that
    init created): ``salt-key -d <id>`` if one is left.

    The key deleted is only the one ``virt.init`` seeded into this VM: its minion id and key fingerprint
    are recorded in the domain's <metadata> and compared with the master's key; any other key (another
    minion's, one replaced since, or a VM without the record) is reported under ``key_note`` and left.

    CLI Example:: salt-run virt.purge web1
    """
    try:
        who = _who()
    except SaltException as exc:
        return _failed(exc)
    info = vm_info(name, host, tgt, tgt_type)["data"]
    found = [h["vm_info"][name] for h in info.values() if isinstance(h, dict) and name in (h.get("vm_info") or {})]
    recorded = found[0].get("minion") if len(found) == 1 and validate.to_bool(delete_key) else None
    owner = (found[0].get("owner") or {}) if len(found) == 1 else {}
    ret = _action(name, "virt.purge", host, tgt, tgt_type)
    if "error" not in ret["data"] and owner.get("tenant"):
        quota.forget(_store(), owner["tenant"], name)  # its quota entry goes with it
    if "error" in ret["data"] and not host and who.operator:  # leftovers of any init: operators only
        try:
            with _client() as client:
                cleaned = leftovers.purge_leftovers(_fleet(client, tgt, tgt_type), name, _store())
        except SaltException as exc:
            cleaned = None
            log.debug("virt.purge %s: no leftovers cleanup: %s", name, exc)
        if cleaned is not None:
            ret = _out(cleaned)
    elif "error" not in ret["data"]:  # purged where it was: what an init that fell over left elsewhere goes too
        try:
            with _client() as client:
                ret["data"]["cleanup_elsewhere"] = leftovers.cleanup_everywhere(
                    _fleet(client, tgt, tgt_type), name, _store()
                )
        except SaltException as exc:
            ret["data"]["cleanup_elsewhere"] = {"error": str(exc)}
    if "error" in ret["data"] or not validate.to_bool(delete_key):
        return ret
    try:
        ret["data"].update(minionkeys.delete_recorded_key(__opts__, name, recorded, minion_id))
    except SaltException as exc:
        ret["data"]["key_deleted"] = f"not deleted: {exc}"
    return ret
