"""``salt-run virt.* select='T@virt_vm and G@group:db'``: a selection of VMs in Salt's compound syntax, evaluated
on the master against the facts hypervisors signed (``virt.full_info``, :meth:`saltvirt.fleet.publish.Fleet.gather`),
never against Salt's resource registry or the master's cache of resource grains: any minion may register any
``virt_vm:<uuid>`` with any grains (docs/topics/resources.md, "What Salt 3008.5 does not authenticate").

A VM's grains are the ``virt_vm`` resource grains (:mod:`saltvirt.model.vmgrains`, the same mapping the hypervisor
minion registers), so ``select=`` picks the VMs ``salt -C`` with the same expression would reach, as their
hypervisors say now. The engines are Salt's, with Salt's meaning, restricted to what describes a VM:

- ``T@virt_vm`` every VM; ``T@virt_vm:<uuid>`` that VM (exact, as Salt's resource matcher);
- ``G@<grain>:<glob>`` a grain, nested keys and list items too (Salt's grain matcher:
  ``salt.utils.data.subdict_match``, case-insensitive globs); ``G|@key|value`` another delimiter;
- ``L@<uuid>,<uuid>`` resource ids (as Salt's list matcher on ids);
- ``M@<hypervisor>`` the VMs that hypervisor minion manages (exact, as Salt's managing-minion matcher);
- ``and``, ``or``, ``not`` and ``(`` ``)`` (words of their own, as in Salt), Python's precedence as in Salt
  (``not`` > ``and`` > ``or``); ``not`` right after a term means ``and not`` (Salt's rule).

Other engines (``E@``, ``P@``, ``I@``, ``J@``, ``S@``, ``N@``, ``R@``, bare minion-id globs) are refused:
they match minions, not VMs.
"""

from collections.abc import Callable, Iterable
from typing import Any

import salt.utils.data
import salt.utils.minions
from salt.exceptions import SaltException, SaltInvocationError

from saltvirt.base.salttypes import Data
from saltvirt.fleet import publish, tenants
from saltvirt.model import vmgrains

SUPPORTED = "T@virt_vm, T@virt_vm:<uuid>, G@<grain>:<glob>, L@<uuid>,<uuid>, M@<hypervisor>, and, or, not, ( )"
MAX_CHARS = 4096  # a selection is typed by a person: longer ones are refused before they are parsed
MAX_DEPTH = 32  # nested parentheses / nots
_OPERATORS = ("and", "or", "not", "(", ")")

Match = Callable[[Data], bool]


def _refuse(expr: str, why: str) -> SaltInvocationError:
    """The one wording for a selection that cannot be evaluated."""
    return SaltInvocationError(f"select={expr!r:.200}: {why} (supported: {SUPPORTED})")


def _atom(word: str, expr: str) -> Match:
    info = salt.utils.minions.parse_target(word)
    engine, pattern = info.get("engine"), info.get("pattern") or ""
    if engine == "T":
        kind, _sep, rid = pattern.partition(":")
        if kind != vmgrains.TYPE:
            raise _refuse(expr, f"T@{kind} is not a VM: select takes {vmgrains.TYPE} resources only")
        if not _sep:
            return lambda g: True
        return lambda g: g["id"] == rid
    if engine == "G":
        delim = info.get("delimiter") or ":"
        if delim not in pattern:
            raise _refuse(expr, f"{word!r} needs a grain and a value: G@<grain>{delim}<glob>")
        return lambda g: bool(salt.utils.data.subdict_match(g, pattern, delimiter=delim))
    if engine == "L":
        ids = {i for i in pattern.split(",") if i}
        return lambda g: g["id"] in ids
    if engine == "M":
        return lambda g: g["hypervisor"] == pattern
    if engine:
        raise _refuse(expr, f"{engine}@ matches minions, not VMs")
    raise _refuse(expr, f"{word!r} is no engine@pattern word (a bare word is a minion id glob in Salt)")


class _Parser:
    """Recursive descent over the words of one expression: disjunction > conjunction > factor."""

    def __init__(self, expr: str) -> None:
        self.expr, self.words, self.pos = expr, expr.split(), 0

    def peek(self) -> str | None:
        return self.words[self.pos] if self.pos < len(self.words) else None

    def take(self) -> str:
        self.pos += 1
        return self.words[self.pos - 1]

    def disjunction(self, depth: int) -> Match:
        terms = [self.conjunction(depth)]
        while self.peek() == "or":
            self.take()
            terms.append(self.conjunction(depth))
        return terms[0] if len(terms) == 1 else lambda g: any(t(g) for t in terms)

    def conjunction(self, depth: int) -> Match:
        factors = [self.factor(depth)]
        while self.peek() in ("and", "not"):
            if self.peek() == "and":  # Salt's rule: a term then `not` is `and not`
                self.take()
            factors.append(self.factor(depth))
        return factors[0] if len(factors) == 1 else lambda g: all(f(g) for f in factors)

    def factor(self, depth: int) -> Match:
        if depth > MAX_DEPTH:
            raise _refuse(self.expr, f"nested deeper than {MAX_DEPTH}")
        word = self.peek()
        if word is None:
            raise _refuse(self.expr, "it ends where a term is expected")
        self.take()
        if word == "not":
            inner = self.factor(depth + 1)
            return lambda g: not inner(g)
        if word == "(":
            inner = self.disjunction(depth + 1)
            if self.peek() != ")":
                raise _refuse(self.expr, "a '(' is not closed")
            self.take()
            return inner
        if word in _OPERATORS:
            raise _refuse(self.expr, f"{word!r} where a term is expected")
        return _atom(word, self.expr)


def parse(expr: Any) -> Match:
    """The match function of selection ``expr`` (``match(grains) -> bool``), or SaltInvocationError saying what
    is wrong and what is supported."""
    if not isinstance(expr, str) or not expr.strip():
        raise _refuse(str(expr), "a selection is a non-empty compound expression")
    if len(expr) > MAX_CHARS:
        raise _refuse(expr, f"longer than {MAX_CHARS} characters")
    parser = _Parser(expr)
    for word in parser.words:
        if word not in _OPERATORS and (word.startswith("(") or word.endswith(")")):
            raise _refuse(expr, f"{word!r}: parentheses are words of their own, as in Salt: '( T@virt_vm ... )'")
    match = parser.disjunction(0)
    if parser.peek() is not None:
        raise _refuse(expr, f"{parser.peek()!r} where and/or/not or the end is expected")
    return match


def tenant_only(hosts: dict[str, Data], tenant: str | None) -> dict[str, Data]:
    """``hosts`` (``virt.full_info`` answers) with only the VMs whose recorded owner is ``tenant``."""
    out = {}
    for host, ans in hosts.items():
        vms = (ans or {}).get("vm_info")
        if vms is None:
            out[host] = ans
            continue
        out[host] = dict(
            ans, vm_info={n: vm for n, vm in vms.items() if ((vm or {}).get("owner") or {}).get("tenant") == tenant}
        )
    return out


def select(hosts: dict[str, Data], expr: Any, within: Iterable[str] | None = None) -> Data:
    """The VMs of ``hosts`` (``virt.full_info`` answers of every hypervisor, cut to what the caller may see:
    :func:`saltvirt.fleet.tenants.visible`) that ``expr`` selects: ``{select, selected: [{uuid, name, host}],
    refused: {uuid: {name, hosts, error}}, down: [hosts], unreadable: [host/name]}``. A VM whose UUID is defined
    on two hypervisors is refused, never picked once (or twice). ``within``: only VMs of these hypervisors are
    picked (a per-call ``tgt=``); copies elsewhere still make a VM refused."""
    match = parse(expr)
    copies: dict[str, list[tuple[str, str, Data]]] = {}
    unreadable = []
    for host, ans in sorted(hosts.items()):
        if (ans or {}).get("status") != "up":
            continue
        for name, vm in sorted(((ans or {}).get("vm_info") or {}).items()):
            grains = vmgrains.grains(vm or {}, host)
            if not grains:
                unreadable.append(f"{host}/{name}")
                continue
            copies.setdefault(grains["uuid"], []).append((host, name, grains))
    allowed = None if within is None else set(within)
    selected, refused = [], {}
    for uuid, found in sorted(copies.items()):
        if not any(match(g) for _h, _n, g in found):
            continue
        names = sorted({n for _h, n, _g in found})
        where = [h for h, _n, _g in found]
        if len(found) > 1:
            refused[uuid] = {
                "name": names[0] if len(names) == 1 else names,
                "hosts": where,
                "error": f"VM {uuid} is defined on {', '.join(where)}: refused (it would be acted on twice); "
                "undefine the stale copy first",
            }
        elif allowed is None or where[0] in allowed:
            selected.append({"uuid": uuid, "name": found[0][1], "host": where[0]})
    out: Data = {"select": expr, "selected": selected, "refused": refused, "down": publish.down_hosts(hosts)}
    if unreadable:
        out["unreadable"] = unreadable
    return out


def unique_names(selection: Data) -> Data:
    """``selection`` with the picked VMs whose name another picked VM also has moved to ``refused``: what acts on
    VMs by name across hypervisors (a migration's per-name lock, its results) must not mix them up."""
    hosts: dict[str, list[str]] = {}
    for vm in selection["selected"]:
        hosts.setdefault(vm["name"], []).append(vm["host"])
    out = dict(selection, selected=[], refused=dict(selection["refused"]))
    for vm in selection["selected"]:
        if len(hosts[vm["name"]]) == 1:
            out["selected"].append(vm)
            continue
        where = ", ".join(hosts[vm["name"]])
        error = f"the name {vm['name']} is selected on {where}: move these one by one (virt.migrate <name> host=)"
        out["refused"][vm["uuid"]] = {"name": vm["name"], "hosts": [vm["host"]], "error": error}
    return out


def note(selection: Data) -> str | None:
    """What to say when nothing was selected (an answer, not an error: the hypervisors that did not answer are
    still listed), else None."""
    if selection["selected"] or selection["refused"]:
        return None
    down = selection["down"]
    return "the selection matched no VM" + (
        f" on the hypervisors that answered (these did not: {', '.join(down)})" if down else ""
    )


def each(selection: Data, act: Callable[[Data], Any]) -> dict[str, Data]:
    """``{uuid: {name, host, result | error}}``: ``act(vm)`` for every selected VM in turn (its exception, a
    Salt error, is that VM's error; the next VM is still acted on)."""
    results = {}
    for vm in selection["selected"]:
        entry = {"name": vm["name"], "host": vm["host"]}
        try:
            entry["result"] = act(vm)
        except SaltException as exc:
            entry["error"] = getattr(exc, "error", None) or str(exc)
        results[vm["uuid"]] = entry
    return results


def answer(selection: Data, results: dict[str, Data] | None = None, test: bool = False) -> Data:
    """The runner's answer: the selection, each VM's result (``results``; none with ``test``), what the selection
    matched nothing said as a ``note``, and ``retcode: 1`` when a VM failed or was refused, or a hypervisor did not
    answer (the selection may miss its VMs)."""
    out = dict(selection)
    if test:
        out["test"] = True
    else:
        out["results"] = results or {}
    said = note(selection)
    if said:
        out["note"] = said
    failed = any("error" in r for r in (results or {}).values())
    if failed or selection["refused"] or selection["down"]:
        out["retcode"] = 1
    return out


def fleet_selection(
    fleet: publish.Fleet, caller: tenants.Caller, expr: Any, tenant: str | None = None
) -> tuple[dict[str, Data], Data]:
    """``(what caller sees, selection)``: one ``virt.full_info`` of every hypervisor (signed answers), cut to what
    ``caller`` may see (a tenant: its own VMs) and, with ``tenant`` (an operator's ``tenant=``), to that tenant's
    VMs; :func:`select` over it, picks within ``fleet``'s per-call ``tgt`` (a copy elsewhere still refuses a VM)."""
    parse(expr)  # a bad selection is refused before anything is published
    hosts = fleet.wide().gather("virt.full_info")
    seen = tenants.visible(hosts, caller, tenants.config(fleet.opts))
    if tenant is not None:
        seen = tenant_only(seen, tenant)
    within = fleet.target() if fleet.cfg.get("tgt") else None
    return seen, select(seen, expr, within)


def run(
    fleet: publish.Fleet, caller: tenants.Caller, expr: Any, fun: str, args: Iterable[Any] = (), test: bool = False
) -> Data:
    """``fun`` (a per-VM ``virt.*`` function: ``virt.stop``, ...) on every VM ``expr`` selects, as the named call
    runs it on one: by name on the hypervisor that signed for the VM, for a tenant ``caller`` with its tenant
    (the hypervisor checks the VM's owner again). One fleet query (every hypervisor: a copy outside ``fleet``'s
    per-call ``tgt`` still makes a VM refused), then one call per VM; ``test``: the selection only."""
    _seen, selection = fleet_selection(fleet, caller, expr)
    if test:
        return answer(selection, test=True)
    tenant = None if caller.operator else caller.tenant

    def act(vm):
        ans, jid = fleet.call(vm["host"], fun, [vm["name"], *args], tenant=tenant)
        if ans["status"] != "up":
            raise publish.Failed(f"{fun} {vm['name']} on {vm['host']}: {ans['status']}: {ans.get('error')}", jid=jid)
        return ans["ret"]

    return answer(selection, each(selection, act))
