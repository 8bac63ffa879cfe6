"""
Engine ``virt_console``: makes the web console's VNC tickets one-time (docs/topics/console.md).

Runs on a hypervisor minion. When QEMU reports that a VNC client passed authentication (libvirt's graphics
event, phase ``initialize``), it sets a new random password on that VM's console that nobody knows, already
expired: the ticket that opened it opens nothing more, the session it opened stays. It touches a heartbeat
file (``<cachedir>/saltvirt/virt_console.alive``) while it watches; ``virt.console`` refuses to issue
tickets when the heartbeat is stale. The logic lives in ``saltvirt.host.vncticket``.

Minion config (the connection is ``virt:connection``, as for the ``virt`` module)::

    engines:
      - virt_console: {}
"""

import logging
import os
import sys
import threading
import types
from typing import TYPE_CHECKING

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{engines,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import install as _install
    from saltvirt.host import conn as _c
    from saltvirt.host import vncticket as _vncticket

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions

log = logging.getLogger(__name__)
__virtualname__ = "virt_console"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt_console: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt_console: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def start(connection=None):
    """Spend each console password at its first use (runs until the minion stops)."""
    get = _c.salt_config(__salt__)
    _vncticket.watch(
        lambda: _c.configured_connect(get, connection),
        _vncticket.heartbeat_path(__opts__["cachedir"]),
        threading.Event(),
    )
