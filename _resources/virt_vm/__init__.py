"""
Resource type ``virt_vm`` (Salt 3008 Resources): the VMs libvirt has on a hypervisor minion, each a resource
whose id is the VM's UUID, served by that minion with no minion inside the guest
(``salt -C 'T@virt_vm:<uuid>' test.ping``). The logic is ``saltvirt.host.vmresources``; the user guide is
docs/topics/resources.md.

A hypervisor minion manages them once the operator's pillar declares the type for it::

    resources:
      virt_vm: {}
"""

import logging
import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltException

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{resources/virt_vm,utils/saltvirt}, or a checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import install as _install
    from saltvirt.host import conn as _c
    from saltvirt.host import guestips as _guestips
    from saltvirt.host import vmresources as _vmr
    from saltvirt.model import tenancy as _tenancy

if TYPE_CHECKING:  # what Salt's resource loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __context__: SaltContext
    __resource__: dict
    __salt__: SaltFunctions  # the managing minion's own execution modules (salt/minion.py gen_modules)

log = logging.getLogger(__name__)
__virtualname__ = "virt_vm"
_CTX = "virt_vm_resource"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt_vm: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt_vm: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _rid():
    return _vmr.resource_id(__resource__["id"])


def init(opts):
    """Called once per minion process before any per-resource call."""
    __context__[_CTX] = {"initialized": True}


def initialized():
    """Whether :func:`init` ran."""
    return bool(__context__.get(_CTX, {}).get("initialized"))


def discover(opts):
    """The UUIDs of every VM defined or running on this minion's libvirt (``virt:connection``)."""
    with _vmr.connect(opts) as conn:
        return _vmr.discover(conn)


def grains():
    """Facts libvirt has about the current VM (``{}`` once it left this host)."""
    with _vmr.connect(__opts__) as conn:
        return _vmr.grains(conn, _rid(), __opts__["id"])


def grains_refresh():
    """Same as :func:`grains`: nothing is cached on the minion."""
    return grains()


def ping():
    """True when the current VM is on this host and running, and its guest agent answers where it has an agent
    channel (within ``virt:guest_agent_timeout``)."""
    timeout = _guestips.agent_timeout(_vmr.opts_config(__opts__))
    with _vmr.connect(__opts__) as conn:
        return _vmr.ping(conn, _rid(), timeout)


def tenant_owns(user):
    """True when Salt user ``user`` is a member of the tenant that owns the current VM: the tenant gate of the
    type's functions (``saltvirt.base.operators.TENANT_GATE``; docs/topics/resources.md). The membership is
    the master's, in this minion's compiled pillar, read through the minion's own modules: Salt hands a
    resource loader a copy of the pillar it had when the loaders were built, and ``saltutil.refresh_pillar``
    updates only the minion's own (``salt/minion.py``, ``pillar_refresh``). Any failure refuses."""
    try:
        # unmask: Salt 3008's pillar.get otherwise answers '**********' for every value (salt/utils/secret.py)
        pillar = {_tenancy.MEMBERS_PILLAR: __salt__["pillar.get"](_tenancy.MEMBERS_PILLAR, {}, unmask=True)}
        with _vmr.connect(__opts__) as conn:
            return _vmr.tenant_owns(conn, _rid(), pillar, user)
    except (SaltException, KeyError) as exc:  # anything else is raised: the call fails, nothing runs
        log.warning("virt_vm: the tenant gate refused %s on %s: %s", user, __resource__.get("id"), exc)
        return False


def shutdown(opts):
    """Called when the minion stops managing the type."""
    __context__.pop(_CTX, None)
