"""
Engine ``virt_balance`` (master): continuous balancing, one round every ``interval`` seconds
(``saltvirt.fleet.balancer``; what a round does and ``virt:balance``: ``docs/topics/recovery.md``). A round
runs only with ``virt:balance:enabled: True`` in the master config; each one that ran fires
``salt/virt/balance/round``. ``salt-run virt.balance`` runs one round by hand.

Master config::

    engines:
      - virt_balance:
          interval: 60      # seconds between two rounds

The engine module must be on the master when it starts: ``salt-run saltutil.sync_engines`` (or
``pip install``), then restart the salt-master.
"""

import logging
import os
import sys
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
    from saltvirt.fleet import balancer as _balancer
    from saltvirt.fleet import engineloop as _engineloop

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts

log = logging.getLogger(__name__)
__virtualname__ = "virt_balance"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt_balance: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def start(interval=60):
    """Run a balancing round every ``interval`` seconds until the master stops. A bad ``interval`` is logged and
    the engine idles (Salt would restart a failing engine at once). Each round reads ``virt`` from the master config
    file again: ``virt:balance`` changes (turning it on or off) need no restart."""
    _balancer.serve(__opts__, interval, reload=_engineloop.current_opts)
