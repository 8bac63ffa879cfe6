"""The per-VM guards of ``salt-run virt.recover`` (:mod:`saltvirt.fleet.recovery`): what stands between a
restart plan and a VM running twice on one disk. Each is checked under the VM's runner lock, right
before a copy is started anywhere, whatever the plan (made from an older snapshot) said:

1. :func:`last_look`: every hypervisor but the failed one (proven down and fenced: asking it would only
   wait out its silence) is asked again (``virt.recovery_where``: by name and UUID, defined or running). A
   copy anywhere refuses; so does a hypervisor that does not answer (it may run the VM: migrated since the
   last record), unless ``force=True``;
2. :func:`claim`: the VM's entry in the shared store (bank ``salt-virt/recovery-vms``, one per VM name,
   the ``cache:`` every master shares) goes to ``recovering`` (who, from, to, when) in one
   compare-and-set before the start, and to ``recovered`` after it (:func:`settle`). An entry another
   run left refuses: ``recovered`` always (the record used predates that recovery), ``recovering``
   (a run died or lost its target mid-start: the VM may be starting there) unless ``force=True``.
   An entry is superseded once a record of the failed host newer than it shows the VM there again.
"""

import os
import time
from typing import Any

from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import fleetstate, publish

VMS = "salt-virt/recovery-vms"
UNSURE = ("down", "timeout")  # a restart call with no answer: it may have started the VM


def _ts(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else "?"


def last_look(
    remote: publish.Fleet, name: str, uuid: str | None, host: str, force: bool = False, in_place: bool = False
) -> Data:
    """Ask every hypervisor but ``host`` (the failed one, fenced by now) where ``name``/``uuid`` is defined;
    raises :class:`fleet.Failed` when a copy exists anywhere, or (without ``force``) when one did not answer.
    ``in_place``: the VM is started again where it is defined, on ``host`` (a crash's remediation): ``host`` is
    asked too and must answer, and its copy there is the one to start. Returns ``{hypervisor: status}``."""
    if in_place:
        answers = remote.answers("virt.recovery_where", name, uuid)
    else:
        peers = [h for h in remote.target() if h != host]
        answers = remote.answers("virt.recovery_where", name, uuid, tgt=peers) if peers else {}
    seen, silent = {}, {}
    for peer, ans in sorted(answers.items()):
        if ans["status"] != "up":
            seen[peer] = ans["status"]
            silent[peer] = f"{ans['status']}: {ans.get('error') or 'no answer'}"
            continue
        seen[peer] = "up"
        for dom in ans["ret"] or []:
            if in_place and peer == host:
                continue
            raise publish.Failed(
                f"refusing to restart {name}: {dom['name']} (UUID {dom['uuid']}) is defined on {peer} "
                f"({dom['state']}) now: not starting a second copy",
                last_look=seen,
            )
    if silent and not force:
        raise publish.Failed(
            f"refusing to restart {name}: {', '.join(f'{p} ({w})' for p, w in silent.items())} did not answer, "
            f"and may run it (migrated there since the last record). Bring it back, or retry with force=True "
            "once you know it does not run the VM",
            last_look=seen,
        )
    return seen


def _blocks(old, rec, name, force):
    """Why ``old`` (the VM's store entry) forbids a new start from record ``rec``, or None."""
    if not old:
        return None
    vm = (rec.get("vms") or {}).get(name) or {}
    if (rec.get("recorded") or 0) > (old.get("at") or 0) and (not old.get("uuid") or vm.get("uuid") == old["uuid"]):
        return None  # the failed host was recorded with the VM after that entry: it is history
    who = f"by {old.get('master') or '?'} (pid {old.get('pid') or '?'}) at {_ts(old.get('at'))}"
    if old.get("state") == "recovered":
        return (
            f"{name} was already recovered from {old.get('from')} to {old.get('to')} {who}; this run's record "
            "predates that: run salt-run virt.record, then recover again if it is still needed"
        )
    if force:
        return None
    return (
        f"a recovery of {name} from {old.get('from')} to {old.get('to')} started {who} and did not finish: "
        f"it may be starting there. Check {old.get('to')} (salt {old.get('to')} virt.vm_state), then retry "
        "with force=True"
    )


def claim(
    store: fleetstate.Store, rec: Data, name: str, host: str, target: str, opts: SaltOpts, force: bool = False
) -> Any:
    """Mark ``name`` ``recovering`` (from ``host`` to ``target``) in the shared store, in one
    compare-and-set with the check of what another run left there; raises :class:`fleet.Failed`."""
    uuid = ((rec.get("vms") or {}).get(name) or {}).get("uuid")

    def update(old):
        why = _blocks(old, rec, name, force)
        if why:
            raise publish.Failed(f"refusing to restart {name}: {why}", store_entry=old)
        return {
            "state": "recovering",
            "name": name,
            "uuid": uuid,
            "from": host,
            "to": target,
            "at": time.time(),
            "master": opts.get("id"),
            "pid": os.getpid(),
        }

    return store.transact(VMS, name, update)


def settle(store: fleetstate.Store, name: str, outcome: str) -> Any:
    """After the start: ``recovered`` (it runs), ``failed`` (refused there, definition undone: the entry
    goes) or ``unsure`` (no answer: it may be starting; the ``recovering`` entry stays)."""

    def update(old):
        if outcome == "failed":
            return None
        if outcome == "unsure" or not old:
            return old
        return dict(old, state="recovered", at=time.time())

    return store.transact(VMS, name, update)
