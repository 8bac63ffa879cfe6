"""
``virt`` for ``virt_vm`` resources (docs/topics/resources.md): power, snapshot and backup of the targeted VM,
run by its hypervisor with no minion inside the guest (``salt -C 'T@virt_vm:<uuid>' virt.stop``). Each function
is the hypervisor's ``virt.<same name>`` on the VM found by its UUID (the same library call, the same answer),
for operators only (as ``virt.*``).

A UUID target reaches every hypervisor that has a definition of the VM, so two functions refuse what could act
on a copy defined elsewhere (``saltvirt.host.vmactions``): ``start`` needs libvirt's lock manager
(``virt:lock_manager``), ``snapshot`` and ``backup`` a VM running here. And as Salt also runs a job aimed at
hypervisors (``salt 'hyper*' virt.shutdown web1``) on every VM they manage, each acts only in a job whose target
names VM resources (``T@virt_vm...``, or the VM's UUID).

Not called ``virt.py``: Salt's loader imports an extension module as ``salt.loaded.ext.module.<file name>`` in
every loader, so a ``virt.py`` here would be executed into the same module object as ``_modules/virt.py`` (each
overwriting the other's functions and globals in the minion's process).
"""

import os
import sys
import types
from typing import TYPE_CHECKING

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{resources/virt_vm/modules,utils/saltvirt}
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import operators as _operators
    from saltvirt.base import validate as _validate
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.host import lifecycle as _lifecycle
    from saltvirt.host import snapshot as _snap
    from saltvirt.host import vmactions as _acts
    from saltvirt.host import vmresources as _vmr
    from saltvirt.model import compat as _compat
    from saltvirt.vm import backup as _backup

if TYPE_CHECKING:  # what Salt's per-type resource loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts
    __resource__: dict

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, "virt (virt_vm): the saltvirt library is missing: run saltutil.sync_all"
    if _c.libvirt is None:
        return False, "virt (virt_vm): the libvirt python bindings are not installed"
    return __virtualname__


def _vm(fun, kwargs):
    """``(conn, dom)`` of the targeted VM, found by its UUID (``saltvirt.host.vmactions.vm``), once the call's
    keywords (``kwargs``: Salt's ``__pub_*`` and nothing else) say the job aimed at VM resources."""
    _compat.refuse_unknown(kwargs, (), fun)
    _acts.refuse_untargeted(fun, __resource__["id"], kwargs)
    return _acts.vm(__opts__, __resource__["id"])


def _cfg():
    return _vmr.opts_config(__opts__)


def start(**kwargs):
    """
    Start the targeted VM (a running one is left as is). Returns True, as the hypervisor's ``virt.start``.
    Refused unless libvirt's lock manager guards this hypervisor (``virt:lock_manager``): otherwise
    ``salt-run virt.start <name>`` asks every hypervisor first.

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' virt.start
    """
    with _vm("virt.start", kwargs) as (conn, dom):
        _acts.refuse_start(_cfg(), dom, __opts__["id"])
        return bool(_lifecycle.start(conn, dom.name()))


def stop(**kwargs):
    """
    Hard power-off (as Salt's ``virt.stop``: the guest is not asked). Returns True. ``virt.shutdown`` asks.

    CLI Example:: salt -C 'T@virt_vm and G@group:db' virt.stop
    """
    with _vm("virt.stop", kwargs) as (conn, dom):
        return bool(_lifecycle.destroy(conn, dom.name()))


def shutdown(timeout=0, **kwargs):
    """
    Ask the guest to shut down (ACPI power button); ``timeout`` seconds to wait for it to be off. Returns True
    once the request is delivered.

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' virt.shutdown timeout=60
    """
    timeout = _validate.seconds(timeout, "timeout") if timeout else 0  # checked before the guest is asked
    with _vm("virt.shutdown", kwargs) as (conn, dom):
        return bool(_lifecycle.shutdown(conn, dom.name(), timeout))


def reboot(**kwargs):
    """
    Ask the guest to reboot. Returns True.

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' virt.reboot
    """
    with _vm("virt.reboot", kwargs) as (conn, dom):
        return bool(_lifecycle.reboot(conn, dom.name()))


def force_off(**kwargs):
    """
    Hard power-off (the VM stays defined, its disks stay). Returns ``{name, action, state, previous}``, as the
    hypervisor's ``virt.force_off``.

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' virt.force_off
    """
    with _vm("virt.force_off", kwargs) as (conn, dom):
        return _lifecycle.destroy(conn, dom.name())


def snapshot(name=None, suffix=None, **kwargs):
    """
    Internal snapshot of the targeted VM, running here (every disk qcow2; its memory included). ``name``:
    default ``<vm>-<YYYYmmdd-HHMMSS>``; ``suffix`` is appended. Returns ``{name, memory}``, as the hypervisor's
    ``virt.snapshot``.

    CLI Example:: salt -C 'T@virt_vm and G@group:db' virt.snapshot suffix=before-upgrade
    """
    with _vm("virt.snapshot", kwargs) as (conn, dom):
        vm = dom.name()
        advice = f"Find where it runs with salt-run virt.query, then: salt <that hypervisor> virt.snapshot {vm}"
        _acts.refuse_offline(_cfg(), dom, "virt.snapshot", __opts__["id"], advice)
        return _snap.create(conn, vm, name=name, suffix=suffix)


def backup(disks=None, incremental=False, target=None, **kwargs):
    """
    Back up the targeted VM, running here, into this hypervisor's ``virt:backup:dir``, as the hypervisor's
    ``virt.backup`` (the same arguments and answer); for operators only, whoever else the resource functions
    admit: ``salt-run virt.backup`` applies retention and tenants' ``backup_mib`` quotas, this does not.

    CLI Example:: salt -C 'T@virt_vm and G@group:db' virt.backup incremental=True
    """
    # checked here too: a gate that one day admits tenants to a VM's resource must not let them past the runner's
    # backup_mib quota
    _operators.check(__opts__, "virt.backup", kwargs, "use the runner (salt-run virt.backup <name>)")
    with _vm("virt.backup", kwargs) as (conn, dom):
        root, timeout, key = _backup.configured(__opts__)
        vm = dom.name()
        advice = f"Back it up with salt-run virt.backup {vm}, which asks every hypervisor first"
        _acts.refuse_offline(_cfg(), dom, "virt.backup", __opts__["id"], advice)
        return _backup.backup(conn, root, vm, disks, _bool(incremental), target, timeout=timeout, key=key)


if saltvirt is not None:  # last: published calls are for operators (virt:operators), as virt.*
    _operators.guard_module(globals(), advice=_operators.RESOURCE_ADVICE)
