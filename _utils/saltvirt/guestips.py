"""Guest IP addresses per NIC (matched by MAC), each labelled with where it came from.

Sources, asked in this order and only for running VMs, each at most once per VM per query:

``agent``
    the QEMU guest agent inside the guest (``virt.init`` adds its channel, see ``domxml``); asked only
    when libvirt does not report the channel as disconnected. The calls of one query run in a few
    threads under one time budget (:data:`AGENT_TIMEOUT`), so agents that do not answer cost that budget
    once, not once each.
``lease``
    the DHCP leases of libvirt's own networks (NICs of type ``network`` still without an address).
``arp``
    the hypervisor's neighbour table (NICs of type ``bridge``/``network`` still without an address):
    only guests the hypervisor has exchanged packets with.

The agent's and ARP's answers are guest-controlled: a guest can claim any address. They are shown
labelled by source, never used to decide anything; only well-formed addresses are kept (loopback,
link-local, multicast and unspecified ones are dropped), at most :data:`MAX_PER_NIC` per NIC.
"""

import ipaddress
import queue
import re
import threading
import time

from saltvirt.conn import libvirt

AGENT_TIMEOUT = 2.0  # seconds for all the guest agent calls of one query together
AGENT_WORKERS = 8
MAX_PER_NIC = 16
SOURCES = ("agent", "lease", "arp")
_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_ARP_TYPES = ("bridge", "network")


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


def clean(raw, source):
    """libvirt's ``interfaceAddresses`` answer -> ``{mac: [address, ...]}`` (MACs lower case), keeping only
    well-formed entries (see the module docstring): the answer may come from the guest."""
    out = {}
    if not isinstance(raw, dict):
        return out
    for iface in raw.values():
        if not isinstance(iface, dict) or not isinstance(iface.get("hwaddr"), str):
            continue
        mac = iface["hwaddr"].strip().lower()
        if not _MAC_RE.match(mac):
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


def ask(dom, source):
    """``(found, note, host_wide)`` from one source for one VM: ``{mac: [address]}``; ``note`` says why it
    gave nothing; ``host_wide``: the source itself failed (libvirt 9.0's ARP source fails on some kernels
    with "wrong nlmsg len", for example), so it is not asked for the other VMs of this query."""
    try:
        return clean(dom.interfaceAddresses(_flag(source)), source), None, False
    except libvirt.libvirtError as exc:
        return {}, f"{source}: {exc.get_error_message()}", _host_wide(exc)


def ask_agents(doms, timeout=AGENT_TIMEOUT):
    """``{name: (found, note, host_wide)}``: the guest agents of ``doms`` ({name: dom}), asked in a few daemon threads;
    a VM whose agent has not answered when ``timeout`` seconds are up gets a note instead (its call may
    still finish in the background: it never holds up this query or the job)."""
    if not doms:
        return {}
    todo, results, stop = queue.SimpleQueue(), {}, threading.Event()
    for item in doms.items():
        todo.put(item)

    def work():
        while not stop.is_set():
            try:
                name, dom = todo.get_nowait()
            except queue.Empty:
                return
            results[name] = ask(dom, "agent")

    threads = [threading.Thread(target=work, daemon=True, name="saltvirt-agent") for _ in range(AGENT_WORKERS)]
    for thread in threads[: len(doms)]:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads[: len(doms)]:
        thread.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    late = ({}, f"agent: no answer within {timeout:g} s", False)
    return {name: results.get(name, late) for name in doms}


def _wants_agent(info):
    return info.get("guest_agent") in ("connected", "unknown")


def _missing(nics, found, types):
    """The NICs of one of ``types`` that no source has given an address yet."""
    return [n for n in nics.values() if n.get("type") in types and not found.get((n.get("mac") or "").lower())]


def _lookup(dom, nics, agent_answer, failed):
    """Addresses of one running VM's NICs: the agent's answer, then leases, then ARP for what is missing.
    ``failed``: {source: note} of sources that failed host-wide in this query (skipped, note repeated)."""
    found, notes = dict(agent_answer[0]) if agent_answer else {}, []
    if agent_answer and agent_answer[1]:
        notes.append(agent_answer[1])
    for source, types in (("lease", ("network",)), ("arp", _ARP_TYPES)):
        if not _missing(nics, found, types):
            continue
        if source in failed:
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


def annotate(doms, infos, agent_timeout=AGENT_TIMEOUT):
    """Give every NIC of every VM in ``infos`` ({name: vm_info entry}) its ``ips``; ``doms``: {name: dom}.
    Only running VMs are asked; a source that failed is named in the VM's ``ips_note``."""
    running = {}
    for name, info in infos.items():
        for nic in (info.get("nics") or {}).values():
            nic["ips"] = []
        if info.get("state") == "running" and info.get("nics") and name in doms:
            running[name] = info
    agents = ask_agents({n: doms[n] for n, info in running.items() if _wants_agent(info)}, agent_timeout)
    failed = {}
    for name, info in running.items():
        try:
            found, notes = _lookup(doms[name], info["nics"], agents.get(name), failed)
        except libvirt.libvirtError as exc:  # e.g. stopped meanwhile: the rest of its entry still stands
            found, notes = {}, [exc.get_error_message()]
        for nic in info["nics"].values():
            nic["ips"] = found.get((nic.get("mac") or "").lower(), [])
        if notes:
            info["ips_note"] = "; ".join(notes)
    return infos
