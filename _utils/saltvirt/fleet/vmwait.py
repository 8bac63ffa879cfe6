"""``salt-run virt.init ... wait=ip|minion``: return once the new VM is usable, so scripts need no retry loop.

``ip``
    until ``virt.vm_info`` on its hypervisor shows an address on one of its NICs (any source, see
    :mod:`saltvirt.host.guestips`; an agent or ARP address is what the guest claims, reported as such).
``minion``
    until the new VM's own minion answers ``test.ping``: published through the runner's LocalClient to
    that one minion id only (a list target, never a glob), again after a window that doubles each time (5 s,
    10 s, ... up to 60 s), since a minion that connects later never sees an earlier publication, and a slow
    guest must not get a backlog of pings. An answer to any of this wait's publications counts,
    also one that comes after its own window (read from the master's job cache): a guest slower than the
    window (many new VMs booting at once on emulated CPUs) answers every publication late, and would
    otherwise never be seen answering while each new publication adds to its load.

A wait that runs out never undoes anything: the VM stays created, and the answer says so and what was
seen (state, addresses, pings); the runner then exits non-zero.
"""

import contextlib
import io
import logging
import time
from typing import Any

from salt.exceptions import SaltException, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.fleet import publish

log = logging.getLogger(__name__)
WAITS = ("ip", "minion")
DEFAULT_TIMEOUT = 300
MAX_TIMEOUT = 86400
POLL = 2.0  # seconds between two looks at the VM's addresses
PING_WINDOW = 5.0  # seconds the first test.ping publication is waited for; each next one twice as long ...
MAX_PING_WINDOW = 60.0  # ... up to this: a slow guest is not sent a new job every few seconds
CACHE_LOOK = 2.0  # seconds between two looks in the job cache for a late answer while a window is open


def check(wait: Any, wait_timeout: Any = DEFAULT_TIMEOUT, start: Any = True) -> tuple[str | None, float | None]:
    """``(wait, seconds)`` validated before anything is created, ``(None, None)`` without a wait."""
    if wait in (None, "", False):
        return None, None
    if not isinstance(wait, str) or wait.strip().lower() not in WAITS:
        raise SaltInvocationError(f"wait must be ip or minion (or left out), not {wait!r}")
    seconds = validate.seconds(wait_timeout, "wait_timeout", MAX_TIMEOUT)
    if not validate.to_bool(start):
        raise SaltInvocationError(f"wait={wait.strip().lower()} needs the VM started: leave out start=False")
    return wait.strip().lower(), seconds


def _ips(info):
    """``{mac: [address, ...]}`` of the NICs that have addresses in one ``vm_info`` entry."""
    nics = (info or {}).get("nics") or {}
    return {mac: nic["ips"] for mac, nic in sorted(nics.items()) if isinstance(nic, dict) and nic.get("ips")}


def _look(fleet, host, name, max_wait):
    """``(vm_info entry or None, why not)`` of the VM on its hypervisor."""
    try:
        ans, _jid = fleet.call(host, "virt.vm_info", [name], max_wait=max_wait)
    except SaltException as exc:
        return None, str(exc)
    if ans["status"] != "up":
        return None, f"{host} {ans['status']}: {ans.get('error')}"
    info = (ans.get("ret") or {}).get(name) if isinstance(ans.get("ret"), dict) else None
    return info, None if info else f"{name} is not on {host} any more"


def _answered(client, jids, minion_id):
    """Whether ``minion_id`` returned True to one of the publications ``jids`` (the master's job cache)."""
    for jid in jids:
        try:
            ret = client.get_cache_returns(jid)
        except SaltException as exc:
            log.debug("job cache of %s not readable: %s", jid, exc)
            continue
        if isinstance(ret.get(minion_id), dict) and ret[minion_id].get("ret") is True:
            return True
    return False


def _ping(client, minion_id, until, earlier):
    """True once ``minion_id`` answers a test.ping publication: a new one before ``until`` (monotonic) or
    one of the ``earlier`` ones (their jids; the new one is appended) at any time."""
    if _answered(client, earlier, minion_id):
        return True
    with contextlib.redirect_stdout(io.StringIO()):  # LocalClient prints "No minions matched"
        pub = client.run_job([minion_id], "test.ping", [], "list", timeout=PING_WINDOW, listen=True)
    if not pub:
        return False
    earlier.append(pub["jid"])
    looked = time.monotonic()
    try:
        for item in client.get_iter_returns(
            pub["jid"],
            {minion_id},
            timeout=max(1.0, until - time.monotonic()),
            tgt=[minion_id],
            tgt_type="list",
            gather_job_timeout=max(1.0, until - time.monotonic()),
            block=False,
        ):
            if item and isinstance(item.get(minion_id), dict):
                return item[minion_id].get("ret") is True
            now = time.monotonic()
            if now >= until:
                return False
            if now - looked >= CACHE_LOOK:  # an earlier publication's late answer ends the wait too
                looked = now
                if _answered(client, earlier[:-1], minion_id):
                    return True
            if not item:
                time.sleep(0.1)
    finally:
        with contextlib.suppress(Exception):
            client._clean_up_subscriptions(pub["jid"])
    return False


def _seen(info, why):
    if info is None:
        return {"vm": why or "not read"}
    seen = {"state": info.get("state"), "ips": _ips(info)}
    if info.get("ips_note"):
        seen["ips_note"] = info["ips_note"]
    return seen


def wait(fleet: publish.Fleet, what: str, created: Data, seconds: float) -> Data:
    """Wait ``seconds`` at most for ``what`` (``ip``/``minion``) of the VM the runner just ``created``
    (its answer: ``name``, ``host``, ``key``). Returns ``{for, result: ok|timeout|error, seconds, ...}``;
    never raises: the VM exists whatever happens while waiting."""
    try:
        return _wait(fleet, what, created, seconds)
    except Exception as exc:  # noqa: BLE001 - a failed wait must not turn a created VM into a failure
        log.warning("virt.init %s: waiting for %s failed: %s", created["name"], what, exc)
        return {
            "for": what,
            "timeout": seconds,
            "result": "error",
            "message": f"waiting for {what} failed ({exc}). The VM {created['name']} was created on "
            f"{created['host']} and is kept: see salt-run virt.vm_info {created['name']}",
        }


def _wait(fleet, what, created, seconds):
    name, host = created["name"], created["host"]
    minion_id = (created.get("key") or {}).get("minion_id") or name
    started = time.monotonic()
    deadline = started + seconds
    out = {"for": what, "timeout": seconds}
    info = why = None
    pings = 0
    jids: list[str] = []  # the test.ping publications so far (a late answer to any of them counts)
    while True:
        if what == "ip":
            info, why = _look(fleet, host, name, max(1.0, deadline - time.monotonic()))
            if _ips(info):
                return dict(out, result="ok", seconds=round(time.monotonic() - started, 1), ips=_ips(info))
        else:
            pings += 1
            # each publication is one more job in the guest: a slow one (emulated CPUs, many VMs booting)
            # answering late is sent fewer, not a backlog it works through after the wait
            window = min(PING_WINDOW * 2 ** (pings - 1), MAX_PING_WINDOW)
            if _ping(fleet.client, minion_id, min(deadline, time.monotonic() + window), jids):
                return dict(out, result="ok", seconds=round(time.monotonic() - started, 1), minion=minion_id)
        if time.monotonic() + (POLL if what == "ip" else 0) >= deadline:
            break
        time.sleep(POLL if what == "ip" else 0.5)
    if what == "minion":
        if _answered(fleet.client, jids, minion_id):  # the last publication's answer came after its window
            return dict(out, result="ok", seconds=round(time.monotonic() - started, 1), minion=minion_id)
        info, why = _look(fleet, host, name, None)
        out.update(minion=minion_id, pings=pings)
    return dict(
        out,
        result="timeout",
        seconds=round(time.monotonic() - started, 1),
        seen=_seen(info, why),
        message=_timeout_message(what, name, host, minion_id, seconds, created),
    )


def _timeout_message(what, name, host, minion_id, seconds, created):
    waited = (
        f"no address showed up on {name}'s NICs" if what == "ip" else f"minion {minion_id} did not answer test.ping"
    )
    hint = ""
    if what == "minion" and not created.get("key"):
        hint = " (no minion key was seeded: seed=False or no image; its minion must be set up some other way)"
    return (
        f"{waited} within {seconds:g} s{hint}. The VM {name} was created on {host} and is kept: "
        f"see salt-run virt.vm_info {name}, or salt-run virt.purge {name} to remove it"
    )
