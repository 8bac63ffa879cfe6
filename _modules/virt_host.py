"""
Execution module ``virt`` (continued): host facts in the shapes of Salt's virt module —
``capacity`` (what placement asks: ``saltvirt.host.capacity``; ``capacity_record`` and ``push_capacity``: the same,
signed, pushed to the master's mine by the ``virt_events`` engine), ``capabilities``, ``capabilities_xml``,
``all_capabilities``, ``domain_capabilities``, ``cpu_baseline``, ``node_devices``, ``is_hyper``,
``get_profiles`` (``saltvirt.host.caps``, ``saltvirt.model.compat``); ``boot_id``, ``host_ready`` and
``host_states`` for ``salt-run virt.roll`` (docs/topics/maintenance.md).
"""

import os
import sys
import time
import types
from typing import TYPE_CHECKING

from salt.exceptions import CommandExecutionError, SaltInvocationError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{modules,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import install as _install
    from saltvirt.base import operators as _operators
    from saltvirt.base import validate as _validate
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import capacity as _capacity
    from saltvirt.host import caps as _caps
    from saltvirt.host import conn as _c
    from saltvirt.host import ownership as _ownership
    from saltvirt.host import readiness as _readiness
    from saltvirt.model import compat as _compat
    from saltvirt.pki import answers as _answers
    from saltvirt.vm import hostready as _hostready

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _conn(connection=None, kwargs=None, fun="virt"):
    return _c.salt_connect_compat(__salt__, connection, kwargs, fun)


def capacity(connection=None, **kwargs):
    """
    What placement needs from this hypervisor, cheaply: node totals, memory and vCPUs running VMs use
    (and what every defined VM would), free disk in ``virt:images``, and each VM's ``group`` and state
    (``vm_info``: ``{name: {group, state, cpu, mem}}``). No per-VM XML, disks, NICs or guest IPs: ask
    ``virt.full_info`` for those. The group index is cached in the minion's cachedir (see
    ``saltvirt.host.capacity``).

    CLI Example:: salt 'hyper1' virt.capacity
    """
    with _conn(connection, kwargs, "virt.capacity") as conn:
        return _capacity.capacity(conn, _c.salt_images_dir(__salt__), cache_dir=_capacity.cache_dir(__opts__))


def capacity_record(connection=None, **kwargs):
    """
    :func:`capacity` signed with this minion's key and the time it was measured
    (``saltvirt.pki.answers.sign_record``): what ``push_capacity`` puts in the master's mine.

    CLI Example:: salt 'hyper1' virt.capacity_record
    """
    at = time.time()
    cap = capacity(connection, **kwargs)
    return _answers.sign_record(__opts__["pki_dir"], __opts__["id"], cap, at)


def push_capacity(**kwargs):
    """
    Push :func:`capacity_record` into the master's Salt mine (``mine.send`` over this minion's authenticated
    channel, readable by no other minion), so ``salt-run virt.init`` places without asking every hypervisor.
    The ``virt_events`` engine calls it on every change and heartbeat (docs/topics/capacity.md).

    CLI Example:: salt 'hyper1' virt.push_capacity
    """
    return __salt__["mine.send"](
        _answers.MINE_KEY, mine_function="virt.capacity_record", allow_tgt=__opts__["id"], allow_tgt_type="list"
    )


def capabilities(connection=None, **kwargs):
    """The host capabilities as Salt's dict: ``{host: {uuid, cpu, topology, migration, security, ...},
    guests: [{os_type, arch: {name, wordsize, emulator, machines, domains}, features}]}``
    (libvirt's XML: ``virt.capabilities_xml``).

    CLI Example:: salt '*' virt.capabilities
    """
    with _conn(connection, kwargs, "virt.capabilities") as conn:
        return _caps.capabilities(conn)


def capabilities_xml(connection=None):
    """libvirt's host capabilities XML.

    CLI Example:: salt '*' virt.capabilities_xml
    """
    with _conn(connection) as conn:
        return conn.getCapabilities()


def domain_capabilities(emulator=None, arch=None, machine=None, domain=None, connection=None, **kwargs):
    """
    What a domain of this emulator/arch/machine/type can have here (Salt's dict: ``emulator``,
    ``domain``, ``machine``, ``arch``, ``max_vcpus``, ``os`` (UEFI loaders), ``cpu`` modes,
    ``devices``, ``features``).

    CLI Example:: salt 'hyper1' virt.domain_capabilities arch=x86_64 domain=kvm
    """
    with _conn(connection, kwargs, "virt.domain_capabilities") as conn:
        return _caps.domain_capabilities(conn, emulator, arch, machine, domain)


def all_capabilities(connection=None, **kwargs):
    """
    The host capabilities and the domain capabilities of every arch/domain type it offers:
    ``{host: ..., domains: [...]}``.

    CLI Example:: salt 'hyper1' virt.all_capabilities
    """
    with _conn(connection, kwargs, "virt.all_capabilities") as conn:
        return _caps.all_capabilities(conn)


def cpu_baseline(full=False, migratable=False, out="libvirt", connection=None, **kwargs):
    """
    The CPU model guests can get on this host: libvirt's XML (``out=libvirt``) or
    ``{model, vendor, features: [{name, policy}]}`` (``out=salt``).

    CLI Example:: salt 'hyper1' virt.cpu_baseline out=salt
    """
    with _conn(connection, kwargs, "virt.cpu_baseline") as conn:
        return _caps.cpu_baseline(conn, _bool(full), _bool(migratable), out)


def node_devices(connection=None, **kwargs):
    """
    The host's PCI, USB, network and mdev devices as Salt's list of dicts (``name``, ``caps``, and
    per kind ``address``, ``vendor``, ``product``, ``interface``, ``state``, ...).

    CLI Example:: salt 'hyper1' virt.node_devices
    """
    with _conn(connection, kwargs, "virt.node_devices") as conn:
        return _caps.node_devices(conn)


def is_hyper(connection=None):
    """
    True when this minion can run VMs: libvirt answers and offers a QEMU/KVM domain type.

    CLI Example:: salt '*' virt.is_hyper
    """
    try:
        with _conn(connection) as conn:
            offered = {d for g in _caps.capabilities(conn)["guests"] for d in g["arch"]["domains"]}
    except Exception:  # noqa: BLE001 - any failure to reach libvirt means "not a hypervisor"
        return False
    return bool(set(offered) & {"kvm", "qemu", "test"})


def get_profiles(hypervisor=None, **kwargs):
    """
    The NIC and disk profiles VMs are built from (``virt:nic`` / ``virt:disk``, with the built-in
    ``default``): ``{nic: {name: [entries]}, disk: {name: [entries]}}``. ``hypervisor`` is accepted
    for Salt's signature (profiles do not depend on it here).

    CLI Example:: salt 'hyper1' virt.get_profiles
    """
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    _validate.no_credentials(kwargs.pop("username", None), kwargs.pop("password", None), "virt.get_profiles")
    kwargs.pop("connection", None)
    _compat.refuse_unknown(kwargs, ("hypervisor", "connection"), "virt.get_profiles")
    cfg = _c.salt_config(__salt__)
    return _compat.profiles({"nic": cfg("virt:nic", {}) or {}, "disk": cfg("virt:disk", {}) or {}})


READY_TAG = "salt/virt/hypervisor/ready"


def ready():
    """
    Tell the master this hypervisor is ready: fire ``salt/virt/hypervisor/ready`` with a fresh nonce that
    only this minion keeps (its cachedir), so that ``salt-run virt.provision_assigned`` (the reactor example)
    can ask it back with ``virt.ready_confirm``; an event any other minion forges carries no such nonce.
    ``salt-virt.example.sls`` runs it as its last step. Returns True once the event is sent.

    CLI Example:: salt-call virt.ready
    """
    nonce = _readiness.announce(__opts__["cachedir"])
    return bool(__salt__["event.send"](READY_TAG, {"nonce": nonce}))


def ready_confirm(nonce):
    """
    Did this hypervisor fire the ready event carrying ``nonce`` (``virt.ready``, within 10 minutes)? True
    once; the runner asks before it provisions anything for a ready event.

    CLI Example:: salt 'hyper1' virt.ready_confirm 3f6b...
    """
    return _readiness.confirm(__opts__["cachedir"], nonce)


def boot_id():
    """
    This host's boot id (``/proc/sys/kernel/random/boot_id``: new at every boot): ``salt-run virt.roll`` asks it,
    signed, before and after a reboot it asked for, so it knows the host really booted again.

    CLI Example:: salt 'hyper1' virt.boot_id
    """
    return _readiness.boot_id()


def host_ready():
    """
    Is this hypervisor ready for VMs again: libvirtd answers; its TLS listener takes this host's own libvirt
    client certificate (when migrations to it use TLS, ``virt:migration:transport``); the events engine
    (``virt_events``) runs since this boot, connected to libvirt (when the minion config starts it).
    ``salt-run virt.roll`` asks it, signed, after a reboot. Returns ``{ready, libvirtd, tls, engine}``, each part
    ``{ok: True|False|None, why}`` (None: not used on this host).

    CLI Example:: salt 'hyper1' virt.host_ready
    """
    config = _c.salt_config(__salt__)
    return _hostready.check(_c.resolve_uri(config), config, __opts__.get("engines"), __opts__["cachedir"])


def host_states(mods=None, test=False, **kwargs):
    """
    Apply this hypervisor's own states (``state.apply``: the highstate without ``mods``, else those SLS; the
    master's file_roots) for ``salt-run virt.roll``, which asks through ``virt.answer`` so the outcome is
    signed. ``test=True``: Salt's dry run. Returns ``{"ret": <state.apply's return>, "retcode": <its retcode>}``;
    the runner judges the state results (a failed state is data here, not this call's error).

    CLI Example:: salt 'hyper1' virt.host_states pkg.upgrade test=True
    """
    if mods is not None and not isinstance(mods, (str, list)):
        raise SaltInvocationError(f"mods must be an SLS name or a list of them, not {mods!r}")
    args = [mods] if mods else []
    ret = __salt__["state.apply"](*args, test=_bool(test))
    # state.apply sets the shared __context__ retcode on a failed state: report it as data, so virt.answer
    # signs the state results themselves instead of an error string
    retcode = __context__.pop("retcode", 0)
    return {"ret": ret, "retcode": retcode}


def answer(fun, nonce, args=None, kwargs=None, tenant=None, capacity=None, **pub):
    """
    Run ``virt.<fun>`` (or the job check ``saltutil.find_job``) and return its answer signed with this
    minion's key for the runner's request ``nonce``: the ``virt`` runner publishes this instead of the
    function itself and believes only answers whose signature the master's accepted key verifies
    (``saltvirt.pki.answers``; docs: "Trust model"). ``args``/``kwargs``: the function's arguments.
    ``tenant``: the runner acts for this tenant on the VM named by the first argument: refused unless that
    VM is defined here with this tenant as its recorded owner. ``capacity`` (``virt.init`` only): the room the new VM
    takes and the master's placement policy, checked on what this host holds now
    (``saltvirt.host.capacity.overcommit``): refused, nothing created, when it no longer fits.

    CLI Example:: salt 'hyper1' virt.answer virt.vm_state n3f6b...
    """
    if not _answers.allowed(fun):
        raise SaltInvocationError(f"virt.answer runs virt.* functions and {_answers.JOB_CHECK} only, not {fun!r}")
    # the job's own __pub_* data (user, jid) reaches the virt function; Salt's job check takes none
    own = {k: v for k, v in pub.items() if k.startswith("__pub_") and fun != _answers.JOB_CHECK}

    def owned():
        with _c.salt_connect(__salt__, (kwargs or {}).get("connection")) as conn:
            _ownership.check(conn, str((args or [None])[0]), str(tenant))

    def fits():
        if tenant is not None:
            owned()
        with _c.salt_connect(__salt__, (kwargs or {}).get("connection")) as conn:
            reasons = _capacity.overcommit(conn, capacity, _c.salt_images_dir(__salt__))
        if reasons:
            raise CommandExecutionError(f"{_answers.NO_ROOM} for {(args or ['the VM'])[0]}: {'; '.join(reasons)}")

    before = fits if capacity is not None and fun == "virt.init" else owned if tenant is not None else None
    cachedir = __opts__["cachedir"]
    ret, retcode = _answers.fenced_outcome(__salt__, __context__, cachedir, fun, args, kwargs, pub, own, before)
    return _answers.sign(__opts__["pki_dir"], __opts__["id"], fun, str(nonce), ret, retcode)


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
