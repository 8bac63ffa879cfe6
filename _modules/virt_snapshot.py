"""
Execution module ``virt`` (continued): VM snapshots (``saltvirt.host.snapshot``), Salt's ``snapshot``,
``list_snapshots``, ``revert_snapshot`` and ``delete_snapshots``. Internal qcow2 snapshots: a running VM's
memory is included; a VM with a raw disk is refused with the reason.
"""

import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltInvocationError

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
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.host import snapshot as _snap

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions

    __salt__: SaltFunctions

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


def _conn(connection=None, kwargs=None):
    return _c.salt_connect_compat(__salt__, connection, kwargs)


def snapshot(domain, name=None, suffix=None, connection=None, **kwargs):
    """
    Take an internal snapshot of VM ``domain`` (every disk qcow2; a running VM's memory included).
    ``name``: default ``<domain>-<YYYYmmdd-HHMMSS>``; ``suffix`` is appended. Returns {name, memory}.

    CLI Example:: salt 'hyper1' virt.snapshot web1 suffix=before-upgrade
    """
    with _conn(connection, kwargs) as conn:
        return _snap.create(conn, domain, name=name, suffix=suffix)


def list_snapshots(domain=None, connection=None, **kwargs):
    """
    {vm: [{name, created, running, current, state, description, parent}] or 'N/A'} for one VM or all,
    oldest first.

    CLI Example:: salt 'hyper1' virt.list_snapshots web1
    """
    with _conn(connection, kwargs) as conn:
        return _snap.list_all(conn, domain)


def revert_snapshot(name, vm_snapshot=None, cleanup=False, connection=None, **kwargs):
    """
    Revert VM ``name`` to snapshot ``vm_snapshot`` or, without it, to the one before its current
    snapshot; ``cleanup``: delete the snapshots taken after it. Returns {reverted, deleted}.

    CLI Example:: salt 'hyper1' virt.revert_snapshot web1 vm_snapshot=web1-before-upgrade cleanup=True
    """
    vm_snapshot = vm_snapshot or kwargs.pop("snapshot", None)  # Salt's own virt.reverted state passed snapshot=
    with _conn(connection, kwargs) as conn:
        return _snap.revert(conn, name, vm_snapshot, cleanup=_bool(cleanup))


def delete_snapshots(name, *names, **kwargs):
    """
    Delete the named snapshots of VM ``name``, or all of them with ``all=True`` (no names and no all:
    refused, nothing deleted). Returns {available, deleted}.

    CLI Example::

        salt 'hyper1' virt.delete_snapshots web1 web1-20250101-120000
        salt 'hyper1' virt.delete_snapshots web1 all=True
    """
    everything = _bool(kwargs.pop("all", False))
    connection = kwargs.pop("connection", None)
    if not names and not everything:
        raise SaltInvocationError(f"name the snapshots of {name} to delete, or pass all=True to delete all of them")
    if names and everything:
        raise SaltInvocationError("give snapshot names or all=True, not both")
    with _conn(connection, kwargs) as conn:
        return _snap.delete(conn, name, names)


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
