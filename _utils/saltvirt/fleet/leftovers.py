"""Master side of cleaning up after an interrupted ``salt-run virt.init``.

* ``salt-run virt.purge NAME`` of a VM that is defined nowhere: ``virt.cleanup`` on every hypervisor, and
  the runner's stale init lock (:func:`purge_leftovers`); of a VM it purged: ``virt.cleanup`` on every
  other hypervisor too (:func:`cleanup_everywhere`): an init that fell over from one host to another left
  its first attempt's disks and seeding there.
* Hosts a ``virt.init`` abandoned (published, no answer, fell over or gave up) are remembered in the
  shared store (bank ``salt-virt/abandoned``, one entry per hypervisor: ``{vm: {jid, status, at,
  master}}``, :func:`remember`); :func:`heal` runs ``virt.cleanup`` there once they answer (``salt-run
  virt.record``, scheduled, and ``virt.purge`` call it) and forgets an entry once its cleanup finished.

The pre-accepted key is deleted by the runner's purge like any purged VM's key."""

import logging
import time
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError

from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import fleetstate

log = logging.getLogger(__name__)
ABANDONED = "salt-virt/abandoned"


def master_running(opts: SaltOpts) -> bool:
    """Whether this master's salt-master still accepts connections on its ret port (the runner runs on
    the master host): when it stopped, a hypervisor that "did not answer" had no master to answer to."""
    import socket  # noqa: PLC0415 - only on this rare path

    host = opts.get("interface") or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((host, int(opts.get("ret_port", 4506))), timeout=5):
            return True
    except OSError:
        return False


def master_gone_message(name: str, host: str, jid: str | None, key_id: str | None) -> str:
    return (
        f"the salt-master stopped while virt.init of {name} ran on {host}"
        + (f" (job {jid})" if jid else "")
        + ": its outcome is unknown and "
        f"the job may finish without the master. Once the master is back, `salt-run virt.query` shows whether "
        f"{name} exists; the pre-accepted key of {key_id} is kept for it (`salt-run virt.purge {name}` removes the "
        "VM, whatever an interrupted init left, and the key)"
    )


def remember(store: fleetstate.Store, host: str, name: str, jid: str | None, status: str, master: str | None) -> None:
    """Note that a ``virt.init`` of ``name`` was left running (or dying) on ``host`` (best effort: a store
    that cannot be written only loses the automatic cleanup, which ``virt.purge NAME`` still does)."""
    entry = {"jid": jid, "status": status, "at": time.time(), "master": master}
    try:
        store.transact(ABANDONED, host, lambda old: dict(old or {}, **{name: entry}))
    except CommandExecutionError as exc:
        log.warning("virt.init of %s: could not remember that %s was abandoned: %s", name, host, exc)


def _forget(store, host, name):
    store.transact(ABANDONED, host, lambda old: {n: v for n, v in (old or {}).items() if n != name} or None)


def _cleaned(ans):
    """``(report, finished)`` of one ``virt.cleanup`` answer."""
    if ans["status"] != "up":
        return {"error": f"{ans['status']}: {ans.get('error')}"}, False
    ret = ans["ret"] if isinstance(ans["ret"], dict) else {"error": str(ans["ret"])}
    if str(ret.get("domain") or "").startswith("kept: a complete VM"):
        ret = dict(
            ret,
            note="the abandoned virt.init finished there after all: that VM is complete and kept "
            "(virt.purge it there if the VM was created on another host too)",
        )
    return ret, not (ret.get("error") or ret.get("errors"))


def heal(call: Callable[..., Any], store: fleetstate.Store, name: str | None = None) -> Data:
    """``virt.cleanup`` of each VM (or only ``name``) on the hosts :func:`remember` noted, where they
    answer now: ``{host: {vm: virt.cleanup's answer or {error}}}``. ``call(host, fun, args)``: one
    publication, answered as :func:`saltvirt.fleet.publish.call` does (``{status, ret|error}``). An entry
    goes once its cleanup finished; a host still silent (or still running that init: cleanup refuses)
    keeps it."""
    report: Data = {}
    for host, vms in sorted(store.entries(ABANDONED).items()):
        for vm in sorted(n for n in vms if name is None or n == name):
            ans = call(host, "virt.cleanup", [vm])
            report.setdefault(host, {})[vm], finished = _cleaned(ans)
            if finished:
                _forget(store, host, vm)
            elif ans["status"] in ("down", "timeout"):
                break  # still silent: its other entries wait too
    return report


def publish_call(opts: SaltOpts, cfg: Data, client: Any) -> Callable[..., Any]:
    """:func:`heal`'s ``call`` through Salt (the runner)."""
    from saltvirt.fleet import publish as fleet  # noqa: PLC0415 - fleet imports this module

    return lambda host, fun, args: fleet.call(opts, host, fun, args, cfg=cfg, client=client)[0]


def cleanup_everywhere(
    opts: SaltOpts, name: str, cfg: Data, client: Any, store: fleetstate.Store | None = None
) -> Data:
    """``virt.cleanup name`` on every hypervisor (what an interrupted or abandoned init left; a complete
    VM is never touched): ``{host: answer}``; the abandoned-init entries of hosts that finished go."""
    from saltvirt.fleet import publish as fleet  # noqa: PLC0415 - fleet imports this module

    answers, _jid = fleet.run(opts, "virt.cleanup", [name], cfg=cfg, client=client)
    report = {}
    for mid, ans in answers.items():
        report[mid], finished = _cleaned(ans)
        if finished and store is not None and name in (store.fetch(ABANDONED, mid) or {}):
            _forget(store, mid, name)
    return report


def purge_leftovers(
    opts: SaltOpts, name: str, cfg: Data, client: Any, store: fleetstate.Store | None = None
) -> Data | None:
    """None if ``name`` is defined somewhere or a hypervisor did not answer (the VM may be there);
    otherwise run ``virt.cleanup name`` everywhere and return ``{name, defined, cleanup}`` (each hypervisor's
    cleanup refuses while a virt.init of ``name`` runs there: its init lock)."""
    from saltvirt.fleet import publish as fleet  # noqa: PLC0415 - fleet imports this module

    hosts = fleet.gather(opts, "virt.vm_state", cfg, client)
    if fleet.down_hosts(hosts) or any(name in (a.get("vms") or {}) for a in hosts.values()):
        return None
    report = cleanup_everywhere(opts, name, cfg, client, store)
    failed = sorted(m for m, r in report.items() if "error" in r or r.get("errors"))
    out = {"name": name, "defined": False, "cleanup": report}
    if failed:
        out["error"] = f"virt.cleanup of {name} did not finish on {', '.join(failed)}: see cleanup"
    return out
