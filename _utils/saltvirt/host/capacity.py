"""What placement needs from one hypervisor, cheaply: ``virt.capacity``.

``full_info`` describes every VM (one XMLDesc, parse and guest-IP lookup each): O(VMs) work for a
question about the host. Placement (``virt.init``, ``virt.next_host``) only needs the node's totals,
what running VMs use, free disk and each VM's anti-affinity group. This answers that with:

* one ``getInfo``, one ``listAllDomains``, one bulk ``domainListGetStats`` (state only: no QEMU
  monitor) and ``info()`` of each *running* VM (what it uses now, as :func:`saltvirt.host.query.host_info`);
* the group index: each VM's salt-virt ``<metadata>`` (one small ``metadata()`` call, not the XML),
  cached per host in a file keyed by domain UUID and name.

The cache is invalidated by a generation counter (:func:`bump`: salt-virt's own redefinitions and the
``virt_events`` engine on a ``defined`` event) and by age (``max_age`` seconds, for definitions edited
outside salt-virt without the engine running). A new UUID or a renamed domain is read at once, a
removed one dropped, so creations and deletions are always current.

The answer is shaped like ``full_info`` (``host`` + ``vm_info``) so the fleet code reads either, but
each ``vm_info`` entry holds only ``group``, ``state``, ``cpu`` and ``mem`` (MiB, of the definition);
``host["groups"]`` is the same index by group (``{group: [names]}``).

Pushed capacity (docs/topics/capacity.md): the ``virt_events`` engine keeps the master's copy current without
a question per ``virt.init``: :class:`Pusher` sends this answer, signed, when a VM changes and on a heartbeat.
Because a pushed copy may be stale, ``virt.init`` checks the room again on the host (:func:`overcommit`).
"""

import hashlib
import json
import logging
import math
import os
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import fsutil
from saltvirt.host import query
from saltvirt.host.conn import libvirt
from saltvirt.xml.domain.metadata import METADATA_NS

log = logging.getLogger(__name__)

MAX_AGE = 300  # seconds an entry is trusted without a generation bump (outside edits)
GENERATION = "generation"  # the counter's file name in the cache directory
_FORMAT = 1


def _group_from_metadata(dom):
    """The domain's anti-affinity group from its salt-virt ``<metadata>`` (None without one); falls
    back to the inactive XML for a driver without ``metadata()``."""
    try:
        text = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS, 0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == getattr(libvirt, "VIR_ERR_NO_DOMAIN_METADATA", 80):
            return None
        if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
            raise
        root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        return root.findtext(f"metadata/{{{METADATA_NS}}}vm/{{{METADATA_NS}}}group")
    root = ET.fromstring(text)
    for el in root.iter():  # libvirt hands the element back with or without its namespace
        if el.tag.rsplit("}", 1)[-1] == "group":
            return el.text
    return None


def _definition(dom):
    """``(vcpus, MiB)`` the definition gives the VM (what it uses once started)."""
    info = dom.info()
    return info[3], info[1] // 1024


def cache_dir(opts: dict | None) -> str | None:
    """Where a minion keeps its capacity index: ``<cachedir>/saltvirt`` (None without a cachedir)."""
    base = ({} if opts is None else opts).get("cachedir")
    return os.path.join(base, "saltvirt") if base else None


def generation(cache_dir: str | None) -> int:
    """The generation counter (0 when never bumped)."""
    if not cache_dir:
        return 0
    try:
        return os.stat(os.path.join(cache_dir, GENERATION)).st_mtime_ns
    except OSError:
        return 0


def bump(cache_dir: str | None) -> None:
    """Invalidate every cached capacity index under ``cache_dir`` (a definition changed in place)."""
    if not cache_dir:
        return
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        path = os.path.join(cache_dir, GENERATION)
        with open(path, "a"):
            pass
        now = time.time_ns()
        os.utime(path, ns=(now, max(now, generation(cache_dir) + 1)))
    except OSError as exc:  # a stale index costs a wrong group for MAX_AGE at most: say so, never fail the caller
        log.warning("virt.capacity: cannot bump the cache generation in %s: %s", cache_dir, exc)


def _cache_file(cache_dir, conn):
    key = hashlib.sha256(f"{conn.getURI()}\0{conn.getHostname()}".encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"capacity-{key}.json")


def _load(path, gen, now, max_age):
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != _FORMAT
        or data.get("generation") != gen
        or not isinstance(data.get("vms"), dict)
        or not 0 <= now - float(data.get("built", 0)) <= max_age
    ):
        return {}
    return data


def _save(path, gen, built, vms):
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        body = json.dumps({"format": _FORMAT, "generation": gen, "built": built, "vms": vms}).encode()
        fsutil.atomic_write(path, body, 0o600)
    except OSError as exc:
        log.warning("virt.capacity: cannot write its cache %s: %s", path, exc)


def _index(conn, doms, cache_dir, max_age):
    """``{uuid: {name, group, cpu, mem}}`` of ``doms``, from the cache where it is current; and whether
    the cache was used (``hit``: every domain known, ``partial``, ``cold``)."""
    now = time.time()
    gen = generation(cache_dir) if cache_dir else 0
    path = _cache_file(cache_dir, conn) if cache_dir else None
    cached = _load(path, gen, now, max_age) if path else {}
    known = cached.get("vms") or {}
    out, read = {}, 0
    for dom in doms:
        uuid = dom.UUIDString()
        name = dom.name()
        entry = known.get(uuid)
        if not entry or entry.get("name") != name:
            try:
                cpu, mem = _definition(dom)
                entry = {"name": name, "group": _group_from_metadata(dom), "cpu": cpu, "mem": mem}
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue  # undefined while we looked
                raise
            read += 1
        out[uuid] = entry
    if path and (read or set(known) != set(out)):
        _save(path, gen, cached.get("built", now) if cached else now, out)
    state = "cold" if not cached else ("hit" if not read else "partial")
    return out, state


def _groups(vms):
    """The anti-affinity index: ``{group: [VM names]}`` (placement's group check is one lookup)."""
    out: dict[str, list[str]] = {}
    for name in sorted(vms):
        if vms[name]["group"]:
            out.setdefault(vms[name]["group"], []).append(name)
    return out


def capacity(
    conn: "libvirt.virConnect", images_dir: str | None = None, cache_dir: str | None = None, max_age: float = MAX_AGE
) -> dict:
    """Node totals, what running VMs use, what all defined VMs would use, free disk in ``images_dir``,
    and ``vm_info``: ``{name: {group, state, cpu, mem}}`` (the group index). See the module doc."""
    node = query.node_info(conn)
    doms = conn.listAllDomains(0)
    running = {d.UUIDString() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)}
    try:
        want = libvirt.VIR_DOMAIN_STATS_STATE  # no QEMU monitor involved
        states = {d.UUIDString(): s.get("state.state") for d, s in conn.domainListGetStats(doms, want)} if doms else {}
    except libvirt.libvirtError:
        states = {}
    index, cache = _index(conn, doms, cache_dir, max_age)
    used_mem = used_cpu = active = 0
    vms = {}
    for dom in doms:
        uuid = dom.UUIDString()
        entry = index.get(uuid)
        if entry is None:
            continue
        code = states.get(uuid)
        try:
            if code is None:
                code = dom.state()[0]
            if uuid in running:  # as host_info counts: every active VM holds its resources
                info = dom.info()  # what it has now (ballooned memory, hot-plugged vCPUs)
                used_mem += info[2] // 1024
                used_cpu += info[3]
                active += 1
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
            continue
        vms[entry["name"]] = {
            "group": entry["group"],
            "state": query.state_name(code),
            "cpu": entry["cpu"],
            "mem": entry["mem"],
        }
    host = {
        "hostname": conn.getHostname(),
        "uri": conn.getURI(),
        "hypervisor": conn.getType(),
        "node": node,
        "mem_total": node["phymemory"],
        "mem_used_by_vms": used_mem,
        "vcpus_total": node["cpus"],
        "vcpus_used_by_vms": used_cpu,
        "mem_defined": sum(v["mem"] for v in vms.values()),
        "vcpus_defined": sum(v["cpu"] for v in vms.values()),
        "vms_active": active,
        "vms_defined": len(vms),
        "groups": _groups(vms),
        "cache": cache,
    }
    if images_dir:
        host.update(images_dir=images_dir, disk_free=query.free_mib(images_dir))
    return {"host": host, "vm_info": vms}


# the host's own check of the room a new VM takes --------------------------------------------------------
NEED_KEYS = ("cpu", "mem", "disk_mib", "mem_reserve_mib", "cpu_overcommit", "disk_reserve_mib")


def _need(need):
    out = {}
    for key in NEED_KEYS:
        try:
            value = float((need or {}).get(key) or 0)
        except (TypeError, ValueError):
            value = math.nan
        if math.isnan(value) or value < 0:
            raise SaltInvocationError(f"capacity check: {key} must be a number >= 0, not {need.get(key)!r}")
        out[key] = value
    return out


def overcommit(conn: "libvirt.virConnect", need: dict, images_dir: str | None = None) -> list[str]:
    """Why this host cannot take a new VM of ``need`` now (empty: it can), with placement's rules
    (``saltvirt.fleet.placement``) on what the host holds at this moment, not on the master's copy:
    ``need`` is ``{cpu, mem (MiB), disk_mib, mem_reserve_mib, cpu_overcommit, disk_reserve_mib}``
    (the master's ``virt:placement`` policy)."""
    need = _need(need)
    node = query.node_info(conn)
    used_mem = used_cpu = 0
    for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
        try:
            info = dom.info()  # what it holds now, as capacity() counts it
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
            continue
        used_mem += info[2] // 1024
        used_cpu += info[3]
    reasons = []
    mem_free = node["phymemory"] - used_mem - need["mem_reserve_mib"]
    if need["mem"] > mem_free:
        reasons.append(
            f"memory: needs {need['mem']:g} MiB, {max(mem_free, 0):g} MiB free now ({node['phymemory']} total - "
            f"{used_mem} used by running VMs - {need['mem_reserve_mib']:g} reserve)"
        )
    cap = node["cpus"] * (need["cpu_overcommit"] or 1.0)
    if used_cpu + need["cpu"] > cap:
        reasons.append(f"vcpus: needs {need['cpu']:g}, {max(cap - used_cpu, 0):g} left now ({used_cpu} running)")
    if images_dir and need["disk_mib"]:
        disk_free = query.free_mib(images_dir) - need["disk_reserve_mib"]
        if need["disk_mib"] > disk_free:
            reasons.append(f"disk: needs {need['disk_mib']:g} MiB in {images_dir}, {max(disk_free, 0):g} MiB free now")
    return reasons


# pushing this answer to the master ----------------------------------------------------------------------
PUSH_EVERY = 30.0  # seconds between two pushes without a change (the heartbeat; the master's max_age is 90)
PUSH_GAP = 1.0  # at most one push per this many seconds: a burst of events is one push


class Pusher:
    """Calls ``push()`` (``virt.push_capacity``: the signed answer into the master's mine) from a thread of its
    own: at once after :meth:`changed` (a VM started, stopped, was defined or undefined; a burst of them
    coalesced into one push per :data:`PUSH_GAP`), and every ``every`` seconds without a change. A push never
    blocks the events engine (Salt's ``mine.send`` waits 0.5 s) and a failed one is logged and retried."""

    def __init__(self, push: Callable[[], Any], every: float = PUSH_EVERY, gap: float = PUSH_GAP) -> None:
        self.push, self.every, self.gap = push, every, gap
        self.wake, self.stop = threading.Event(), threading.Event()
        self.pushes = 0
        self.thread = threading.Thread(target=self._loop, name="virt-capacity-push", daemon=True)

    def start(self) -> "Pusher":
        self.thread.start()
        return self

    def changed(self, *_args: Any, **_kwargs: Any) -> None:
        """What this host holds changed: push soon (any arguments, so it serves as an event callback)."""
        self.wake.set()

    def _loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.wake.clear()
            try:
                self.push()
                self.pushes += 1
            except Exception as exc:  # noqa: BLE001 - the next change or beat tries again; the master asks meanwhile
                log.warning("virt_events: could not push this host's capacity to the master: %s", exc)
            self.stop.wait(max(self.gap - (time.monotonic() - started), 0))
            self.wake.wait(self.every)
