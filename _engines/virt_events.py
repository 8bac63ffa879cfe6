"""
Engine ``virt_events``: a hypervisor's libvirt domain events on the master's event bus.

Runs on a hypervisor minion; fires ``salt/virt/<minion id>/domain/<vm>/<event>`` to the master for
``started``, ``stopped``, ``crashed`` (QEMU died), ``panicked`` (guest panic), ``migrated`` (in/out),
``rebooted``, ``suspended``, ``resumed``, ``shutdown``, ``defined``, ``undefined``, ``pmsuspended``,
``io_error``, ``control_error``, ``agent_connected``, ``agent_disconnected``. Data: ``name``, ``uuid``,
``event``, ``detail``, ``host``, ``time`` (and a few per-event keys; never secrets). It reconnects when
libvirtd restarts and fires what changed meanwhile with ``reconciled: True``. The logic lives in
``saltvirt.host.events``.

Minion config (the connection is ``virt:connection``, as for the ``virt`` module; ``virt:events:inbox_max``
bounds the events waiting to be sent, beyond it they are dropped and reported as
``salt/virt/<minion id>/engine/dropped``)::

    engines:
      - virt_events:
          backoff_min: 1        # seconds before the first reconnect attempt, doubled up to ...
          backoff_max: 30       # ... this many seconds
          events: [started, stopped, crashed]   # only these (default: all)
          reconcile: True       # after a reconnect, fire what changed while disconnected
          tags: salt-virt       # libvirt_events: Salt's libvirt_events engine tags instead; both: both
          tag_prefix: salt/engines/libvirt_events   # Salt's option, for tags libvirt_events/both
          filters: [all]        # Salt's option: all, domain, domain/lifecycle, pool, pool/refresh, ...

With ``tags: libvirt_events`` (or ``both``) reactors written for Salt's ``libvirt_events`` engine keep
working: ``salt/engines/libvirt_events/<uri>/domain/<lifecycle|reboot|io_error|control_error|
agent_lifecycle>`` with Salt's data (``uri``, ``domain: {name, id, uuid}``, ``event``, ``detail``, ...),
and Salt's other objects: ``network/lifecycle``, ``pool/lifecycle``, ``pool/refresh``,
``nodedev/lifecycle``, ``nodedev/update``, ``secret/lifecycle``, ``secret/value_changed`` (see
``saltvirt.host.saltevents``).

With ``resources: {virt_vm: {}}`` in the minion's pillar (docs/topics/resources.md), each burst of lifecycle
events also makes the minion register its VMs as Salt resources again (``resource_refresh`` on its own bus).

It also keeps this hypervisor's capacity in the master's mine (``virt.push_capacity``: signed, at once after a
VM changes and every ``virt:capacity_push:every`` seconds, default 30; ``0`` turns it off), so ``salt-run
virt.init`` places without asking every hypervisor (docs/topics/capacity.md).

When it starts, it first releases seeding a killed job left behind (``virt.reap_seeding``) and reports
it as ``salt/virt/<minion id>/reaped``.

The engine module must be on the minion when it starts: ``saltutil.sync_all`` (or ``pip install``),
then restart the salt-minion.
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
    from saltvirt.base import validate as _validate
    from saltvirt.host import capacity as _capacity
    from saltvirt.host import conn as _c
    from saltvirt.host import events as _events
    from saltvirt.host import mastersend as _mastersend
    from saltvirt.host import vmresources as _vmr
    from saltvirt.vm import cleanup as _cleanup

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltGrains, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __grains__: SaltGrains

log = logging.getLogger(__name__)
__virtualname__ = "virt_events"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt_events: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt_events: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _reap(minion_id):
    """Seeding a job left behind before this minion (re)started: released, reported to the master
    (``salt/virt/<minion id>/reaped``) and in the log."""
    try:
        out = _cleanup.reap_seeding()
    except Exception as exc:  # noqa: BLE001 - the watcher must start whatever the reaper met
        log.error("virt_events: reaping stale seeding failed: %s", exc)
        return
    if out["removed"] or out["errors"]:
        log.warning("virt_events: stale seeding released: %s; errors: %s", out["removed"], out["errors"])
        try:
            _mastersend.MasterSender(__opts__)(f"salt/virt/{minion_id}/reaped", out)
        except Exception as exc:  # noqa: BLE001 - the log has it
            log.warning("virt_events: could not report the reaped seeding to the master: %s", exc)


def start(connection=None, **options):
    """Watch this hypervisor's libvirt and send its domain events to the master (runs until the minion
    stops). A bad option is logged and the engine idles (Salt would restart a failing engine at once)."""
    _reap(__opts__["id"])
    on_lifecycle = _vmr.follow_lifecycle(__salt__, __opts__, __grains__)
    pusher = _pusher()
    if pusher is not None:
        on_lifecycle = _both(on_lifecycle, pusher.changed)
    # the engine's own ``connection`` option is minion config (operator), not a call argument
    _events.serve(
        __opts__["id"],
        _mastersend.MasterSender(__opts__),
        _c.salt_config(__salt__),
        connection,
        options,
        on_defined=lambda: _capacity.bump(_capacity.cache_dir(__opts__)),
        on_lifecycle=on_lifecycle,
        beat_dir=__opts__["cachedir"],  # salt-run virt.roll waits for it after a reboot (virt.host_ready)
    )


def _pusher():
    """The capacity pusher (``virt:capacity_push:every`` seconds between heartbeats), started; None when off."""
    every = _c.salt_config(__salt__)("virt:capacity_push:every", _capacity.PUSH_EVERY)
    if every in (0, "0", False, None):
        return None
    try:
        every = _validate.seconds(every, "virt:capacity_push:every")
    except Exception as exc:  # noqa: BLE001 - a bad setting: said once; the runner asks the hosts meanwhile
        log.error("virt_events: capacity not pushed: %s", exc)
        return None
    if "virt.push_capacity" not in __salt__:  # the virt module did not load (its reason is in the log)
        log.warning("virt_events: capacity not pushed: virt.push_capacity is not available on this minion")
        return None
    # captured now: the pusher's thread has no loader context of its own (a loaded function carries its own)
    return _capacity.Pusher(__salt__["virt.push_capacity"], every=every).start()


def _both(first, second):
    def hook(*args):
        try:
            first(*args)
        finally:
            second(*args)

    return hook
