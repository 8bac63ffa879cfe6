"""
``test`` for ``virt_vm`` resources (docs/topics/resources.md): ``test.ping`` answers for a VM from its
hypervisor, with or without a minion inside the guest.
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

if TYPE_CHECKING:  # what Salt's per-type resource loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions

    __resource_funcs__: SaltFunctions

__virtualname__ = "test"


def __virtual__():
    if saltvirt is None:
        return False, "test (virt_vm): the saltvirt library is missing: run saltutil.sync_all"
    return __virtualname__


def ping():
    """
    True when the targeted VM is defined on its hypervisor and running, and its QEMU guest agent answers where it
    has an agent channel (``virt:guest_agent_timeout``, 2 s by default).

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' test.ping
    """
    return __resource_funcs__["virt_vm.ping"]()


if saltvirt is not None:  # last: published calls are for operators (virt:operators), as virt.*
    _operators.guard_module(globals(), advice=_operators.RESOURCE_ADVICE)
