"""Who the hypervisors are: one master-side definition, used by the ``libvirt`` ext_pillar (who gets
certificates), the runner's fan-out, placement, sealing of new minion keys and migration/evacuation
targets.

Every VM that ``virt.init`` creates is a minion of the same master, and root in a guest controls that
minion's grains, config and answers. So hypervisor identity comes only from what the master's operator
controls: the minion ids in the master config (and the keys the master accepted for them)::

    virt:
      hypervisors: [hyper1, hyper2]          # minion ids
      # or a glob on ids:      hypervisors: 'hyper*'
      # or a regular expression on ids:   hypervisors: {tgt: '^hv\\d+$', tgt_type: pcre}
      # or a nodegroup:        hypervisors: {tgt: hvs, tgt_type: nodegroup}
      # or a compound of id matchers (L@, E@, N@, globs): {tgt: 'hv* and not hv9', tgt_type: compound}
      # the mapping form also carries the runner's waits: timeout, gather_job_timeout, down_after, max_wait,
      # init_timeout

Grain, pillar or subnet matching (``G@``, ``I@``, ``P@``, ``J@``, ``S@``, tgt_type ``grain``...) reads
data the minion reports about itself: it is refused unless the operator sets the loudly named opt-in
``virt:hypervisors_trust_minion_data: True`` (then every guest's root can claim to be a hypervisor).
There is no auto-learning from answers and no ``*`` discovery: with nothing configured, everything
that needs the hypervisors stops with :data:`HOWTO`.

A VM is never a hypervisor, whatever the target says: ``salt-run virt.init`` refuses a VM name or minion
id that the target matches (:func:`refuse_vm_id`), and records every minion id it pre-accepts for a VM
in the master's cache (bank :data:`VM_IDS_BANK`); a recorded id never matches (:func:`matches`,
:func:`members`), so a later or broader glob cannot give a VM certificates or make it a target.
"""

import fnmatch
import re
import time
from collections.abc import Iterable
from typing import Any

import salt.key
import salt.loader
import salt.utils.minions
from salt.exceptions import SaltInvocationError

from saltvirt.base.config import virt_conf
from saltvirt.base.salttypes import Data, SaltGrains, SaltOpts, SaltPillar
from saltvirt.fleet import fleetstate

OPT_IN = "hypervisors_trust_minion_data"
ID_TYPES = ("glob", "list", "pcre", "nodegroup", "compound")
TRUSTING_TYPES = ("grain", "grain_pcre", "pillar", "pillar_pcre", "pillar_exact", "ipcidr", "data", "pillar_target")
ID_ENGINES = ("L", "E", "N")  # compound engines that match on the minion id only
WAITS = ("timeout", "gather_job_timeout", "down_after", "down_memory", "max_wait", "init_timeout")
HOWTO = (
    "no hypervisors are configured on the master. Add the hypervisors' minion ids to the master config, e.g.\n"
    "  virt:\n"
    "    hypervisors: [hyper1, hyper2]     # or a glob on ids: 'hyper*', or {tgt: <nodegroup>, tgt_type: nodegroup}\n"
    "and restart the salt-master. The virt_hypervisor grain no longer makes a minion a hypervisor: any VM's "
    "root can set it (see docs/topics/trust.md)"
)
_WORD = re.compile(r"^(?P<engine>[A-Z])@(?P<rest>.*)$")
VM_IDS_BANK = "salt-virt/vm-minions"
VM_ID_REFUSED = (
    "salt-run virt.init: the {what} {value!r} matches virt:hypervisors in the master config: a VM must never be "
    "taken for a hypervisor (it would get libvirt certificates); pick another {what}"
)


class NotConfiguredError(SaltInvocationError):
    """``virt:hypervisors`` is missing (or only holds waits): the message says what to add."""


def trusts_minion_data(opts: SaltOpts) -> bool:
    """True only when the operator set ``virt:hypervisors_trust_minion_data: True`` (exactly True)."""
    return virt_conf(opts).get(OPT_IN) is True


def _raw(opts):
    conf = virt_conf(opts, "master config")
    return conf.get("hypervisors")


def waits(opts: SaltOpts) -> Data:
    """The runner's wait settings given in the mapping form of ``virt:hypervisors`` (may be empty)."""
    raw = _raw(opts)
    return {k: raw[k] for k in WAITS if k in raw} if isinstance(raw, dict) else {}


def _infer_type(tgt):
    if isinstance(tgt, (list, tuple)):
        return "list"
    text = str(tgt)
    if "@" in text or " " in text.strip():
        return "compound"
    return "list" if "," in text else "glob"


def _nodegroup(opts, name, seen=()):
    groups = opts.get("nodegroups") or {}
    if name not in groups:
        raise SaltInvocationError(
            f"virt:hypervisors: nodegroup {name!r} is not defined in the master config (nodegroups: ...)"
        )
    if name in seen:
        raise SaltInvocationError(f"virt:hypervisors: nodegroup {name!r} refers to itself")
    value = groups[name]
    return " ".join(value) if isinstance(value, (list, tuple)) else str(value)


def _check_compound(opts, expr, seen=()):
    """Refuse matchers on minion-reported data in a compound (nodegroups expanded)."""
    for word in str(expr).replace("(", " ").replace(")", " ").split():
        if word in ("and", "or", "not"):
            continue
        match = _WORD.match(word)
        if not match:
            continue  # a glob on the id
        engine = match.group("engine")
        if engine == "N":
            name = match.group("rest")
            _check_compound(opts, _nodegroup(opts, name, seen), (*seen, name))
        elif engine not in ID_ENGINES:
            raise SaltInvocationError(
                f"virt:hypervisors: {word!r} matches on data the minion reports about itself ({engine}@): any VM's "
                f"root could claim to be a hypervisor. Use minion ids (a list, a glob, E@, N@), or set "
                f"virt:{OPT_IN}: True in the master config if you really trust every minion"
            )


def target(opts: SaltOpts) -> tuple[Any, str]:
    """``(tgt, tgt_type)`` of the hypervisors from the master config; raises :class:`NotConfiguredError`
    (with :data:`HOWTO`) when missing, SaltInvocationError for a refused or malformed target."""
    raw = _raw(opts)
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - {"tgt", "tgt_type", *WAITS})
        if unknown:
            raise SaltInvocationError(
                f"virt:hypervisors: unknown key(s) {', '.join(unknown)} (known: tgt, tgt_type, {', '.join(WAITS)})"
            )
        tgt, tgt_type = raw.get("tgt"), raw.get("tgt_type")
    else:
        tgt, tgt_type = raw, None
    if tgt in (None, "", [], ()):
        raise NotConfiguredError(HOWTO)
    if not isinstance(tgt, (str, list, tuple)):
        raise SaltInvocationError(f"virt:hypervisors must be a list of minion ids, a glob or a mapping, not {tgt!r}")
    tgt_type = tgt_type or _infer_type(tgt)
    trusting = trusts_minion_data(opts)
    if tgt_type not in ID_TYPES and not (trusting and tgt_type in TRUSTING_TYPES):
        if tgt_type in TRUSTING_TYPES:
            raise SaltInvocationError(
                f"virt:hypervisors: tgt_type {tgt_type!r} matches on data the minion reports about itself: any VM's "
                f"root could claim to be a hypervisor. Use minion ids, or set virt:{OPT_IN}: True"
            )
        raise SaltInvocationError(f"virt:hypervisors: tgt_type must be one of {', '.join(ID_TYPES)}, not {tgt_type!r}")
    if tgt_type == "list":
        ids = [t.strip() for t in tgt.split(",")] if isinstance(tgt, str) else [str(t).strip() for t in tgt]
        tgt = [i for i in ids if i]
        if not tgt:
            raise NotConfiguredError(HOWTO)
    elif not isinstance(tgt, str):
        raise SaltInvocationError(f"virt:hypervisors: a {tgt_type} target must be a string, not {tgt!r}")
    if tgt_type == "glob" and isinstance(tgt, str) and tgt.strip() in ("*", "**"):
        raise SaltInvocationError(
            "virt:hypervisors: '*' would make every minion, every VM included, a hypervisor: list the hypervisors' ids"
        )
    if tgt_type == "nodegroup":
        _nodegroup(opts, tgt)
    if not trusting:
        if tgt_type == "compound":
            _check_compound(opts, tgt)
        elif tgt_type == "nodegroup":
            _check_compound(opts, _nodegroup(opts, tgt), (tgt,))
    return tgt, tgt_type


def record_vm_id(opts: SaltOpts, minion_id: str, vm: str) -> None:
    """Remember that the runner pre-accepted ``minion_id`` for VM ``vm``: it is never a hypervisor."""
    fleetstate.Store(opts).transact(VM_IDS_BANK, minion_id, lambda _old: {"vm": vm, "at": int(time.time())})


def _vm_store(opts):
    # a master always has a cachedir; bare option dicts (target checks alone) have no records to read. The
    # shared store's own client: bounded when redis stops answering (Salt's driver waits forever)
    return fleetstate.Store(opts) if opts.get("cachedir") else None


def vm_ids(opts: SaltOpts) -> set[str]:
    """The minion ids recorded as VMs (:func:`record_vm_id`)."""
    store = _vm_store(opts)
    return set(store.entries(VM_IDS_BANK)) if store else set()


def is_vm_id(opts: SaltOpts, minion_id: str) -> bool:
    store = _vm_store(opts)
    return bool(store and store.fetch(VM_IDS_BANK, minion_id))


def refuse_vm_id(opts: SaltOpts, name: str, minion_id: str | None = None) -> None:
    """Refuse a new VM whose ``name`` or ``minion_id`` the hypervisor target matches (on ids only)."""
    tgt, tgt_type = target(opts)
    for what, value in (("VM name", name), ("minion id", minion_id)):
        if value and _target_matches(opts, str(value), tgt, tgt_type, None, None):
            raise SaltInvocationError(VM_ID_REFUSED.format(what=what, value=value))


def matches(
    opts: SaltOpts,
    minion_id: str,
    tgt: Any = None,
    tgt_type: str | None = None,
    grains: SaltGrains | None = None,
    pillar: SaltPillar | None = None,
) -> bool:
    """Is ``minion_id`` one of the hypervisors? On ids alone unless the operator opted in, in which
    case ``grains``/``pillar`` (the minion's own data) are used too. A recorded VM id never is."""
    if is_vm_id(opts, minion_id):
        return False
    return _target_matches(opts, minion_id, tgt, tgt_type, grains, pillar)


def _target_matches(opts, minion_id, tgt, tgt_type, grains, pillar):
    if tgt is None:
        tgt, tgt_type = target(opts)
    if tgt_type == "list":
        return minion_id in tgt
    if tgt_type == "glob":
        return fnmatch.fnmatch(minion_id, tgt)
    if tgt_type == "pcre":
        return bool(re.match(tgt, minion_id))
    trusting = trusts_minion_data(opts)
    local = dict(opts, id=minion_id, minion_id=minion_id)
    local["grains"] = (grains or {}) if trusting else {}
    local["pillar"] = (pillar or {}) if trusting else {}
    matchers = salt.loader.matchers(local)
    if tgt_type == "nodegroup":
        tgt, tgt_type = f"N@{tgt}", "compound"
    fun = f"{tgt_type}_match.match"
    if fun not in matchers:
        raise SaltInvocationError(f"virt:hypervisors: unknown tgt_type {tgt_type!r}")
    if tgt_type == "compound":
        return bool(matchers[fun](tgt, opts=local, minion_id=minion_id))
    return bool(matchers[fun](tgt, opts=local))


def accepted(opts: SaltOpts) -> list[str]:
    """Minion ids whose keys the master has accepted."""
    return list(salt.key.Key(opts).list_keys().get("minions") or [])


def members(opts: SaltOpts, ids: Iterable[str] | None = None) -> list[str]:
    """The hypervisors: accepted minion ids (or ``ids``) that the configured target matches, sorted.
    With the opt-in, grain/pillar targets are resolved from the master's minion data cache."""
    tgt, tgt_type = target(opts)
    ids = set(accepted(opts) if ids is None else ids) - vm_ids(opts)
    if trusts_minion_data(opts) and tgt_type not in ("list", "glob", "pcre"):
        res = salt.utils.minions.CkMinions(opts).check_minions(tgt, tgt_type, greedy=False)
        found = set(res.get("minions", []) if isinstance(res, dict) else res)
        return sorted(ids & found)
    return sorted(m for m in ids if _target_matches(opts, m, tgt, tgt_type, None, None))


def narrow(opts: SaltOpts, tgt: Any = None, tgt_type: str | None = None) -> list[str]:
    """The hypervisors, narrowed by a per-call target (``salt-run virt.query tgt=...``): a call can
    select among the configured hypervisors, never add a minion to them."""
    hosts = members(opts)
    if not tgt:
        return hosts
    tgt_type = tgt_type or _infer_type(tgt)
    if isinstance(tgt, str) and tgt_type == "list":
        tgt = [t.strip() for t in tgt.split(",") if t.strip()]
    res = salt.utils.minions.CkMinions(opts).check_minions(tgt, tgt_type, greedy=False)
    found = set(res.get("minions", []) if isinstance(res, dict) else res)
    return sorted(set(hosts) & found)


def require(opts: SaltOpts, minion_id: str, what: str = "this") -> str:
    """Raise unless ``minion_id`` is one of the configured hypervisors (accepted key + target)."""
    if minion_id not in members(opts, [minion_id]) or minion_id not in accepted(opts):
        raise SaltInvocationError(
            f"{minion_id} is not one of the hypervisors (virt:hypervisors in the master config): refusing {what}"
        )
    return minion_id
