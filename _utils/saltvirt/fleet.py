"""Master-side helpers for the ``virt`` runner: one LocalClient publication to every hypervisor with
bounded waits, answers merged per minion (hosts that do not answer are reported ``down``, never
dropped), and the master's key store (read a hypervisor's accepted key, pre-accept a new VM's key).

Which minions are hypervisors (master config, every key optional)::

    virt:
      hypervisors:
        tgt: 'hyper*'            # default: G@virt_hypervisor:True or L@<minions that answered virt before>
        tgt_type: glob           # default: compound
        timeout: 5               # seconds before Salt asks slow minions whether they still run the job
        gather_job_timeout: 5    # seconds to wait for that answer; no answer at all = down
        max_wait: 60             # hard bound for a query, whatever the minions say
        init_timeout: 1800       # hard bound for virt.init on one hypervisor (image copy + seeding)

Default target: the ``virt_hypervisor`` grain in the master's minion data cache (nested hypervisors
count: the grain is set where the libvirt bindings and a libvirt daemon or ``virt:connection:uri``
are, not from ``virtual: physical``), plus every minion that
answered a ``virt`` call before (remembered in the master cache, bank ``salt-virt``). The minions
expected to answer are the accepted keys matching that target (no greedy guessing), so a stopped
hypervisor is listed as ``down``. With nothing known yet (a fresh master) the first query goes to
``*`` and keeps the minions where ``virt`` loaded.

Answer statuses: ``up`` (returned), ``error`` (answered with an error: the module raised, or virt
did not load on an expected hypervisor), ``down`` (no answer, not even to Salt's find_job check),
``timeout`` (still running the job when ``max_wait`` ran out: it may still finish).
"""

import contextlib
import hashlib
import io
import logging
import math
import os
import re
import time

import salt.cache
import salt.client
import salt.fileserver
import salt.key
import salt.utils.minions
import salt.utils.url
import salt.utils.verify
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt import envelope, fleetstate, intake, placement

log = logging.getLogger(__name__)

DEFAULTS = {
    "tgt": None,
    "tgt_type": "compound",
    "timeout": 5,
    "gather_job_timeout": 5,
    "max_wait": 60,
    "init_timeout": 1800,
}
GRAIN = "virt_hypervisor"
CACHE_BANK = "salt-virt"
CACHE_KEY = "hypervisors"
_NO_VIRT = re.compile(r"^'virt(\.[\w.]+)?' (is not available|__virtual__ returned False)")
_ERR_PREFIX = re.compile(r"^(ERROR: |ERROR executing '[\w.]+': )")


def config(opts, **overrides):
    """Effective ``virt:hypervisors`` settings: defaults < master config < per-call overrides."""
    cfg = dict(DEFAULTS)
    conf = ((opts.get("virt") or {}).get("hypervisors")) or {}
    if not isinstance(conf, dict):
        raise SaltInvocationError(f"virt:hypervisors must be a mapping, not {conf!r}")
    unknown = sorted(set(conf) - set(DEFAULTS))
    if unknown:
        raise SaltInvocationError(
            f"virt:hypervisors: unknown key(s) {', '.join(unknown)} (known: {', '.join(DEFAULTS)})"
        )
    cfg.update(conf)
    cfg.update({k: v for k, v in overrides.items() if v is not None and k in DEFAULTS})
    if overrides.get("tgt") and not overrides.get("tgt_type"):
        cfg["tgt_type"] = "glob" if "," not in str(overrides["tgt"]) else "list"
    for key in ("timeout", "gather_job_timeout", "max_wait", "init_timeout"):
        try:
            cfg[key] = float(cfg[key])
        except (TypeError, ValueError):
            raise SaltInvocationError(f"virt:hypervisors:{key} must be a number of seconds, not {cfg[key]!r}") from None
        if cfg[key] <= 0:
            raise SaltInvocationError(f"virt:hypervisors:{key} must be above 0, not {cfg[key]!r}")
    # a hard bound shorter than Salt's own down-detection would report down hosts as 'timeout'
    floor = cfg["timeout"] + cfg["gather_job_timeout"] + 2
    cfg["max_wait"] = max(cfg["max_wait"], floor)
    cfg["init_timeout"] = max(cfg["init_timeout"], floor)
    return cfg


# who is a hypervisor -------------------------------------------------------------------------------
def _cache(opts):
    return salt.cache.Cache(opts)


def known_hypervisors(opts):
    try:
        return dict(_cache(opts).fetch(CACHE_BANK, CACHE_KEY) or {})
    except Exception as exc:  # noqa: BLE001 - an unreadable cache must not break queries
        log.warning("virt runner: cannot read the known hypervisors from the master cache: %s", exc)
        return {}


def learn(opts, answers):
    """Remember minions that answered as hypervisors; forget the ones where virt does not load."""
    known = known_hypervisors(opts)
    before = set(known)
    for mid, ans in answers.items():
        if ans["status"] == "up":
            known.setdefault(mid, int(time.time()))  # first seen
        elif ans.get("no_virt"):
            known.pop(mid, None)
    if set(known) != before:
        try:
            _cache(opts).store(CACHE_BANK, CACHE_KEY, known)
        except Exception as exc:  # noqa: BLE001
            log.warning("virt runner: cannot store the known hypervisors in the master cache: %s", exc)


def key_lists(opts):
    return salt.key.Key(opts).list_keys()


def target(opts, cfg):
    """``(tgt, tgt_type, auto)`` for the hypervisors; ``auto`` when derived (not configured)."""
    if cfg["tgt"]:
        tgt = cfg["tgt"]
        if cfg["tgt_type"] == "list" and isinstance(tgt, str):
            tgt = [t.strip() for t in tgt.split(",") if t.strip()]
        return tgt, cfg["tgt_type"], False
    accepted = set(key_lists(opts)["minions"])
    known = sorted(set(known_hypervisors(opts)) & accepted)
    tgt = f"G@{GRAIN}:True" + (f" or L@{','.join(known)}" if known else "")
    return tgt, "compound", True


def expected_minions(opts, tgt, tgt_type):
    """Accepted minions the target matches on the master (cached grains, not greedy)."""
    res = salt.utils.minions.CkMinions(opts).check_minions(tgt, tgt_type, greedy=False)
    return set(res.get("minions", []) if isinstance(res, dict) else res)


# publish and gather --------------------------------------------------------------------------------
def classify(ret, retcode):
    """One minion's answer -> ``{status, ret | error, no_virt?}``."""
    if isinstance(ret, str) and _NO_VIRT.match(ret):
        return {"status": "error", "error": ret, "no_virt": True}
    failed = retcode not in (None, 0) or (
        isinstance(ret, str) and ret.startswith(("ERROR", "Passed invalid arguments"))
    )
    if failed:
        if isinstance(ret, dict) and any(isinstance(v, str) and _NO_VIRT.match(v) for v in ret.values()):
            msg = next(v for v in ret.values() if isinstance(v, str) and _NO_VIRT.match(v))
            return {"status": "error", "error": msg, "no_virt": True}
        text = ret if isinstance(ret, str) else repr(ret)
        return {"status": "error", "error": _ERR_PREFIX.sub("", text).strip(), "retcode": retcode}
    return {"status": "up", "ret": ret}


def _relay(client, watch):
    """Hand events whose tag starts with ``watch[0]`` (other than the runner's own) to ``watch[1]``."""
    if not watch:
        return
    while True:
        ev = client.event.get_event(wait=0.001, tag=watch[0], match_type="startswith", full=True, no_block=True)
        if not ev:
            return
        data = ev.get("data") or {}
        if isinstance(data, dict) and data.get("source") != "runner":
            try:
                watch[1](ev["tag"], data.get("data", data) if isinstance(data.get("data"), dict) else data)
            except Exception as exc:  # noqa: BLE001 - progress display never breaks the work
                log.debug("virt runner: progress relay failed: %s", exc)


def run(  # noqa: C901, PLR0912 - publish, then one wait loop that classifies every answer
    opts, fun, arg=(), kwarg=None, tgt=None, tgt_type=None, cfg=None, max_wait=None, client=None, watch=None
):
    """Publish ``fun`` once to the hypervisors and gather every answer within the configured bounds.

    Returns ``{minion: {"status": up|error|down|timeout, "ret"|"error": ...}}`` for every minion
    expected (the target's accepted keys) plus any other minion that answered as a hypervisor.
    ``watch=(tag_prefix, callback)`` relays matching master events (e.g. virt.init progress) while waiting.
    """
    cfg = cfg or config(opts)
    auto = False
    if tgt is None:
        tgt, tgt_type, auto = target(opts, cfg)
    tgt_type = tgt_type or "glob"
    expected = expected_minions(opts, tgt, tgt_type)
    discover = auto and not expected
    if discover:  # fresh master: nobody known yet, ask everyone and keep where virt loads
        tgt, tgt_type = "*", "glob"
    max_wait = float(max_wait or cfg["max_wait"])
    client = client or salt.client.get_local_client(opts["conf_file"])
    answers = {}
    if watch:
        client.event.subscribe(watch[0], match_type="startswith")
    with contextlib.redirect_stdout(io.StringIO()) as noise:  # LocalClient prints "No minions matched"
        pub = client.run_job(tgt, fun, list(arg), tgt_type, timeout=cfg["timeout"], kwarg=kwarg, listen=True)
    if noise.getvalue().strip():
        log.debug("virt runner: LocalClient said: %s", noise.getvalue().strip())
    started = time.monotonic()
    if pub:
        waiting = set(pub.get("minions") or []) | expected
        deadline = started + max_wait
        try:
            for item in client.get_iter_returns(
                pub["jid"],
                waiting,
                timeout=cfg["timeout"],
                tgt=tgt,
                tgt_type=tgt_type,
                gather_job_timeout=cfg["gather_job_timeout"],
                block=False,
            ):
                _relay(client, watch)
                if item:
                    for mid, data in item.items():
                        if isinstance(data, dict) and "ret" in data:
                            answers[mid] = classify(data["ret"], data.get("retcode"))
                    if expected and expected <= set(answers) and waiting <= set(answers):
                        break
                else:
                    time.sleep(0.02)
                if time.monotonic() > deadline:
                    break
        finally:
            _relay(client, watch)
            with contextlib.suppress(Exception):
                client._clean_up_subscriptions(pub["jid"])
    if watch:
        with contextlib.suppress(Exception):
            client.event.unsubscribe(watch[0], match_type="startswith")
    elapsed = time.monotonic() - started
    for mid in list(answers):
        if answers[mid].get("no_virt") and mid not in expected:
            del answers[mid]  # not a hypervisor (discovery, or a glob that caught other minions)
    for mid in expected - set(answers):
        if elapsed >= max_wait:
            answers[mid] = {
                "status": "timeout",
                "error": f"no answer within max_wait={max_wait:g} s (it may still be running)",
            }
        else:
            answers[mid] = {
                "status": "down",
                "error": f"did not answer (waited {cfg['timeout']:g} s + {cfg['gather_job_timeout']:g} s job check)",
            }
    if auto or discover:
        learn(opts, answers)
    return {mid: answers[mid] for mid in sorted(answers)}, (pub or {}).get("jid")


def call(opts, minion, fun, arg=(), kwarg=None, cfg=None, max_wait=None, client=None, watch=None):
    """Run ``fun`` on one minion; ``(answer, jid)`` with the same statuses as :func:`run`."""
    answers, jid = run(
        opts, fun, arg, kwarg, tgt=[minion], tgt_type="list", cfg=cfg, max_wait=max_wait, client=client, watch=watch
    )
    return answers.get(minion) or {"status": "down", "error": "did not answer"}, jid


# the master's key store ----------------------------------------------------------------------------
def _keys(opts):
    return salt.cache.Cache(opts, driver=opts.get("keys.cache_driver") or "localfs_key")


def _valid(opts, minion_id):
    if (
        not isinstance(minion_id, str)
        or minion_id != minion_id.strip()
        or not salt.utils.verify.valid_id(opts, minion_id)
    ):
        raise SaltInvocationError(f"{minion_id!r} is not a valid minion id")


def key_state(opts, minion_id):
    """``accepted|pending|rejected|denied`` or None: what the master has for ``minion_id``."""
    _valid(opts, minion_id)
    store = _keys(opts)
    entry = store.fetch("keys", minion_id)
    if entry:
        return entry.get("state")
    return "denied" if store.fetch("denied_keys", minion_id) else None


def accepted_pub(opts, minion_id):
    """The public key the master accepted for ``minion_id`` (never what a minion claims)."""
    _valid(opts, minion_id)
    entry = _keys(opts).fetch("keys", minion_id)
    if not entry or entry.get("state") != "accepted":
        raise CommandExecutionError(f"the master has no accepted key for {minion_id!r}: cannot seal the new key for it")
    return entry["pub"]


def refuse_existing_key(opts, minion_id):
    state = key_state(opts, minion_id)
    if state:
        raise SaltInvocationError(
            f"the master already has a {state} key for {minion_id!r}: remove it first (salt-key -d {minion_id}) "
            "or choose another name"
        )


def preaccept(opts, minion_id, pub):
    """Store ``pub`` as the accepted key of ``minion_id``; refuses if the master has any key for it."""
    refuse_existing_key(opts, minion_id)
    _keys(opts).store("keys", minion_id, {"state": "accepted", "pub": pub})


def remove_key(opts, minion_id, pub):
    """Remove ``minion_id``'s key only if it is still the one we stored. True if removed."""
    store = _keys(opts)
    entry = store.fetch("keys", minion_id)
    if not entry or entry.get("pub", "").strip() != pub.strip():
        return False
    store.flush("keys", minion_id)
    return True


# fleet views ---------------------------------------------------------------------------------------
class Failed(CommandExecutionError):  # noqa: N818 - the runner's public name for it
    """A runner operation failed; ``details`` (tried hosts, cleanup, ...) go into the runner's answer."""

    def __init__(self, message, **details):
        super().__init__(message)
        self.details = details


def gather(opts, fun="virt.full_info", cfg=None, client=None):
    """Every hypervisor's answer to ``fun`` in the runner's shape (``full_info`` ->
    ``{status, host, vm_info}``, ``host_info`` -> ``{status, host}``, ``vm_state`` -> ``{status, vms}``)."""
    answers, _jid = run(opts, fun, cfg=cfg, client=client)
    out = {}
    for mid, ans in answers.items():
        if ans["status"] != "up":
            out[mid] = {k: v for k, v in ans.items() if k in ("status", "error")}
        elif fun == "virt.full_info" and isinstance(ans["ret"], dict):
            out[mid] = {"status": "up", "host": ans["ret"].get("host", {}), "vm_info": ans["ret"].get("vm_info", {})}
        elif fun == "virt.vm_state":
            out[mid] = {"status": "up", "vms": ans["ret"]}
        else:
            out[mid] = {"status": "up", "host": ans["ret"]}
    return out


def down_hosts(hosts):
    return sorted(h for h, a in hosts.items() if a["status"] != "up")


def locate(hosts, name, host=None):
    """The one hypervisor where VM ``name`` is defined (``hosts`` from :func:`gather`)."""

    def has(ans):
        vms = ans.get("vms") if "vms" in ans else ans.get("vm_info")
        return ans["status"] == "up" and name in (vms or {})

    found = sorted(h for h, a in hosts.items() if has(a))
    unknown = down_hosts(hosts)
    if host:
        if host in found:
            return host
        if host in unknown:
            raise Failed(f"hypervisor {host} is {hosts[host]['status']}: {hosts[host].get('error')}", down=unknown)
        raise Failed(f"VM {name!r} is not defined on {host}" + (f" (it is on {', '.join(found)})" if found else ""))
    if len(found) > 1:
        raise Failed(
            f"VM name {name!r} is ambiguous: defined on {', '.join(found)}. Pass host=<one of them>, "
            "and rename one of them to keep names unique",
            hosts=found,
        )
    if not found:
        hint = f"; these hypervisors did not answer and may have it: {', '.join(unknown)}" if unknown else ""
        raise Failed(f"VM {name!r} is not defined on any hypervisor that answered{hint}", down=unknown)
    return found[0]


def image_mib(opts, image, saltenv="base"):
    """``(MiB, note)``: the disk a full copy of ``image`` needs, measured on the master when it can be."""
    if not image:
        return 0, "no image"
    if isinstance(image, str) and image.startswith("salt://"):
        path, env = salt.utils.url.parse(image)
        try:
            fnd = salt.fileserver.Fileserver(opts).find_file(path, env or saltenv)
        except Exception as exc:  # noqa: BLE001 - size is advisory; the hypervisor reports real errors
            return 0, f"size unknown ({exc})"
        if not fnd or not fnd.get("path"):
            raise SaltInvocationError(f"image {image} is not on the master's fileserver (saltenv {env or saltenv})")
        return math.ceil(os.path.getsize(fnd["path"]) / 1048576), f"{image}: measured in the master's file_roots"
    return 0, f"size of {intake.redact(image)} unknown on the master: not counted"


def _entry(plan, host):
    return next((r for r in plan["ranking"] if r["host"] == host), {"host": host, "score": None, "asked_for": True})


def _brief(plan):
    return {
        "reason": plan["reason"],
        "ranking": [{"host": r["host"], "score": r["score"]} for r in plan["ranking"]],
        "excluded": plan["excluded"],
    }


def _creating(opts, names, what="virt.init", job=None):
    """The runner's per-VM lock: one ``virt.init`` / ``virt.migrate`` (``what``) per VM name / minion id
    at a time across every master sharing the cache (``saltvirt.fleetstate``). A context manager
    yielding the :class:`saltvirt.fleetstate.Lease`; init, migrate and evacuate all take it."""
    return fleetstate.lock(opts, names, kind=what, job=job)


def create(opts, name, req, image, module_kwargs, job=None, **kwargs):
    """Place, pre-accept the new minion's key, run ``virt.init`` on the chosen hypervisor (falling over
    to the next candidate only when a hypervisor does not answer), return where it went and its info.
    Raises :class:`Failed` with ``tried``/``cleanup`` details; the key it stored is removed on failure.

    One ``virt.init`` per VM name / minion id at a time across every master sharing the cache
    (``saltvirt.fleetstate`` locks); the capacity it takes is reserved from placement until the VM runs."""
    with _creating(opts, [name, kwargs.get("minion_id") or name], job=job) as lease:
        taken = [{"name": t["name"], "why": t["why"], "was": t["was"]} for t in lease.taken_over]
        try:
            result = _create(opts, name, req, image, module_kwargs, lease=lease, **kwargs)
        except Failed as exc:
            if taken:
                exc.details["taken_over"] = taken
            raise
        if taken:
            result["taken_over"] = taken
        return result


def _reserve(lease, hosts, order, start, name, req, policy, since, tried, keep_previous=None):
    """Reserve ``req`` on the first host of ``order[start:]`` that still has room with every in-flight
    creation counted (other masters' too); hosts without room go to ``tried``. Its position, or None.
    ``keep_previous`` (seconds): the previous candidate did not answer virt.init but may still run it, so
    its reservation stays for that long instead of being dropped."""
    if keep_previous:
        fleetstate.finish(lease.store, lease, "unknown", keep_for=keep_previous)
    else:
        fleetstate.finish(lease.store, lease, "failed")  # the previous candidate's, if any
    for pos in range(start, len(order)):
        hv = order[pos]
        try:
            fleetstate.reserve(
                lease.store,
                lease,
                hv,
                name,
                req,
                hosts.get(hv),
                since,
                fits=lambda answer, load, hv=hv: placement.fits(hv, answer, req, policy, load),
            )
            return pos
        except fleetstate.NoRoomError as exc:
            tried.append(
                {"host": hv, "outcome": "no room", "error": f"in-flight inits took the room: {exc}", "jid": None}
            )
    return None


def _create(  # noqa: C901, PLR0912, PLR0915 - placement, key, per-host attempts and cleanup in one flow
    opts,
    name,
    req,
    image,
    module_kwargs,
    *,
    policy,
    cfg,
    host=None,
    fallback=True,
    seed=True,
    minion_id=None,
    client=None,
    progress=None,
    lease=None,
):
    progress = progress or (lambda step, **data: None)
    started = time.monotonic()
    key_id = minion_id or name
    seed = bool(seed and image)  # seeding writes into the image's filesystem: no image, no key to hand out
    if seed:
        refuse_existing_key(opts, key_id)
    since = time.time()  # reservations settled after this are not in the snapshot yet
    hosts = gather(opts, "virt.full_info", cfg, client)
    where = sorted(h for h, a in hosts.items() if a["status"] == "up" and name in a["vm_info"])
    if where:
        raise Failed(f"a VM named {name!r} already exists on {', '.join(where)}: pick another name or purge it")
    plan = placement.rank(hosts, req, policy, reserved=fleetstate.reserved(lease.store, hosts, since, lease.cfg))
    order, tried = [r["host"] for r in plan["ranking"]], []
    if host:
        if host not in hosts:
            raise Failed(
                f"{host} is not one of the hypervisors ({', '.join(sorted(hosts)) or 'none found'}): "
                "check the name, or virt:hypervisors in the master config",
                placement=_brief(plan),
            )
        status = hosts[host]["status"]
        if status == "up" and host in plan["excluded"]:
            raise Failed(f"{host} cannot take {name}: {'; '.join(plan['excluded'][host])}", placement=_brief(plan))
        if status == "up" or (status == "down" and fallback):
            # a host that was down for the query may be back: it is tried first, the ranking after it
            order = [host] + ([h for h in order if h != host] if fallback else [])
        else:
            raise Failed(
                f"{host} is {status}: {hosts[host].get('error')}" + ("" if fallback else " (fallback=False)"),
                placement=_brief(plan),
            )
    if not order:
        raise Failed(plan["reason"], placement=_brief(plan), tried=tried)
    first = _reserve(lease, hosts, order, 0, name, req, policy, since, tried)
    if first is None:
        raise Failed(
            f"no host can take {name} any more: in-flight inits reserved the room (see tried)",
            placement=_brief(plan),
            tried=tried,
        )
    order = order[first:]
    chosen = _entry(plan, order[0])
    reason = plan["reason"] if order[0] == plan["host"] else f"{order[0]}: asked for with host="
    if hosts[order[0]]["status"] != "up":
        reason += f" (it did not answer the query: {hosts[order[0]].get('error')}; trying it, then the ranking)"
    progress("placed", host=order[0], score=chosen["score"], scores=chosen.get("scores"), reason=reason)
    pub = priv = key = None

    def new_key():
        pair = envelope.new_keypair()
        preaccept(opts, key_id, pair[0])
        # sha256 of minion.pub as written (what `sha256sum minion.pub` and the module's virt.init report)
        fingerprint = hashlib.sha256(pair[0].encode()).hexdigest()
        progress("key_accepted", minion_id=key_id, fingerprint=fingerprint)
        return pair[0], pair[1], {"minion_id": key_id, "state": "accepted", "fingerprint": fingerprint}

    if seed:
        pub, priv, key = new_key()
    keep_key = False
    relay = getattr(progress, "relay", None)  # the hypervisor's own progress events, shown as they come
    watch = (f"salt/virt/init/{name}/", lambda tag, data: relay(tag.rsplit("/", 1)[-1], data)) if relay else None
    try:
        pos, attempt = 0, 0
        while pos < len(order):
            hv = order[pos]
            kwarg = dict(module_kwargs, image=image, seed=seed)
            if req.get("group"):
                kwarg["group"] = req["group"]
            attempt += 1
            if seed and attempt > 1:  # a fresh key per host: a late VM on a host that did not answer cannot log in
                remove_key(opts, key_id, pub)
                pub = None
                pub, priv, key = new_key()
            if seed:
                sealed = envelope.seal(accepted_pub(opts, hv), priv, context=key_id)
                kwarg.update(pub_key=pub, priv_key=sealed, minion_id=key_id)
            lease.check()  # never publish for a name whose lock we no longer hold
            lease.note(host=hv)
            ans, jid = call(
                opts,
                hv,
                "virt.init",
                [name, req["cpu"], req["mem"]],
                kwarg,
                cfg,
                cfg["init_timeout"],
                client,
                watch=watch,
            )
            if ans["status"] == "up":
                fleetstate.finish(lease.store, lease, "settled")
                warnings = []
                if seed:
                    key, warnings = _check_seeded_key(opts, key, pub, ans["ret"])
                info, _ = call(opts, hv, "virt.vm_info", [name], None, cfg, None, client)
                result = {
                    "name": name,
                    "host": hv,
                    "placement": dict(_brief(plan), chosen=_entry(plan, hv)),
                    "tried": tried,
                    "key": key,
                    "init": ans["ret"],
                    "jid": jid,
                    "vm_info": (info.get("ret") or {}).get(name) if info["status"] == "up" else None,
                    "seconds": round(time.monotonic() - started, 1),
                }
                if warnings:
                    result["warnings"] = warnings
                progress("done", host=hv, seconds=result["seconds"])
                return result
            tried.append({"host": hv, "outcome": ans["status"], "error": ans.get("error"), "jid": jid})
            if ans["status"] == "down" and fallback and pos + 1 < len(order):
                # published but unanswered: it may still create the VM there, so its room stays reserved
                nxt = _reserve(
                    lease, hosts, order, pos + 1, name, req, policy, since, tried, keep_previous=cfg["init_timeout"]
                )
                if nxt is not None:
                    progress("fallback", host=hv, error=ans.get("error"), next=order[nxt])
                    pos = nxt
                    continue
            if ans["status"] == "timeout":
                keep_key = True
                # it may still finish there: its capacity stays reserved for as long as it may run
                fleetstate.finish(lease.store, lease, "unknown", keep_for=cfg["init_timeout"])
                raise Failed(
                    f"virt.init of {name} on {hv} was still running after {cfg['init_timeout']:g} s (job {jid}): "
                    f"it may still finish. Check with `salt-run jobs.lookup_jid {jid}`; "
                    f"the key of {key_id} is kept for it "
                    f"(salt-key -d {key_id} if the VM never appears)",
                    tried=tried,
                )
            if ans["status"] == "down":
                fleetstate.finish(lease.store, lease, "unknown", keep_for=cfg["init_timeout"])  # as above
                raise Failed(
                    f"no hypervisor answered virt.init for {name}: tried {', '.join(t['host'] for t in tried)}",
                    tried=tried,
                )
            raise Failed(f"virt.init of {name} on {hv} failed: {ans.get('error')}", tried=tried)
    except BaseException as exc:
        fleetstate.finish(lease.store, lease, "failed")  # no-op when settled or kept for a timeout
        if seed and not keep_key:
            removed = bool(pub) and remove_key(opts, key_id, pub)
            if isinstance(exc, Failed):
                exc.details["cleanup"] = {"key_removed": removed, "minion_id": key_id}
        raise
    raise Failed(f"virt.init of {name}: no candidate left", tried=tried)  # pragma: no cover - loop returns/raises


def _check_seeded_key(opts, key, pub, init_ret):
    """The hypervisor must have seeded *our* key; otherwise take the pre-accepted one back."""
    ret = init_ret if isinstance(init_ret, dict) else {}
    seeded = ret.get("key") or {}
    if ret.get("seed") and seeded.get("fingerprint") in (None, key["fingerprint"]):
        return key, []
    remove_key(opts, key["minion_id"], pub)
    if not ret.get("seed"):
        return dict(key, state="removed"), [
            "the hypervisor did not seed the VM, so no minion holds the pre-accepted key: removed it"
        ]
    return dict(key, state="removed"), [
        f"the hypervisor seeded another key (sha256 {str(seeded.get('fingerprint'))[:16]}...) "
        f"than the pre-accepted one: removed ours; "
        f"accept the VM's own key with salt-key -a {key['minion_id']} once it connects"
    ]


def delete_key(opts, minion_id):
    """Delete ``minion_id``'s key in whatever state it is (``salt-key -d``); the state it had, or None."""
    state = key_state(opts, minion_id)
    if state:
        folder = {
            "accepted": "minions",
            "pending": "minions_pre",
            "rejected": "minions_rejected",
            "denied": "minions_denied",
        }
        with salt.key.Key(opts) as keys:
            keys.delete_key(match_dict={folder[state]: [minion_id]})
    return state
