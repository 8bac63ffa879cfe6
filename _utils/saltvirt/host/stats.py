"""Per-VM counters in the shapes of Salt's ``virt.vm_cputime``, ``virt.vm_netstats`` and
``virt.vm_diskstats`` (totals over the VM's devices, per VM name), and one sample of them all for
``salt-run virt.query rates=True`` (the master makes rates of two: :mod:`saltvirt.fleet.vmrates`). Device
names come from :func:`saltvirt.xml.domain.definition.parse`. And how long running VMs have run (:func:`uptimes`)."""

import time
import urllib.parse

from salt.exceptions import CommandExecutionError

from saltvirt.base import procs
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import get_domain, libvirt, lv_errors
from saltvirt.xml.domain import definition

NET_KEYS = ("rx_bytes", "rx_packets", "rx_errs", "rx_drop", "tx_bytes", "tx_packets", "tx_errs", "tx_drop")
DISK_KEYS = ("rd_req", "rd_bytes", "wr_req", "wr_bytes", "errs")


def _domains(conn, name=None, active_only=False):
    if name:
        return [get_domain(conn, name)]
    flags = libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE if active_only else 0
    with lv_errors("list VMs"):
        return sorted(conn.listAllDomains(flags), key=lambda d: d.name())


def cputime(conn: Conn, name: str | None = None) -> dict[str, Data]:
    """``{vm: {cputime: ns, cputime_percent: int, vcpus: n}}`` (percent of the VM's vCPUs since boot, as Salt)."""
    host_cpus = conn.getInfo()[2]
    out = {}
    for dom in _domains(conn, name):
        state, _max, _mem, vcpus, cpu_ns = dom.info()
        percent = (1.0e-7 * cpu_ns / host_cpus) / vcpus if cpu_ns and vcpus else 0
        out[dom.name()] = {"cputime": int(cpu_ns), "cputime_percent": int(f"{percent:.0f}"), "vcpus": vcpus}
    return out


def _sum_devices(dom, devices, call, keys):
    total = dict.fromkeys(keys, 0)
    per_device = {}
    for dev in devices:
        try:
            values = call(dev)
        except libvirt.libvirtError as exc:
            raise CommandExecutionError(
                f"statistics of {dev} of VM {dom.name()!r}: {exc.get_error_message()}"
            ) from None
        row = {k: max(int(v), 0) for k, v in zip(keys, values, strict=False)}
        per_device[dev] = row
        for key in keys:
            total[key] += row.get(key, 0)
    return total, per_device


def netstats(conn: Conn, name: str | None = None) -> dict[str, Data]:
    """``{vm: {rx_bytes, rx_packets, rx_errs, rx_drop, tx_bytes, ...}}`` summed over the VM's NICs
    (running VMs; an inactive VM has zeros), plus ``devices`` with the per-NIC counters."""
    out = {}
    for dom in _domains(conn, name):
        if not dom.isActive():
            out[dom.name()] = {**dict.fromkeys(NET_KEYS, 0), "devices": {}}
            continue
        devs = [n["target"] for n in definition.parse(dom.XMLDesc(0))["nics"] if n.get("target")]
        total, per = _sum_devices(dom, devs, dom.interfaceStats, NET_KEYS)
        out[dom.name()] = dict(total, devices=per)
    return out


def diskstats(conn: Conn, name: str | None = None) -> dict[str, Data]:
    """``{vm: {rd_req, rd_bytes, wr_req, wr_bytes, errs}}`` summed over the VM's disks (running VMs
    only, as Salt: libvirt has no block statistics for a stopped VM), plus ``devices``."""
    out = {}
    for dom in _domains(conn, name, active_only=not name):
        if not dom.isActive():
            raise CommandExecutionError(f"VM {dom.name()!r} is not running: libvirt has no disk statistics for it")
        # an empty cdrom drive has no statistics: only disks with media
        devs = [d["target"] for d in definition.parse(dom.XMLDesc(0))["disks"] if d.get("target") and d.get("file")]
        total, per = _sum_devices(dom, devs, dom.blockStats, DISK_KEYS)
        out[dom.name()] = dict(total, devices=per)
    return out


def sample(conn: Conn) -> Data:
    """One sample of every running VM's counters, with the monotonic time it was taken."""
    active = {d.name() for d in _domains(conn, active_only=True)}
    cpu = {k: v for k, v in cputime(conn).items() if k in active}
    return {"at": time.monotonic(), "cpu": cpu, "net": netstats(conn) if active else {}, "disk": diskstats(conn)}


def uptimes(conn: Conn, uuids: list[str]) -> dict[str, int]:
    """``{uuid: seconds}`` since the QEMU process of each running VM ``uuids`` names started: libvirt keeps no
    start time, so it is the process's own (:func:`saltvirt.base.procs.started_at`), found by the ``-uuid`` libvirt
    passes QEMU. One pass over this host's processes for all of them. Only for a libvirtd on this machine (a URI
    with no host): for a remote one, this machine's processes say nothing, and ``{}`` is returned. A VM whose
    process is not found (another hypervisor driver, a race with its start or stop) is left out."""
    if urllib.parse.urlsplit(conn.getURI()).netloc or not uuids:
        return {}
    want, now, out = {u.lower() for u in uuids}, time.time(), {}
    for pid, args in procs.cmdlines():
        uuid = args[args.index("-uuid") + 1].lower() if "-uuid" in args[:-1] else None
        if uuid in want and (started := procs.started_at(pid)) is not None:
            out[uuid] = max(0, int(now - started))
    return out
