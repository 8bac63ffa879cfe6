"""The loop of a master engine that runs rounds (``virt_balance``: :mod:`saltvirt.fleet.balancer`, ``virt_ha``:
:mod:`saltvirt.fleet.ha`): one round every ``interval`` seconds, each with the ``virt`` settings the master config
file has now, a failed round logged and the next one on time."""

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from salt.exceptions import SaltException

from saltvirt.base import validate
from saltvirt.base.salttypes import Data, SaltOpts

log = logging.getLogger(__name__)


def current_opts(opts: SaltOpts) -> SaltOpts:
    """``opts`` with the ``virt`` settings (``virt`` and old flat ``virt.*`` keys) the master config file has now:
    what an engine's rounds read, so that ``virt:balance`` or ``virt:ha`` (``enabled`` first of all) takes effect at
    the next round without restarting the salt-master, as the runner does. A config file that cannot be read now
    leaves ``opts`` as they are (logged)."""
    import salt.config  # noqa: PLC0415 - only where an engine reads the config again

    path = opts.get("conf_file")
    if not path or not os.path.isfile(path):
        return opts
    try:
        fresh = salt.config.master_config(path)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a config being edited (Salt exits on a YAML error)
        log.warning(
            "salt-virt engine: could not read %s again (%s): this round uses the settings read before", path, exc
        )
        return opts
    kept = {k: v for k, v in opts.items() if not (k == "virt" or (isinstance(k, str) and k.startswith("virt.")))}
    virt = {k: v for k, v in fresh.items() if k == "virt" or (isinstance(k, str) and k.startswith("virt."))}
    return dict(kept, **virt)


def serve(
    name: str,
    opts: SaltOpts,
    run_round: Callable[..., Data],
    report: Callable[[Data], None],
    interval: Any,
    stop: threading.Event | None = None,
    client_factory: Callable[[], Any] | None = None,
    reload: Callable[[SaltOpts], SaltOpts] | None = None,
) -> None:
    """Run ``run_round(opts, client=...)`` every ``interval`` seconds until ``stop`` is set, ``report`` each answer
    (engine ``name`` in the log). A bad ``interval`` is logged and the loop idles (Salt would restart a failing
    engine at once); a failed round is logged and the next one runs on time. ``client_factory()``: a LocalClient
    as a context manager (None: the master's). ``reload(opts)``: the opts of each round (the engines':
    :func:`current_opts`); None: ``opts`` as given."""
    stop = stop or threading.Event()
    try:
        seconds = validate.seconds(interval, f"{name} engine: interval")
    except SaltException as exc:
        log.error("%s engine not started: %s", name, exc)
        stop.wait()
        return
    factory = client_factory or (lambda: _local_client(opts))
    while not stop.is_set():
        try:
            round_opts = reload(opts) if reload else opts
            with factory() as client:
                report(run_round(round_opts, client=client))
        except Exception as exc:  # noqa: BLE001 - one failed round stops no later one
            log.error("%s: the round failed: %s", name, exc)
        stop.wait(seconds)


def _local_client(opts):
    import salt.client  # noqa: PLC0415 - the engine's own; tests pass theirs

    return salt.client.get_local_client(opts["conf_file"])
