"""
Engine ``virt_ha`` (master): automatic HA, one round every ``interval`` seconds (``saltvirt.fleet.ha``; what a
round decides from and ``virt:ha``: ``docs/topics/recovery.md``, "Automatic HA"). A round runs only with
``virt:ha:enabled: True`` in the master config; each decision is fired as ``salt/virt/ha/<decision>`` and kept in
the log ``salt-run virt.ha_log`` shows.

Master config::

    engines:
      - virt_ha:
          interval: 10      # seconds between two rounds

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
    from saltvirt.fleet import engineloop as _engineloop
    from saltvirt.fleet import ha as _ha

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts

log = logging.getLogger(__name__)
__virtualname__ = "virt_ha"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt_ha: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def start(interval=10):
    """Run an HA round every ``interval`` seconds until the master stops. A bad ``interval`` is logged and the
    engine idles (Salt would restart a failing engine at once). Each round reads ``virt`` from the master config
    file again: ``virt:ha`` changes (turning it on or off) need no restart."""
    _ha.serve(__opts__, interval, reload=_engineloop.current_opts)
