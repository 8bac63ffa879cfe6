"""Capacity the hypervisors pushed, read on the master: placement without a question to every hypervisor.

Each hypervisor's ``virt_events`` engine pushes its ``virt.capacity`` answer, signed with its minion key
(:func:`saltvirt.pki.answers.sign_record`), into Salt's mine (``virt.push_capacity``: ``mine.send`` over the
minion's request channel, which Salt authenticates: the master stores it under the id whose key signed the
request's token, bank ``mine``, key ``<id>``; a minion-side ACL lets no other minion ``mine.get`` it) at once
when a VM starts, stops, is defined or undefined, and on a heartbeat.

:func:`capacities` is what ``salt-run virt.init`` places on. A hypervisor's pushed record counts only when:

* the hypervisor is one of the operator's (``virt:hypervisors``: only their ids are read, so a tenant VM's
  minion, whose mine entry is its own, can never stand in for one);
* it verifies with the key the master accepted for that id and was signed as a capacity record (never an answer
  to a request, nor another minion's record copied over);
* it is at most ``virt:capacity_push:max_age`` seconds old (default 90: three missed heartbeats; 0: never
  used), not from the future beyond ``virt:shared:clock_skew``, and newer than the last time the runner found
  the host down (:mod:`saltvirt.fleet.silence`).

Every other hypervisor is asked as before (``virt.capacity`` published to those alone), so a fleet whose records
are all fresh costs no publication before the create. A record is a snapshot: VMs created since are counted by
the shared reservations (the snapshot time handed to :func:`saltvirt.fleet.fleetstate.reserved` is the oldest
record's), and the hypervisor checks the room again before it creates anything (``virt.answer``'s ``capacity``:
:func:`saltvirt.host.capacity.overcommit` on the master side's policy), so a stale record never over-commits.
"""

import logging
import time
from collections.abc import Callable, Iterable

import salt.cache
import salt.utils.mine

from saltvirt.base import validate
from saltvirt.base.config import section, virt_conf
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import fleetstate, minionkeys, publish, silence
from saltvirt.pki import answers

log = logging.getLogger(__name__)

DEFAULTS: Data = {"max_age": 90.0, "every": 30.0}  # every: the hypervisors' own setting (minion config)
BANK = "mine"  # where Salt's master keeps each minion's mine (salt/daemons/masterapi.py ``_mine``)


def max_age(opts: SaltOpts) -> float:
    """``virt:capacity_push:max_age`` of the master config in seconds; 0: pushed records are never used."""
    conf = section(virt_conf(opts).get("capacity_push"), "virt:capacity_push", DEFAULTS)
    value = conf.get("max_age", DEFAULTS["max_age"])
    if value in (0, "0", False):
        return 0.0
    return validate.seconds(value, "virt:capacity_push:max_age")


def _entry(cache: salt.cache.Cache, host: str) -> object:
    """The record in ``host``'s mine (Salt's minion-side ACL wrapper taken off), or None."""
    mine = cache.fetch(BANK, host)
    entry = mine.get(answers.MINE_KEY) if isinstance(mine, dict) else None
    if isinstance(entry, dict) and salt.utils.mine.MINE_ITEM_ACL_ID in entry:
        entry = entry.get(salt.utils.mine.MINE_ITEM_ACL_DATA)
    return entry


def read(
    opts: SaltOpts,
    ids: Iterable[str],
    oldest: float,
    down: dict[str, float] | None = None,
    now: float | None = None,
    skew: float = fleetstate.DEFAULTS["clock_skew"],
) -> tuple[dict[str, Data], dict[str, str]]:
    """``(answers, refused)``: for each hypervisor of ``ids`` whose pushed record counts (see the module doc),
    its answer as :meth:`saltvirt.fleet.publish.Fleet.gather` shapes ``virt.capacity``'s, with ``pushed_at``;
    for the others why not (absent, forged, too old). ``oldest``: the max age in seconds; ``down``:
    :func:`saltvirt.fleet.silence.recent` of ``ids`` (seconds since each was found down)."""
    now = time.time() if now is None else now
    down = down or {}
    ids = list(ids)
    cache = salt.cache.Cache(opts)
    keys = minionkeys.accepted_pubs(opts, ids)
    got: dict[str, Data] = {}
    refused: dict[str, str] = {}
    for host in ids:
        entry = _entry(cache, host)
        if entry is None:
            refused[host] = "no pushed capacity"
            continue
        try:
            if host not in keys:
                raise answers.Unverified("the master has no accepted key for it")
            at, cap = answers.verify_record(keys[host], host, entry)
        except answers.Unverified as exc:
            log.warning("virt runner: the pushed capacity of %s is not believed: %s", host, exc)
            refused[host] = f"not believed: {exc}"
            continue
        age = now - at
        if age > oldest or age < -skew:
            refused[host] = f"{age:.0f} s old (virt:capacity_push:max_age: {oldest:g})"
        elif host in down and down[host] < age:
            refused[host] = f"found down {down[host]:.0f} s ago, after it pushed"
        else:
            got[host] = {"status": "up", "host": cap.get("host") or {}, "vm_info": cap.get("vm_info") or {}}
            got[host]["pushed_at"] = at
    return got, refused


def capacities(fleet: publish.Fleet, check: Callable[[], None] | None = None) -> tuple[dict[str, Data], float]:
    """Every hypervisor's capacity for placement (``fleet``: every hypervisor, :meth:`~publish.Fleet.wide`) and the
    time of the oldest figure in it: pushed records where they count, ``virt.capacity`` asked of the rest (one
    publication to those alone; none when every record counts). ``check``: as in :meth:`~publish.Fleet.run`."""
    asked_at = time.time()
    oldest = max_age(fleet.opts)
    ids = fleet.target()
    hosts: dict[str, Data] = {}
    if oldest and ids:
        try:
            down = silence.recent(fleet.opts, ids, fleet.cfg["down_memory"])
            hosts, refused = read(fleet.opts, ids, oldest, down, asked_at)
        except Exception as exc:  # noqa: BLE001 - Salt's cache (redis, consul, ...) unreadable: nothing pushed counts
            log.warning("virt runner: the pushed capacity cannot be read (%s): every hypervisor is asked", exc)
            hosts, refused = {}, {}
        if refused:
            log.debug("virt runner: asking %s (pushed capacity: %s)", ", ".join(sorted(refused)), refused)
    rest = [h for h in ids if h not in hosts]
    if rest:
        narrowed = fleet if len(rest) == len(ids) else fleet.with_cfg(dict(fleet.cfg, tgt=rest, tgt_type="list"))
        hosts.update(narrowed.capacities(check))
    since = min([asked_at, *(a["pushed_at"] for a in hosts.values() if "pushed_at" in a)])
    return {h: hosts[h] for h in sorted(hosts)}, since
