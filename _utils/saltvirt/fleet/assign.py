"""VMs assigned to a hypervisor by the master's pillar (master side): the library behind
``salt-run virt.provision_assigned host=<id>``, which the reactor example (``salt-virt.reactor.sls``)
runs when a hypervisor says it is ready.

Events are data a minion sends, and root in any VM can send any event. So what to create comes only
from the master: the caller must be one of the configured hypervisors (``virt:hypervisors``, checked
by the runner), and the VMs are the ``virt:assigned_vms`` of *that host's* pillar as this master
compiles it from its own ``pillar_roots``, never from the event::

    # pillar (top.sls targets the hypervisor by minion id)
    virt:
      assigned_vms:
        web1: {cpu: 1, mem: 1024, image: salt://images/web.qcow2}
        db1: {cpu: 2, mem: 4096, image: salt://images/db.qcow2, enable_qcow: True}

The pillar is compiled without the minion's grains (it reports them itself: a top file that targets
on grains does not match here) and without ext_pillars (they may read minion data or issue
certificates). Each entry takes ``cpu``, ``mem``, ``image`` and any other ``salt-run virt.init``
keyword except the ones that choose the host (``host``, ``fallback``, ``tgt``, ``tgt_type``): the VM
goes to the host it is assigned to, or nowhere. A VM whose name is defined on any hypervisor is
skipped, so running it twice creates nothing twice.
"""

import copy
from typing import Any

import salt.pillar
from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import publish

PILLAR_KEY = "assigned_vms"
HOST_KEYS = ("host", "fallback", "tgt", "tgt_type")


def host_pillar(opts: SaltOpts, host: str, saltenv: str = "base", pillarenv: str | None = None) -> Data:
    """Minion ``host``'s pillar as this master compiles it: pillar_roots only, no grains, no ext_pillar."""
    local = copy.deepcopy(dict(opts))
    local.update(ext_pillar=[], on_demand_ext_pillar=[], pillar_cache=False)
    return salt.pillar.Pillar(local, {}, host, saltenv or "base", pillarenv=pillarenv).compile_pillar()


def entries(pillar: Data) -> tuple[dict[str, Data], dict[str, str]]:
    """``virt:assigned_vms`` of a compiled pillar -> ``({name: spec}, {name: error})``; a bad entry is
    reported and left out, the others stay."""
    raw = ((pillar or {}).get("virt") or {}).get(PILLAR_KEY) or {}
    if not isinstance(raw, dict):
        raise SaltInvocationError(f"pillar virt:{PILLAR_KEY} must be a mapping of VM name -> spec, not {raw!r}")
    good, bad = {}, {}
    for name, spec in raw.items():
        try:
            good[validate.vm_name(name)] = check_spec(name, spec)
        except SaltInvocationError as exc:
            bad[str(name)] = str(exc)
    return good, bad


def check_spec(name: str, spec: Any) -> Data:
    """One assignment: a mapping with ``cpu`` and ``mem``; no key that would choose another host."""
    if not isinstance(spec, dict):
        raise SaltInvocationError(f"virt:{PILLAR_KEY}:{name} must be a mapping (cpu, mem, image, ...), not {spec!r}")
    missing = [k for k in ("cpu", "mem") if spec.get(k) in (None, "")]
    if missing:
        raise SaltInvocationError(f"virt:{PILLAR_KEY}:{name}: {' and '.join(missing)} missing")
    placing = sorted(set(spec) & set(HOST_KEYS))
    if placing:
        raise SaltInvocationError(
            f"virt:{PILLAR_KEY}:{name}: {', '.join(placing)} not allowed: an assigned VM goes to the host it is "
            "assigned to (move it to that host's pillar)"
        )
    return dict(spec)


def plan(assigned: dict[str, Data], hosts: dict[str, Data]) -> tuple[list[str], dict[str, list[str]]]:
    """Which assigned VMs to create: ``(to_create, existing)`` where ``existing`` maps a name to the
    hypervisors it is defined on (``hosts`` from ``fleet.gather(..., "virt.vm_state")``)."""
    existing: dict[str, list[str]] = {}
    for host, ans in hosts.items():
        for vm in (ans.get("vms") or {}) if ans.get("status") == "up" else ():
            existing.setdefault(vm, []).append(host)
    to_create = [name for name in sorted(assigned) if name not in existing]
    return to_create, {name: sorted(existing[name]) for name in sorted(assigned) if name in existing}


def confirm_ready(fleet: publish.Fleet, host: str, nonce: Any) -> None:
    """Ask ``host`` (a job only it answers) whether it fired the ready event carrying ``nonce``
    (``virt.ready``); SaltInvocationError when it does not say yes. Salt lets any minion forge an event's
    tag and data, so a reactor run for a ready event acts only after this."""
    why = "no nonce in the event"
    if isinstance(nonce, str) and nonce:
        answer, _ = fleet.call(host, "virt.ready_confirm", [nonce])
        if answer.get("status") == "up" and answer.get("ret") is True:
            return
        why = answer.get("error") or "it did not send it, or it was used already"
    raise SaltInvocationError(
        f"{host} did not confirm that it sent this ready event ({why}): nothing provisioned. Any minion can "
        "forge an event; a hypervisor announces itself with salt-call virt.ready (salt-virt.example.sls does)"
    )
