"""
``grains`` for ``virt_vm`` resources (docs/topics/resources.md): what the hypervisor knows of a VM
(name, UUID, state, vCPUs, memory, tenant, group, image, MACs), never what the guest says of itself.
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
    from saltvirt.host import vmresources as _vmr

if TYPE_CHECKING:  # what Salt's per-type resource loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions

    __resource_funcs__: SaltFunctions
    __resource__: dict

__virtualname__ = "grains"


def __virtual__():
    if saltvirt is None:
        return False, "grains (virt_vm): the saltvirt library is missing: run saltutil.sync_all"
    return __virtualname__


def _grains():
    got = __resource_funcs__["virt_vm.grains"]()
    if not got:
        raise _vmr.left(__resource__["id"])
    return got


def items():
    """
    The targeted VM's grains, read from libvirt now.

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' grains.items
    """
    return _grains()


def get(key, default=""):
    """
    One grain of the targeted VM (``default`` when it has none).

    CLI Example:: salt -C 'T@virt_vm and G@tenant:acme' grains.get name
    """
    value = _grains().get(key)
    return default if value is None else value


if saltvirt is not None:  # last: published calls are for operators (virt:operators), as virt.*
    _operators.guard_module(globals(), advice=_operators.RESOURCE_ADVICE)
