"""
Engine ``libvirt_events``: Salt's engine of that name, with its options, tags and data, served by the
``virt_events`` engine's watcher (reconnects after a libvirtd restart; ``virt:connection``).

For configuration written for Salt's engine (Uyuni's ``engine-events.sls`` writes exactly
``engines: [libvirt_events]``). It sends only Salt's scheme,
``salt/engines/libvirt_events/<uri>/<domain|network|pool|nodedev|secret>/<event type>``, as the
``virt_events`` engine does with ``tags: libvirt_events`` (tags and data: ``saltvirt.host.saltevents``;
``docs/topics/salt-compat.md``). Minion config, as Salt's::

    engines:
      - libvirt_events:
          uri: qemu:///system     # default: virt:connection:uri (Salt's engine: libvirt's default URI)
          tag_prefix: salt/engines/libvirt_events
          filters: [all]          # all, domain, domain/lifecycle, pool, pool/refresh, ...

Run this or ``virt_events`` with ``tags: libvirt_events``/``both``, not both: each sends Salt's events.
The engine module must be on the minion when it starts: ``saltutil.sync_all``, then restart the minion.
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
    from saltvirt.base import install as _install
    from saltvirt.host import capacity as _capacity
    from saltvirt.host import conn as _c
    from saltvirt.host import events as _events
    from saltvirt.host import mastersend as _mastersend
    from saltvirt.host import saltevents as _saltevents
    from saltvirt.host import vmresources as _vmr

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltGrains, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __grains__: SaltGrains

log = logging.getLogger(__name__)
__virtualname__ = "libvirt_events"


def __virtual__():
    if saltvirt is None:
        return False, (
            "libvirt_events: the saltvirt library is missing: saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"libvirt_events: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def start(uri=None, tag_prefix=None, filters=None, **options):
    """Watch this hypervisor's libvirt and send its events to the master in Salt's ``libvirt_events``
    scheme (runs until the minion stops). ``uri`` is the engine's own option (minion config, the
    operator's), else ``virt:connection:uri``. The ``virt_events`` options (``backoff_min``, ...) work too."""
    options.update(tags="libvirt_events", tag_prefix=tag_prefix or _saltevents.DEFAULT_PREFIX, filters=filters)
    _events.serve(
        __opts__["id"],
        _mastersend.MasterSender(__opts__),
        _c.salt_config(__salt__),
        uri,
        options,
        on_defined=lambda: _capacity.bump(_capacity.cache_dir(__opts__)),
        on_lifecycle=_vmr.follow_lifecycle(__salt__, __opts__, __grains__),
        beat_dir=__opts__["cachedir"],  # salt-run virt.roll waits for it after a reboot (virt.host_ready)
        engine="libvirt_events",
    )
