"""Guest IP addresses per NIC (matched by MAC), each labelled with where it came from.

Sources, cheapest first, only for running VMs, each at most once per VM per query:

``lease`` (per network)
    the DHCP leases of libvirt's own networks, one call per network for all its VMs (libvirtd reads
    its lease file); drivers without it are asked per VM after the agent (below).
``agent``
    the QEMU guest agent inside the guest (``virt.init`` adds its channel: ``saltvirt.xml.domain.devices``); asked
    only when libvirt does not report the channel as disconnected. The calls of one query run in a few
    threads under one time budget (:data:`AGENT_TIMEOUT`), so agents that do not answer cost that budget
    once, not once each.
``lease``
    per VM, where the network-wide call is not supported (NICs of type ``network`` still without an address).
``arp``
    the fallback: the hypervisor's neighbour table (NICs of type ``bridge``/``network`` still without an
    address): only guests the hypervisor has exchanged packets with. Once it fails for the host (libvirt
    9.0 on some kernels: "wrong nlmsg len") it is skipped for the rest of the query.

Lease and ARP lookups of one query run in :data:`LOOKUP_WORKERS` threads (one libvirt call each, in
parallel); a source that fails for the whole host is asked once per query, not once per VM.

The agent's and ARP's answers are guest-controlled: a guest can claim any address. They are shown
labelled by source, never used to decide anything; only well-formed addresses are kept (loopback,
link-local, multicast and unspecified ones are dropped), at most :data:`MAX_PER_NIC` per NIC.
"""

import ipaddress
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from saltvirt.base import validate
from saltvirt.base.salttypes import ConfigGet, Conn, Data, Domain
from saltvirt.host.conn import libvirt

log = logging.getLogger(__name__)

AGENT_TIMEOUT = 2.0  # seconds for all the guest agent calls of one query together
AGENT_WORKERS = 8
LOOKUP_WORKERS = 4  # lease/ARP lookups of one query in parallel: a few libvirtd workers, not all of them
MAX_PER_NIC = 16
SOURCES = ("agent", "lease", "arp")
_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_ARP_TYPES = ("bridge", "network")


def agent_timeout(get: ConfigGet) -> float:
    """``virt:guest_agent_timeout`` (``get``: the minion config's): seconds the guest agent calls of one query, or
    of one ``test.ping`` of a VM resource, may take together."""
    return validate.seconds(get("virt:guest_agent_timeout", AGENT_TIMEOUT), "virt:guest_agent_timeout", 60)


def _flag(source):
    return {
        "agent": libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        "lease": libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        "arp": libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
    }[source]


def _address(raw, source):
    """One entry of libvirt's ``addrs`` list -> ``{address, prefix, type, source}``, or None when it is
    not a usable, well-formed address."""
    if not isinstance(raw, dict) or not isinstance(raw.get("addr"), str):
        return None
    try:
        addr = ipaddress.ip_address(raw["addr"].strip())
    except ValueError:
        return None
    if addr.is_loopback or addr.is_link_local or addr.is_multicast or addr.is_unspecified:
        return None
    prefix = raw.get("prefix")
    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix <= addr.max_prefixlen:
        prefix = None
    return {"address": str(addr), "prefix": prefix, "type": f"ipv{addr.version}", "source": source}


def clean(raw: Any, source: str) -> dict[str, list[Data]]:
    """libvirt's ``interfaceAddresses`` answer -> ``{mac: [address, ...]}`` (MACs lower case), keeping only
    well-formed entries (see the module docstring): the answer may come from the guest."""
    out: dict[str, list[Data]] = {}
    if not isinstance(raw, dict):
        return out
    for iface in raw.values():
        if not isinstance(iface, dict) or not isinstance(iface.get("hwaddr"), str):
            continue
        mac = iface["hwaddr"].strip().lower()
        if not _MAC_RE.fullmatch(mac):
            continue
        for entry in iface.get("addrs") or []:
            ip = _address(entry, source)
            found = out.setdefault(mac, [])
            if ip and ip not in found and len(found) < MAX_PER_NIC:
                found.append(ip)
    return {mac: ips for mac, ips in out.items() if ips}


def _host_wide(exc):
    """True for an error of the source itself (not of this VM): not worth asking again for the next VM."""
    codes = ("VIR_ERR_INTERNAL_ERROR", "VIR_ERR_NO_SUPPORT", "VIR_ERR_OPERATION_UNSUPPORTED")
    return exc.get_error_code() in {getattr(libvirt, c) for c in codes}


def ask(dom: Domain, source: str) -> tuple[dict[str, list[Data]], str | None, bool]:
    """``(found, note, host_wide)`` from one source for one VM: ``{mac: [address]}``; ``note`` says why it
    gave nothing; ``host_wide``: the source itself failed (libvirt 9.0's ARP source fails on some kernels
    with "wrong nlmsg len", for example), so it is not asked for the other VMs of this query."""
    try:
        return clean(dom.interfaceAddresses(_flag(source)), source), None, False
    except libvirt.libvirtError as exc:
        return {}, f"{source}: {exc.get_error_message()}", _host_wide(exc)


def in_threads(
    items: Mapping[Any, Any], fn: Callable[[Any], Any], workers: int, timeout: float | None = None
) -> dict[Any, Any]:
    """``{key: fn(value)}`` for ``items`` ({key: value}), run in up to ``workers`` daemon threads (libvirt
    calls release the GIL and one connection carries concurrent calls). With ``timeout`` (seconds), keys
    not done by then are left out: their calls may finish in the background but never hold up the caller
    or the job. An exception of ``fn`` leaves its key out too (and is logged)."""
    if len(items) <= 1 and timeout is None:
        return {key: fn(value) for key, value in items.items()}
    todo, results, stop = queue.SimpleQueue(), {}, threading.Event()  # type: queue.SimpleQueue[Any], dict[Any, Any], threading.Event
    for item in items.items():
        todo.put(item)

    def work():
        while not stop.is_set():
            try:
                key, value = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[key] = fn(value)
            except Exception:
                log.exception("guest IP lookup of %s failed", key)

    threads = [threading.Thread(target=work, daemon=True, name="saltvirt-ips") for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    stop.set()
    return dict(results)


def ask_agents(doms: Mapping[str, Domain], timeout: float = AGENT_TIMEOUT) -> dict[str, tuple[Any, Any, Any]]:
    """``{name: (found, note, host_wide)}``: the guest agents of ``doms`` ({name: dom}), asked in a few
    threads under one budget; a VM whose agent has not answered when ``timeout`` seconds are up gets a
    note instead."""
    answers = in_threads(doms, lambda dom: ask(dom, "agent"), AGENT_WORKERS, timeout)
    late: tuple[Any, Any, Any] = ({}, f"agent: no answer within {timeout:g} s", False)
    return {name: answers.get(name, late) for name in doms}


def _wants_agent(info):
    return info.get("guest_agent") in ("connected", "unknown")


def _missing(nics, found, types):
    """The NICs of one of ``types`` (None: any) that no source has given an address yet."""
    return [
        n
        for n in nics.values()
        if (types is None or n.get("type") in types) and not found.get((n.get("mac") or "").lower())
    ]


def _lookup(dom, nics, agent_answer, failed, known=None):
    """Addresses of one running VM's NICs: ``known`` (network leases), the agent's answer, then leases
    per VM, then ARP for what is missing. ``failed``: {source: note} of sources not to ask per VM in
    this query (they failed host-wide: note repeated; None: already answered network-wide)."""
    found, notes = dict(known or {}), []
    for mac, ips in (agent_answer[0] if agent_answer else {}).items():
        found.setdefault(mac, ips)
    if agent_answer and agent_answer[1] and _missing(nics, found, None):
        notes.append(agent_answer[1])
    for source, types in (("lease", ("network",)), ("arp", _ARP_TYPES)):
        if not _missing(nics, found, types):
            continue
        if source in failed:
            if failed[source]:
                notes.append(failed[source])
            continue
        more, note, host_wide = ask(dom, source)
        for mac, ips in more.items():
            found.setdefault(mac, ips)
        if note:
            notes.append(note)
            if host_wide:
                failed[source] = note
    return found, notes


def network_leases(conn: "libvirt.virConnect", networks: set) -> tuple[dict, bool]:
    """``({mac: [address]}, supported)`` from the DHCP leases of libvirt ``networks`` (one call each);
    ``supported`` is False when the driver has no network-wide lease call (then ask per VM)."""
    found: dict[str, list] = {}
    for net in sorted(networks):
        try:
            leases = conn.networkLookupByName(net).DHCPLeases()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_OPERATION_UNSUPPORTED):
                return {}, False
            log.debug("guest IPs: leases of network %s: %s", net, exc.get_error_message())
            continue  # its VMs' addresses come from their agents or ARP
        raw = {
            str(i): {
                "hwaddr": lease.get("mac"),
                "addrs": [{"addr": lease.get("ipaddr"), "prefix": lease.get("prefix")}],
            }
            for i, lease in enumerate(leases or [])
            if isinstance(lease, dict)
        }
        for mac, ips in clean(raw, "lease").items():
            mine = found.setdefault(mac, [])
            mine.extend(ip for ip in ips if ip not in mine and len(mine) < MAX_PER_NIC)
    return found, True


def _found_in(nics, leases):
    """The part of ``leases`` ({mac: ips}) that belongs to ``nics``."""
    macs = {(n.get("mac") or "").lower() for n in nics.values()}
    return {mac: ips for mac, ips in leases.items() if mac in macs}


def _network_of(nic: dict[str, Any]) -> str | None:
    """The libvirt network a vm_info NIC is on (Salt's shape: ``source: {network: ...}``), or None."""
    if nic.get("type") != "network":
        return None
    source = nic.get("source")
    return source.get("network") if isinstance(source, dict) else source or None


def annotate(
    doms: Mapping[str, Domain], infos: dict[str, Data], agent_timeout: float = AGENT_TIMEOUT, conn: Conn = None
) -> dict[str, Data]:
    """Give every NIC of every VM in ``infos`` ({name: vm_info entry}) its ``ips``; ``doms``: {name: dom}.
    Only running VMs are asked; a source that failed is named in the VM's ``ips_note``. With ``conn``,
    libvirt's networks are asked for their leases first (one call per network, not one per VM)."""
    running = {}
    for name, info in infos.items():
        for nic in (info.get("nics") or {}).values():
            nic["ips"] = []
        if info.get("state") == "running" and info.get("nics") and name in doms:
            running[name] = info
    leases, bulk = {}, False  # type: dict[str, Any], bool
    networks = {_network_of(nic) for info in running.values() for nic in info["nics"].values() if _network_of(nic)}
    if conn is not None and networks:
        leases, bulk = network_leases(conn, networks)
    known = {name: _found_in(running[name]["nics"], leases) for name in running}
    ask_agent = {
        n: doms[n] for n, info in running.items() if _wants_agent(info) and _missing(info["nics"], known[n], None)
    }
    agents = ask_agents(ask_agent, agent_timeout)
    failed = {"lease": None} if bulk else {}  # sources not to ask per VM (None: answered network-wide)

    def lookup(name):
        return _lookup(doms[name], running[name]["nics"], agents.get(name), failed, known[name])

    looked = in_threads({name: name for name in running}, lookup, LOOKUP_WORKERS)
    for name, info in running.items():
        found, notes = looked.get(name, ({}, ["the address lookup failed (see the minion log)"]))
        for nic in info["nics"].values():
            nic["ips"] = found.get((nic.get("mac") or "").lower(), [])
        if notes:
            info["ips_note"] = "; ".join(notes)
    return infos
