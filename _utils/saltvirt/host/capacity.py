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
"""

import hashlib
import json
import logging
import os
import time
import xml.etree.ElementTree as ET

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
