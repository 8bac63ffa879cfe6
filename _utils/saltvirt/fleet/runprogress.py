"""What ``salt-run`` shows while a runner works: ``[progress]`` lines on the caller's terminal (only with a
human output: machine outputs stay plain data) and ``virt.init``'s steps as events on the master bus.

One list of machine outputs and one way to show a line, for every runner file (issue 35: ``virt.py`` and
``virt_backup.py`` each kept a list, and they had drifted: the backup's showed lines under ``--out=pprint``); and
one way the master side announces on its bus (:func:`fire`: virt.init's steps, balancing rounds, HA decisions),
which is an announcement only: any minion can fire any tag there, so nothing is ever decided from it.
"""

import collections
import logging
import os
import re
import time
from typing import Any

from saltvirt.base.salttypes import Data, SaltOpts

log = logging.getLogger(__name__)

# ``--out`` values whose output is data a program reads: no progress lines among it
MACHINE_OUTPUTS = ("json", "yaml", "raw", "pprint", "quiet", "no_return", "txt")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def human_output(opts: SaltOpts) -> bool:
    """Whether ``salt-run`` prints for a person (not ``--quiet``, not a machine output)."""
    return not opts.get("quiet") and opts.get("output") not in MACHINE_OUTPUTS


def printable(text: str) -> str:
    """``text`` without control characters (a hypervisor's values are shown on the caller's terminal)."""
    return _CONTROL.sub("?", text)


def show(opts: SaltOpts, jid_event: Any, message: str, outputter: str | None = None) -> None:
    """A ``[progress]`` line under ``salt-run`` (``jid_event``: the runner's ``__jid_event__``), only for a human
    output; never fails the work (outside a RunnerClient there is no one to show it to)."""
    if not human_output(opts):
        return
    data = {"message": printable(message), **({"outputter": outputter} if outputter else {})}
    try:
        jid_event.fire_event(data, "progress")
    except Exception as exc:  # noqa: BLE001 - e.g. called outside a RunnerClient
        log.debug("virt runner: no progress output: %s", exc)


def master_bus_listening(opts: SaltOpts) -> bool:
    """Whether a master's event bus can be there: its pull socket exists (``ipc_mode: tcp`` has no file to
    look at, so that case says yes and Salt's connect decides)."""
    if opts.get("ipc_mode") == "tcp":
        return True
    return os.path.exists(os.path.join(opts["sock_dir"], "master_event_pull.ipc"))


def fire(opts: SaltOpts, tag: str, data: Data, level: int = logging.DEBUG) -> None:
    """Fire ``data`` as ``tag`` on the master's event bus, best effort: an announcement (progress, a decision that is
    logged anyway), never a source of facts. A failure is logged at ``level`` and the work goes on."""
    import salt.utils.event  # noqa: PLC0415 - the master's bus, only when something is announced

    if not master_bus_listening(opts):
        # Salt's connect would retry a missing socket in a busy loop for its whole 1 s timeout
        log.log(level, "salt-virt: could not fire %s: no master event socket in %s", tag, opts["sock_dir"])
        return
    try:
        with salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=False) as bus:
            bus.fire_event(dict(data), tag)
    except Exception as exc:  # noqa: BLE001 - an announcement never fails the work
        log.log(level, "salt-virt: could not fire %s: %s", tag, exc)


class InitProgress:
    """``virt.init``'s progress: each step fires ``salt/virt/init/<vm>/<step>`` on the master bus and shows a
    line; :mod:`saltvirt.fleet.vmcreate` calls ``mark`` and ``relay`` when they are there; ``timeline`` goes
    into the answer."""

    MESSAGES = {
        "placed": "{vm}: placed on {host} (score {score}): {reason}",
        "key_accepted": (
            "{vm}: key pair for minion {minion_id} generated, public key pre-accepted (sha256 {fingerprint:.16}...)"
        ),
        "fallback": "{vm}: {host} did not answer ({error}); trying {next}",
        "done": "{vm}: created on {host} in {seconds} s",
        "failed": "{vm}: failed: {error}",
    }
    MODULE_MESSAGES = {
        "image_cached": "{vm}: image {image} cached on {host}",
        "disks_ready": "{vm}: disks ready on {host}",
        "seeded": "{vm}: seeded before first boot on {host} ({backend})",
        "defined": "{vm}: defined on {host}",
        "started": "{vm}: started on {host}",
    }

    def __init__(self, vm: str, opts: SaltOpts, jid_event: Any, outputter: str | None = None) -> None:
        self.vm, self.opts, self.jid_event, self.outputter = vm, opts, jid_event, outputter
        self.t0 = time.monotonic()
        self.timeline: list[dict[str, Any]] = []

    def mark(self, step: str, source: str = "runner", **data: Any) -> None:
        """One line of the answer's ``timeline``: seconds since the runner began, when it saw the step."""
        entry = {"step": step, "at": round(time.monotonic() - self.t0, 3), "source": source}
        entry.update({k: data[k] for k in ("host", "status") if data.get(k)})
        # placement's snapshot: how many hypervisors' capacity was pushed, how many were asked (issue 40)
        entry.update({k: data[k] for k in ("pushed", "asked") if data.get(k) is not None})
        self.timeline.append(entry)

    def _show(self, template: str, payload: Data) -> None:
        try:
            message = template.format_map(collections.defaultdict(str, payload))
        except (ValueError, TypeError, KeyError) as exc:  # a value of an unexpected type for its format
            log.debug("virt runner: no progress line for %s: %s", payload.get("step"), exc)
            return
        show(self.opts, self.jid_event, message, self.outputter)

    def relay(self, step: str, data: Data) -> None:
        """A progress event the hypervisor's virt.init fired (already on the bus): only show it."""
        self.mark(step, "hypervisor", host=data.get("host"))
        self._show(self.MODULE_MESSAGES.get(step, "{vm}: {step} on {host}"), dict(data, vm=self.vm, step=step))

    def __call__(self, step: str, **data: Any) -> None:
        payload = dict(data, vm=self.vm, step=step, source="runner")
        self.mark(step, host=data.get("host"))
        fire(self.opts, f"salt/virt/init/{self.vm}/{step}", payload)
        self._show(self.MESSAGES.get(step, "{vm}: {step}"), payload)
