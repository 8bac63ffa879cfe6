"""Host-failure recovery, the master side of ``salt-run virt.record`` and ``virt.recover``.

A down hypervisor cannot say what it ran, so the master keeps a *record* of every hypervisor
(``virt.recovery_record``: domain definitions, states, disks, storage markers; :mod:`saltvirt.host.hostrecord`)
in Salt's cache layer (bank ``salt-virt/hosts``, one entry per hypervisor, the same ``cache:`` every
master shares, see :mod:`saltvirt.fleet.fleetstate`). :func:`refresh` rewrites the entries of the hosts that
answered and keeps the others' last record.

``virt.recover HOST`` (:func:`recover`), in this order, stopping at the first refusal:

1. HOST is one of ``virt:hypervisors`` and its minion does not answer (status ``down``);
2. its libvirtd is unreachable too: up to ``probes`` other hypervisors try to open a libvirt connection
   to it (``virt.recovery_probe``; the URI ``virt:recovery:probe_uri`` with ``{host}``, default the URI a
   migration to it would use) and none may reach it; at least one must have tried;
3. the plan (:func:`plan`, pure): from HOST's record, the VMs to restart (every disk provably shared:
   the storage markers; not defined on any hypervisor that answered) and the others with the reason;
4. fencing: the operator's command (``virt:fence: {command: [...], timeout: 60}``, ``{host}`` in any
   argument) must exit 0. Without one nothing is restarted: a host that only lost its network would
   otherwise run the same VMs as the new host, on the same disks;
5. each VM, biggest first, under its per-VM lock (the one ``virt.init``/``virt.migrate`` take), goes to
   the host :mod:`saltvirt.fleet.placement` ranks best among the other hypervisors, with its room reserved
   (:func:`saltvirt.fleet.fleetstate.reserve`); ``virt.recovery_restart`` defines and starts it there. A
   target that fails (it undoes its definition) is excluded and the next one tried;
   Right before each start, under that lock, :mod:`saltvirt.fleet.recovery_guard` asks every hypervisor
   again (a copy anywhere refuses) and claims the VM in the shared store (two overlapping runs never
   both start it). A target that does not answer the restart call stops that VM (it may be starting
   there): no other host is tried on a guess;
6. the answering hypervisors are recorded again (:func:`refresh`), and the VMs restarted are remembered
   for :func:`reconcile`, which turns autostart off for HOST's stale copies, then undefines them, once
   it is back.

Step 1 also refuses (unless ``force=True``) when any other hypervisor does not answer: it may run one
of HOST's VMs (migrated there after the last record). In step 2 only "connection refused" and a timeout
count as down; any other probe error (TLS, names) stops recovery with that error.
"""

import subprocess
import time
from collections.abc import Iterable
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import metrics, validate
from saltvirt.base.config import section
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import fleetstate, placement, publish, recovery_guard
from saltvirt.pki import signedrecords

HOSTS = "salt-virt/hosts"
RECOVERED = "salt-virt/recovered"  # per down host: the VMs recovered elsewhere, for reconcile()
FENCE_DEFAULTS = {"command": None, "timeout": 60}
RECOVERY_DEFAULTS = {"probe_uri": None, "probes": 2, "probe_wait": 10}
RUNNING = ("running", "paused", "blocked")


# configuration ----------------------------------------------------------------------------------
def fence_config(conf: Data) -> Data:
    """``virt:fence`` from the master config: ``{command: [argv...] or None, timeout}``."""
    raw = section(conf.get("fence"), "virt:fence", FENCE_DEFAULTS, " {command: [...], timeout: 60}")
    cfg = dict(FENCE_DEFAULTS, **raw)
    cmd = cfg["command"]
    if cmd is not None and (
        not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(a, str) and a for a in cmd)
    ):
        raise SaltInvocationError(
            f"virt:fence:command must be a list of arguments (no shell), e.g. [/usr/sbin/fence-host, '{{host}}'], "
            f"not {cmd!r}"
        )
    cfg["timeout"] = validate.seconds(cfg["timeout"], "virt:fence:timeout")
    return cfg


def recovery_config(conf: Data) -> Data:
    raw = section(conf.get("recovery"), "virt:recovery", RECOVERY_DEFAULTS)
    cfg = dict(RECOVERY_DEFAULTS, **raw)
    cfg["probes"] = validate.positive_int(cfg["probes"], "virt:recovery:probes")
    cfg["probe_wait"] = validate.seconds(cfg["probe_wait"], "virt:recovery:probe_wait")
    if cfg["probe_uri"] is not None and "{host}" not in str(cfg["probe_uri"]):
        raise SaltInvocationError("virt:recovery:probe_uri must contain {host}, e.g. qemu+tls://{host}/system")
    return cfg


# the record -------------------------------------------------------------------------------------
def refresh(remote: publish.Fleet, store: fleetstate.Store | None = None) -> Data:
    """Gather ``virt.recovery_record`` from every hypervisor and store the answers; hosts that did
    not answer keep their last record. Returns ``{host: {status, vms, recorded}}`` (a summary)."""
    store = store or fleetstate.Store(remote.opts)
    answers = remote.answers("virt.recovery_record")
    now = time.time()
    out = {}
    for host, ans in answers.items():
        if ans["status"] == "up" and isinstance(ans["ret"], dict):
            entry = dict(ans["ret"], recorded=now, master=remote.opts.get("id"))
            entry = signedrecords.sign(remote.opts["pki_dir"], HOSTS, host, entry)
            store.transact(HOSTS, host, lambda _old, entry=entry: entry)
            out[host] = {"status": "recorded", "vms": sorted(entry.get("vms") or {}), "recorded": _ts(now)}
        else:
            old = store.fetch(HOSTS, host) or {}
            out[host] = {
                "status": f"kept the last record ({ans['status']}: {ans.get('error')})",
                "vms": sorted(old.get("vms") or {}),
                "recorded": _ts(old.get("recorded")),
            }
    return out


UNSIGNED_RECORD = (
    "refusing to use the record of {host} in the shared store: it does not carry this master's MAC "
    "(key <pki_dir>/salt-virt-records.key; several masters need the same key file). Nothing is defined from it; "
    "run salt-run virt.record while {host} is up"
)


def recall(opts: SaltOpts, host: str, store: fleetstate.Store | None = None) -> Data | None:
    """HOST's record from the shared store, only if this master signed it (anyone who can write to the
    store could otherwise have a hypervisor define any domain XML)."""
    rec = (store or fleetstate.Store(opts)).fetch(HOSTS, host)
    if rec is not None and not signedrecords.verified(opts["pki_dir"], HOSTS, host, rec):
        raise publish.Failed(UNSIGNED_RECORD.format(host=host))
    return rec


def _ts(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)) if epoch else None


def age(rec: Data, now: float | None = None) -> Data:
    """``{recorded, age_seconds, master}`` of a record."""
    now = now or time.time()
    return {
        "recorded": _ts(rec.get("recorded")),
        "age_seconds": round(now - rec["recorded"], 1) if rec.get("recorded") else None,
        "by_master": rec.get("master"),
    }


# down? -------------------------------------------------------------------------------------------
def probe_uri(template: str | None, host: str) -> str | None:
    return template.replace("{host}", host) if template else None


def verify_down(remote: publish.Fleet, host: str, hosts: dict[str, Data], rcfg: Data) -> Data:
    """``{minion, libvirt: [probe answers]}`` when HOST is down both ways; raises :class:`fleet.Failed`
    (with what was seen) when its minion or its libvirtd answers, or nobody could check libvirtd."""
    status = hosts[host]["status"]
    if status != "down":
        what = {"up": "answers", "error": "answers (with an error)", "timeout": "is still running a job"}
        raise publish.Failed(
            f"refusing to recover {host}: its minion {what.get(status, status)} ({hosts[host].get('error') or 'ok'}). "
            "Recovery is for a host that is down: migrate or evacuate its VMs instead",
            minion=status,
        )
    peers = [h for h in sorted(hosts) if h != host and hosts[h]["status"] == "up"][: rcfg["probes"]]
    uri = probe_uri(rcfg["probe_uri"], host)
    probes: list[Data] = []
    for peer in peers:
        try:
            ans = remote.ret(
                peer, "virt.recovery_probe", host, uri=uri, wait=rcfg["probe_wait"], max_wait=rcfg["probe_wait"] + 30
            )
        except CommandExecutionError as exc:
            probes.append({"from": peer, "reachable": None, "error": str(exc)})
            continue
        probes.append(dict(ans, **{"from": peer}))
    seen = {"minion": "down", "libvirt": probes}
    reached = [p for p in probes if p.get("reachable")]
    if reached:
        raise publish.Failed(
            f"refusing to recover {host}: its minion does not answer, but its libvirtd does "
            f"(reached from {', '.join(p['from'] for p in reached)} at {reached[0]['uri']}): its VMs may be running. "
            "Fix the minion, or migrate the VMs",
            down=seen,
        )
    unsure = [p for p in probes if p.get("reachable") is not False]
    if unsure:  # only "connection refused" or a timeout prove it down; any other error proves nothing
        raise publish.Failed(
            f"refusing to recover {host}: "
            + "; ".join(f"{p['from']} could not check its libvirtd: {p.get('error') or '?'}" for p in unsure)
            + ". Only 'connection refused' or a timeout show a host is down: fix that (certificates, names, "
            "virt:recovery:probe_uri), then retry",
            down=seen,
        )
    if not probes:
        raise publish.Failed(
            f"refusing to recover {host}: no other hypervisor answered to check whether its libvirtd is down",
            down=seen,
        )
    return seen


# the plan (pure) -----------------------------------------------------------------------------------
def _where_now(hosts, host, name, uuid):
    """``(host, state)`` of a hypervisor that answered and has this VM (by name or UUID), or None."""
    for other in sorted(hosts):
        ans = hosts[other]
        if other == host or ans.get("status") != "up":
            continue
        for vm_name, vm in (ans.get("vm_info") or {}).items():
            if vm_name == name or (uuid and (vm or {}).get("uuid") == uuid):
                return other, (vm or {}).get("state")
    return None


def plan(rec: Data, hosts: dict[str, Data], host: str, checks: dict[str, Any] | None = None) -> Data:
    """What recovering ``host`` from its record ``rec`` would do, given ``hosts`` (``virt.full_info``
    of every hypervisor) and ``checks`` (``{peer: {vm: [reasons it cannot run it]}}``, the other
    hypervisors' ``virt.recovery_check``): ``{restart: [names, biggest first], candidates: {name:
    [peers that can run it]}, elsewhere: {name: "..."}, not_recoverable: {name: reason}}``."""
    restart, candidates, elsewhere, refused = [], {}, {}, {}
    vms = rec.get("vms") or {}
    storage = rec.get("storage") or {}
    for name in sorted(vms):
        vm = vms[name]
        if vm.get("error") or not vm.get("xml"):
            refused[name] = f"its definition could not be read when recorded ({vm.get('error') or 'no XML'})"
            continue
        now = _where_now(hosts, host, name, vm.get("uuid"))
        if now:
            elsewhere[name] = f"defined on {now[0]} ({now[1]}) now: left alone"
            continue
        why = [d["why"] for d in vm.get("disks") or [] if d.get("why")]
        why += [
            f"disk {d['target']}: {(storage.get(d['root']) or {}).get('error') or 'no storage marker'}"
            for d in vm.get("disks") or []
            if d.get("root") and not (storage.get(d["root"]) or {}).get("token")
        ]
        if why:
            refused[name] = "not on shared storage: " + "; ".join(why)
            continue
        if checks is not None:
            able = sorted(p for p, ans in checks.items() if isinstance(ans, dict) and ans.get(name) == [])
            if not able:
                refused[name] = (
                    "no other hypervisor can run it: "
                    + "; ".join(
                        f"{p}: {'; '.join(ans.get(name) or ['no answer']) if isinstance(ans, dict) else ans}"
                        for p, ans in sorted(checks.items())
                    )
                    if checks
                    else "no other hypervisor answered"
                )
                continue
            candidates[name] = able
        restart.append(name)
    restart.sort(key=lambda n: (vms[n].get("state") not in RUNNING, -int(vms[n].get("mem") or 0), n))
    return {"restart": restart, "candidates": candidates, "elsewhere": elsewhere, "not_recoverable": refused}


def check_peers(remote: publish.Fleet, rec: Data, host: str, hosts: dict[str, Data]) -> dict[str, Any]:
    """Every other answering hypervisor's ``virt.recovery_check`` of the recorded VMs (one publication)."""
    peers = [h for h in sorted(hosts) if h != host and hosts[h]["status"] == "up"]
    vms = {n: vm["xml"] for n, vm in (rec.get("vms") or {}).items() if vm.get("xml")}
    if not peers or not vms:
        return {}
    answers = remote.answers("virt.recovery_check", vms, rec.get("storage") or {}, tgt=peers)
    return {p: a["ret"] if a["status"] == "up" else f"{a['status']}: {a.get('error')}" for p, a in answers.items()}


# fencing -------------------------------------------------------------------------------------------
def fence(fcfg: Data, host: str) -> Data:
    """Run the operator's fence command for ``host``: ``{command, rc, output}``; raises without one."""
    if not fcfg["command"]:
        raise publish.Failed(
            f"refusing to recover {host}: no fence command (virt:fence:command in the master config). Without fencing, "
            f"a host that only lost its network would run its VMs a second time on the same disks. Configure e.g. "
            "virt: {fence: {command: [/usr/local/sbin/fence-host, '{host}'], timeout: 60}}, a command that powers "
            "the host off and exits 0 only when it is off"
        )
    argv = [a.replace("{host}", host) for a in fcfg["command"]]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=fcfg["timeout"], check=False, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return {"command": argv, "rc": None, "output": f"did not finish within {fcfg['timeout']:g} s"}
    except OSError as exc:
        return {"command": argv, "rc": None, "output": f"could not run it: {exc}"}
    output = (proc.stdout + proc.stderr).strip()
    return {"command": argv, "rc": proc.returncode, "output": output[-2000:]}


# recovering ----------------------------------------------------------------------------------------
def _request(vm):
    return placement.make_request(vm.get("cpu") or 1, max(int(vm.get("mem") or 1), 1), 0, vm.get("group"))


def _book(facts, vm, name):
    host = facts.setdefault("host", {})
    host["mem_used_by_vms"] = int(host.get("mem_used_by_vms") or 0) + int(vm.get("mem") or 0)
    host["vcpus_used_by_vms"] = int(host.get("vcpus_used_by_vms") or 0) + int(vm.get("cpu") or 0)
    host["vms_defined"] = int(host.get("vms_defined") or 0) + 1
    facts.setdefault("vm_info", {})[name] = {"state": "running", "group": vm.get("group"), "uuid": vm.get("uuid")}


def restart_one(
    remote: publish.Fleet,
    rec: Data,
    name: str,
    hosts: dict[str, Data],
    host: str,
    pol: Data,
    store: fleetstate.Store,
    able: Iterable[str] | None = None,
    force: bool = False,
) -> Data:
    """Place and restart one recorded VM under its lock, on one of ``able`` (default: any other host),
    after the guards of :mod:`saltvirt.fleet.recovery_guard` (every hypervisor asked again, the VM's
    entry in the shared store claimed); ``{host, state, score}`` or raises Failed."""
    vm = rec["vms"][name]
    req = _request(vm)
    tried = {host} | ({h for h in hosts if h not in able} if able is not None else set())
    errors: list[str] = []
    with fleetstate.lock(remote.opts, [name], kind="virt.recover", store=store) as lease:
        since = time.time()
        while True:
            load = fleetstate.reserved(store, hosts, since, lease.cfg)
            ranked = placement.rank(hosts, req, pol, exclude=tried, reserved=load)
            target = ranked["host"]
            if not target:
                raise publish.Failed("; ".join(errors) or ranked["reason"], excluded=ranked["excluded"])
            try:
                fleetstate.reserve(
                    store,
                    lease,
                    target,
                    name,
                    req,
                    hosts.get(target),
                    since,
                    fits=lambda answer, load, t=target: placement.fits(t, answer, req, pol, load),
                )
            except fleetstate.NoRoomError as exc:
                errors.append(f"{target}: in-flight work took the room: {exc}")
                tried.add(target)
                continue
            lease.check()
            try:  # the plan's snapshot is old: look again, under the lock, right before the start
                recovery_guard.last_look(remote, name, vm.get("uuid"), host, force)
                recovery_guard.claim(store, rec, name, host, target, remote.opts, force)
            except CommandExecutionError:
                fleetstate.finish(store, lease, "failed")
                raise
            try:
                done = remote.ret(
                    target, "virt.recovery_restart", name, vm["xml"], rec.get("storage") or {}, start=_start(vm)
                )
            except CommandExecutionError as exc:
                fleetstate.finish(store, lease, "failed")
                if getattr(exc, "details", {}).get("status") in recovery_guard.UNSURE:
                    # no answer: it may be starting there. Never try another host on a guess
                    recovery_guard.settle(store, name, "unsure")
                    raise publish.Failed(
                        f"{exc}: {name} may be starting on {target}; not trying another host. Check {target}, "
                        "then retry (force=True once you know it does not run there)",
                        tried=sorted(tried | {target}),
                    ) from None
                recovery_guard.settle(store, name, "failed")
                errors.append(str(exc))
                tried.add(target)
                continue
            recovery_guard.settle(store, name, "recovered")
            fleetstate.finish(store, lease, "settled")
            _book(hosts[target], vm, name)
            out = {"host": target, "state": done.get("state"), "score": ranked["ranking"][0]["score"]}
            if errors:
                out["failed_first"] = errors
            return out


def _start(vm):
    return vm.get("state") in RUNNING


def recover(
    remote: publish.Fleet,
    host: str,
    conf: Data,
    pol: Data | None = None,
    store: fleetstate.Store | None = None,
    force: bool = False,
    only: Iterable[str] | None = None,
    hosts: dict[str, Data] | None = None,
) -> Data:
    """``salt-run virt.recover HOST``: see the module doc. Returns the runner's answer. ``force``: go on
    although hypervisors other than HOST do not answer, or a run before left a VM ``recovering``. ``only``: restart
    these VMs of the plan and no other (automatic HA: its HA VMs); the others are listed under ``not_selected`` and
    alone do not fence HOST. ``hosts``: every hypervisor's ``virt.full_info`` already gathered (automatic HA's round:
    gathering again would wait on the silent HOST once more). What it did is counted in salt-virt's metrics
    (:func:`count_actions`)."""
    metrics.ensure(remote.opts)
    try:
        result = _recover(remote, host, conf, pol, store, force, only, hosts)
    except publish.Failed as exc:
        count_actions(exc.details, refused=True)
        raise
    count_actions(result)
    return result


def count_actions(result: Data, refused: bool = False) -> None:
    """``saltvirt.fleet.recovery.actions`` of one ``virt.recover``: ``refused`` (the run stopped),
    ``fenced``/``fence_failed`` (the host), ``recovered``/``failed``/``not_recoverable`` (its VMs)."""
    rc = (result.get("fenced") or {}).get("rc", "not fenced")
    counts = {
        "refused": int(refused),
        "fenced": int(rc == 0),
        "fence_failed": int(rc not in (0, "not fenced")),
        "recovered": len(result.get("recovered") or {}),
        "failed": len(result.get("failed") or {}),
        "not_recoverable": len(result.get("not_recoverable") or {}),
    }
    for action, n in counts.items():
        if n:
            metrics.add("saltvirt.fleet.recovery.actions", n, action=action)
    metrics.flush()


def _recover(remote, host, conf, pol, store, force, only, hosts):
    validate.host_name(host, "host (a hypervisor's minion id)")
    store = store or fleetstate.Store(remote.opts)
    fcfg, rcfg = fence_config(conf), recovery_config(conf)
    hosts = hosts if hosts is not None else remote.gather("virt.full_info")
    if host not in hosts:
        raise publish.Failed(f"{host} is not a known hypervisor (known: {', '.join(sorted(hosts)) or 'none'})")
    down = verify_down(remote, host, hosts, rcfg)
    silent = [h for h in publish.down_hosts(hosts) if h != host]
    if silent and not force:
        raise publish.Failed(
            f"refusing to recover {host}: {', '.join(silent)} did not answer, and may run {host}'s VMs now "
            "(migrated there since the last record). Bring it back, or retry with force=True once you know "
            "it runs none of them",
            down=down,
            silent={h: hosts[h] for h in silent},
        )
    rec = recall(remote.opts, host, store)
    if not rec:
        raise publish.Failed(
            f"refusing to recover {host}: the master has no record of its VMs (salt-run virt.record keeps one; "
            "schedule it on the master)",
            down=down,
        )
    todo = plan(rec, hosts, host, check_peers(remote, rec, host, hosts))
    if only is not None:
        chosen = set(only)
        todo["not_selected"] = sorted(n for n in todo["restart"] if n not in chosen)
        todo["restart"] = [n for n in todo["restart"] if n in chosen]
    result = {"host": host, "down": down, "record": age(rec), **todo}
    if not todo["restart"]:
        return dict(result, fenced=None, recovered={}, failed={}, note=f"nothing to restart: {host} was not fenced")
    try:
        fenced = fence(fcfg, host)
    except publish.Failed as exc:
        exc.details.update(result)
        raise
    result["fenced"] = fenced
    if fenced["rc"] != 0:
        raise publish.Failed(
            f"refusing to recover {host}: the fence command failed (rc {fenced['rc']}): {fenced['output']}. "
            "Nothing was restarted: make sure the host is off, fix the fence command, retry",
            **result,
        )
    pol = pol or placement.make_policy()
    recovered, failed = {}, {}
    for name in todo["restart"]:
        try:
            recovered[name] = restart_one(
                remote, rec, name, hosts, host, pol, store, todo["candidates"].get(name), force=force
            )
        except fleetstate.HeldError as exc:  # another master migrates or recovers it right now
            failed[name] = {"error": str(exc)}
        except CommandExecutionError as exc:
            failed[name] = {"error": str(exc), **getattr(exc, "details", {})}
    result.update(recovered=recovered, failed=failed)
    if recovered:
        _remember_recovered(store, host, rec, recovered)
        # the hosts that took VMs are recorded again at once: if one of them fails next, its record has them
        try:
            result["recorded"] = sorted(h for h, r in refresh(remote, store).items() if r["status"] == "recorded")
        except CommandExecutionError as exc:  # the VMs run: say so, and that the record is behind
            result["recorded"] = f"not recorded again ({exc}): run salt-run virt.record"
        result["note"] = (
            f"{host} still has its own definitions of {', '.join(sorted(recovered))}: before it runs VMs again, "
            f"run salt-run virt.reconcile {host} (it undefines them there, keeping the shared disks; "
            "never virt.purge them there)"
        )
    return result


def _remember_recovered(store, host, rec, recovered):
    now = time.time()
    done = {n: {"to": r["host"], "uuid": rec["vms"][n].get("uuid"), "at": now} for n, r in recovered.items()}
    store.transact(RECOVERED, host, lambda old: dict(old or {}, **done))


def reconcile(remote: publish.Fleet, host: str, store: fleetstate.Store | None = None) -> Data:
    """``salt-run virt.reconcile HOST``: HOST is back; undefine there (disks kept) the VMs that
    :func:`recover` restarted elsewhere, once each is verified defined on another hypervisor (same
    UUID) and stopped on HOST. A copy running on HOST is never touched: reported under ``conflicts``."""
    validate.host_name(host, "host (a hypervisor's minion id)")
    store = store or fleetstate.Store(remote.opts)
    hosts = remote.gather("virt.full_info")
    if host not in hosts:
        raise publish.Failed(f"{host} is not a known hypervisor (known: {', '.join(sorted(hosts)) or 'none'})")
    if hosts[host]["status"] != "up":
        raise publish.Failed(
            f"{host} is {hosts[host]['status']} ({hosts[host].get('error')}): reconcile it once it is back"
        )
    todo = store.fetch(RECOVERED, host) or {}
    here = hosts[host].get("vm_info") or {}
    stale = [
        n
        for n, i in sorted(todo.items())
        if n in here and here[n].get("uuid") == (i.get("uuid") or here[n].get("uuid"))
    ]
    disarmed = {}
    if stale:  # first of all: none of them may start here again by itself (a reboot, a libvirtd restart)
        try:
            disarmed = remote.ret(host, "virt.recovery_disarm", stale)
        except CommandExecutionError as exc:
            raise publish.Failed(
                f"{host}: could not turn autostart off for {', '.join(stale)} ({exc}); nothing was undefined. "
                "Retry virt.reconcile",
                conflicts={},
            ) from None
    undefined, kept, conflicts, gone = {}, {}, {}, []
    for name, info in sorted(todo.items()):
        mine = here.get(name)
        if not mine or (info.get("uuid") and mine.get("uuid") != info["uuid"]):
            gone.append(name)
            continue
        now = _where_now(hosts, host, name, info.get("uuid"))
        if mine.get("state") not in ("shutoff", "crashed", "nostate", "shutdown"):
            conflicts[name] = f"{mine.get('state')} on {host}" + (f" AND defined on {now[0]} ({now[1]})" if now else "")
            continue
        if not now:
            kept[name] = f"no other hypervisor that answered has it: {host}'s definition is the only one, kept"
            continue
        try:
            remote.ret(host, "virt.undefine", name)
        except CommandExecutionError as exc:
            kept[name] = f"undefine failed: {exc}"
            continue
        undefined[name] = f"undefined on {host} (disks kept); it is on {now[0]} ({now[1]})"
        gone.append(name)
    left = set(todo) - set(gone)
    store.transact(RECOVERED, host, lambda old: {n: v for n, v in (old or {}).items() if n in left} or None)
    autostart_off = sorted(n for n, was_on in disarmed.items() if was_on)
    return {"host": host, "undefined": undefined, "kept": kept, "conflicts": conflicts, "autostart_off": autostart_off}
