"""
States ``virt`` (continued): Salt's deprecated ``virt.unpowered`` (= ``virt.powered_off``).
"""

import os
import sys
import types
from typing import TYPE_CHECKING

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{states,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions

    __states__: SaltFunctions

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt states: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    return __virtualname__


def unpowered(name, connection=None):
    """
    Salt's deprecated name of ``virt.powered_off``: the VM is off, forcibly if needed. The result
    carries a warning naming ``virt.powered_off``.

    .. code-block:: yaml

        web1:
          virt.unpowered
    """
    ret = __states__["virt.powered_off"](name, connection=connection)
    ret.setdefault("warnings", []).append("virt.unpowered is deprecated (as in Salt): use virt.powered_off")
    return ret
