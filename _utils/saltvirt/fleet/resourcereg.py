"""A hypervisor decided down drops out of Salt's resource registry (master side; the ``virt_vm`` resources,
docs/topics/resources.md).

Salt 3008.5 keeps a minion's resources registered until the minion registers again: a dead hypervisor's VMs
would stay targetable (``salt -C 'T@virt_vm...'`` waiting for answers that never come) and listed under its id.
When salt-virt's master side decides from what Salt authenticates that a hypervisor is down, :func:`drop`
unregisters every resource of that minion (``ResourceRegistry.unregister_minion``) and flushes their grains from
the ``resource_grains`` bank. The decisions that call it: the runner's give-up on a hypervisor silent for
``down_after`` seconds (no signed reply, nor to its job checks: :mod:`saltvirt.fleet.replies`, the same decision
that :mod:`saltvirt.fleet.silence` remembers) and automatic HA's lost host (:mod:`saltvirt.fleet.ha`: that and no
connection). Never anything from the event bus, nor the registry's own contents (any minion can register any id).

A minion registers again when it starts (Salt's ``tune_in``, also after a failover to another master), but not
when a running minion's connection comes back (Salt 3008.5's ``__master_connected`` handler does not): a host
dropped while only cut off would stay out. So a dropped minion is marked (a file per minion in the master's
cachedir), and the first reply it signs again (:func:`restore`, from :mod:`saltvirt.fleet.replies`) publishes
``saltutil.refresh_resources`` to it alone: it discovers its VMs and registers them again.
"""

import contextlib
import logging
import os
from typing import Any

from saltvirt.base.salttypes import SaltOpts

log = logging.getLogger(__name__)

REFRESH = "saltutil.refresh_resources"


def _mark(opts: SaltOpts, minion: str) -> str | None:
    if not isinstance(minion, str) or not minion or os.sep in minion or minion.startswith("."):
        return None  # never a path outside the folder (accepted minion ids never look like this)
    return os.path.join(opts["cachedir"], "salt-virt", "unregistered", minion)


def drop(opts: SaltOpts, minion: str, why: str) -> int:
    """Unregister every resource ``minion`` manages (it was decided down: ``why``); how many. Never raises: a
    registry that cannot be written leaves the resources registered (the log says so)."""
    import salt.cache  # noqa: PLC0415 - Salt's registry and cache, only when a host is down
    import salt.utils.resource_registry as registry  # noqa: PLC0415

    try:
        reg = registry.get_registry(opts)
        held = reg.get_resources_for_minion(minion)
        count = reg.unregister_minion(minion)
    except Exception as exc:  # noqa: BLE001 - the decision stands; only the registry lags
        log.warning("virt: %s is down (%s), but its resources could not be unregistered: %s", minion, why, exc)
        return 0
    if not count:
        return 0
    if opts.get("minion_data_cache", True):  # the grains Salt stored for them (G@ targeting of resources)
        try:
            cache = salt.cache.factory(opts)
            for rtype, rids in held.items():
                for rid in rids:
                    if not reg.get_managing_minions_for_srn(rtype, rid):  # no other minion took it since
                        cache.flush(registry.RESOURCE_GRAINS_BANK, registry.resource_index_srn_key(rtype, rid))
        except Exception as exc:  # noqa: BLE001 - the ids are unregistered: stale grains match no T@
            log.warning("virt: the grains of %s's resources were not flushed: %s", minion, exc)
    path = _mark(opts, minion)
    if path is not None:
        with contextlib.suppress(OSError):  # unmarked: it registers again at its next start or lifecycle event
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
    log.warning(
        "virt: %s is down (%s): its %d resource(s) unregistered; it registers them again when it answers",
        minion,
        why,
        count,
    )
    return count


def restore(opts: SaltOpts, client: Any, minion: str) -> bool:
    """``minion`` signed a reply: if :func:`drop` unregistered its resources, ask it (``saltutil.refresh_resources``,
    a job for it alone) to register them again. True when asked."""
    path = _mark(opts, minion)
    if path is None or not os.path.exists(path):
        return False
    try:
        client.run_job([minion], REFRESH, [], "list", listen=False)
    except Exception as exc:  # noqa: BLE001 - marked still: its next signed reply asks again
        log.warning("virt: could not ask %s to register its resources again: %s", minion, exc)
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("virt: %s answers again: asked it to register its resources", minion)
    return True
