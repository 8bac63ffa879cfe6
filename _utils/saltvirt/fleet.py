"""How the ``virt`` runner reaches the hypervisors (master side): which minions are hypervisors, one
LocalClient publication to all of them with bounded waits, answers merged per minion (hosts that do
not answer are reported ``down``, never dropped), and the fleet views built on it (:func:`gather`,
:func:`locate`). The master's key store is :mod:`saltvirt.minionkeys`; the master side of
``virt.init`` is :mod:`saltvirt.vmcreate`.

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
import io
import logging
import re
import time

import salt.cache
import salt.client
import salt.key
import salt.utils.minions
from salt.exceptions import CommandExecutionError, SaltInvocationError

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
