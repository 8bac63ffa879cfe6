"""Master side of cleaning up after an interrupted ``salt-run virt.init``.

* ``salt-run virt.purge NAME`` of a VM that is defined nowhere: ``virt.cleanup`` on every hypervisor, and
  the runner's stale init lock (:func:`purge_leftovers`); of a VM it purged: ``virt.cleanup`` on every
  other hypervisor too (:func:`cleanup_everywhere`, also ``salt-run virt.cleanup NAME``): an init that
  fell over from one host to another left its first attempt's disks and seeding there.
* Hosts a ``virt.init`` abandoned (published, no answer, fell over or gave up) are remembered in the
  shared store (bank ``salt-virt/abandoned``, one entry per hypervisor: ``{vm: {jid, status, at,
  master}}``, :func:`remember`); :func:`heal` runs ``virt.cleanup`` there once they answer (``salt-run
  virt.record``, scheduled, and ``virt.purge`` call it) and forgets an entry once its cleanup finished.

Leftovers are judged by UUID across the fleet, never by name on one host (a VM of that name may run
from the same shared ``virt:images`` on another hypervisor): before any ``virt.cleanup`` every
configured hypervisor is asked which VM uuids it defines (:func:`defined_uuids`), and the cleanup gets
them (``fleet_uuids``): a hypervisor deletes a manifest's files only when no other defines its uuid. A
hypervisor that does not answer means nothing is proven unused: no cleanup runs, and the report says so.

The pre-accepted key is deleted by the runner's purge like any purged VM's key."""

import logging
import time
from collections.abc import Callable
from typing import Any

from salt.exceptions import CommandExecutionError

from saltvirt.base.salttypes import Data
from saltvirt.fleet import fleetstate, publish

log = logging.getLogger(__name__)
ABANDONED = "salt-virt/abandoned"


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


def proof(answers: dict[str, Data]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """``virt.defined_uuids`` answers (:meth:`saltvirt.fleet.publish.Fleet.run`'s shape) -> ``({uuid: [hypervisors
    defining it]}, {hypervisor: why it proves nothing})``."""
    used: dict[str, list[str]] = {}
    silent = {}
    for mid, ans in sorted(answers.items()):
        if ans["status"] != "up" or not isinstance(ans.get("ret"), dict):
            silent[mid] = f"{ans['status']}: {ans.get('error') or ans.get('ret')}"
            continue
        for uuid in ans["ret"]:
            used.setdefault(str(uuid).lower(), []).append(mid)
    return used, silent


def _ask_defined(fleet):
    """Every configured hypervisor's ``virt.defined_uuids``: a call's ``tgt`` narrows where a cleanup runs,
    never which hypervisors are asked (any of them may run a VM from a shared directory)."""
    return fleet.wide().run("virt.defined_uuids")[0]


def defined_uuids(fleet: publish.Fleet) -> tuple[dict[str, list[str]], dict[str, str]]:
    """:func:`proof` of every configured hypervisor's answer."""
    return proof(_ask_defined(fleet))


def unproven(silent: dict[str, str], then: str) -> str:
    """Why nothing was cleaned while the hypervisors in ``silent`` did not answer, and ``then`` (what next)."""
    who = "; ".join(f"{h} ({why})" for h, why in sorted(silent.items()))
    return (
        f"nothing cleaned: {who} did not say which VMs it defines, and such a VM may run from the files "
        f"a cleanup would delete (shared virt:images). {then}"
    )


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


def heal(
    call: Callable[..., Any],
    defined: Callable[[], tuple[dict[str, list[str]], dict[str, str]]],
    store: fleetstate.Store,
    name: str | None = None,
) -> Data:
    """``virt.cleanup`` of each VM (or only ``name``) on the hosts :func:`remember` noted, where they
    answer now: ``{host: {vm: virt.cleanup's answer or {error}}}``. ``call(host, fun, args, kwargs)``: one
    publication, answered as :meth:`saltvirt.fleet.publish.Fleet.call` does (``{status, ret|error}``);
    ``defined()``: :func:`defined_uuids`, asked once when there is something to heal: while a hypervisor
    does not answer it, nothing is cleaned. An entry goes once its cleanup finished; a host still silent
    (or still running that init: cleanup refuses) keeps it."""
    todo = {h: sorted(n for n in vms if name is None or n == name) for h, vms in store.entries(ABANDONED).items()}
    todo = {h: vms for h, vms in sorted(todo.items()) if vms}
    if not todo:
        return {}
    used, silent = defined()
    if silent:
        why = unproven(silent, "Tried again at the next salt-run virt.record")
        return {host: dict.fromkeys(vms, {"error": why}) for host, vms in todo.items()}
    report: Data = {}
    for host, vms in todo.items():
        for vm in vms:
            ans = call(host, "virt.cleanup", [vm], {"fleet_uuids": used})
            report.setdefault(host, {})[vm], finished = _cleaned(ans)
            if finished:
                _forget(store, host, vm)
            elif ans["status"] in ("down", "timeout"):
                break  # still silent: its other entries wait too
    return report


def publish_call(fleet: publish.Fleet) -> Callable[..., Any]:
    """:func:`heal`'s ``call`` through Salt (the runner)."""
    return lambda host, fun, args, kwargs=None: fleet.call(host, fun, args, kwargs)[0]


def publish_defined(fleet: publish.Fleet) -> Callable[[], tuple[dict[str, list[str]], dict[str, str]]]:
    """:func:`heal`'s ``defined`` through Salt (the runner)."""
    return lambda: defined_uuids(fleet)


def cleanup_everywhere(
    fleet: publish.Fleet,
    name: str,
    store: fleetstate.Store | None = None,
    proven: tuple[dict[str, list[str]], dict[str, str]] | None = None,
) -> Data:
    """``virt.cleanup name`` on every hypervisor (what an interrupted or abandoned init left; a complete
    VM is never touched) with the uuids every hypervisor defines (``proven``: :func:`defined_uuids`, asked
    here when not given): ``{host: answer}``; the abandoned-init entries of hosts that finished go. While a
    hypervisor does not answer which uuids it defines, no cleanup runs: ``{that host: {error}}``."""
    used, silent = proven or defined_uuids(fleet)
    if silent:
        why = unproven(silent, f"Run salt-run virt.cleanup {name} once every hypervisor answers")
        return {host: {"error": why} for host in silent}
    answers, _jid = fleet.run("virt.cleanup", [name], {"fleet_uuids": used})
    report = {}
    for mid, ans in answers.items():
        report[mid], finished = _cleaned(ans)
        if finished and store is not None and name in (store.fetch(ABANDONED, mid) or {}):
            _forget(store, mid, name)
    return report


def purge_leftovers(fleet: publish.Fleet, name: str, store: fleetstate.Store | None = None) -> Data | None:
    """None if ``name`` is defined on any hypervisor or one did not answer (the VM may be there);
    otherwise run ``virt.cleanup name`` everywhere and return ``{name, defined, cleanup}`` (each hypervisor's
    cleanup refuses while a virt.init of ``name`` runs there: its init lock)."""
    answers = _ask_defined(fleet)
    used, silent = proof(answers)
    if silent or any(name in a["ret"].values() for a in answers.values() if a["status"] == "up"):
        return None
    report = cleanup_everywhere(fleet, name, store, proven=(used, silent))
    failed = sorted(m for m, r in report.items() if "error" in r or r.get("errors"))
    out = {"name": name, "defined": False, "cleanup": report}
    if failed:
        out["error"] = f"virt.cleanup of {name} did not finish on {', '.join(failed)}: see cleanup"
    return out
