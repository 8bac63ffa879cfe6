"""
Human-readable output for the ``virt`` runner (``salt-run virt.query``, ``virt.list``,
``virt.host_info``, ``virt.vm_info``, ``virt.next_host``, ``virt.init``, the VM actions and their
errors). ``virt.query``::

    hyper1  up  (hv1: 2/8 vCPUs, 512/24103 MiB used by running VMs, 81234 MiB free in /srv/salt-images)
      centos1
        CPU: 2
        Memory: 512 MiB
        State: running
        Graphics: vnc - hyper1:5900
        Disk - vda:
          Size: 2.0G (allocated 1.1G)
          File: /srv/salt-images/centos1/system.qcow2
          File Format: qcow2
        NIC - 52:54:00:3e:5f:01:
          Source: br0
          Type: bridge
          IP: 192.168.122.10/24 (lease)
    hyper2  down  (did not answer (waited 5 s + 5 s job check))

``--out=json`` (or yaml) prints the same answer as plain data instead.

A NIC's ``IP`` lines name their source (``agent``: the guest agent, ``lease``: libvirt's DHCP, ``arp``: the
hypervisor's neighbour table): agent and ARP addresses are what the guest claims. Anything that is not a
well-formed address is printed escaped, never as it came.
"""

import ipaddress

__virtualname__ = "virt_query"


def __virtual__():
    return __virtualname__


def _size(num):
    if num in (None, ""):
        return "unknown"
    num = float(num)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(num) < 1024 or unit == "T":
            return f"{num:.0f}{unit}" if unit == "B" else f"{num:.1f}{unit}"
        num /= 1024
    return str(num)


def _dump(data, indent):
    try:
        import salt.utils.yaml

        text = salt.utils.yaml.safe_dump(data, default_flow_style=False).rstrip()
    except Exception:  # noqa: BLE001 - plain repr is better than no output
        text = repr(data)
    return [" " * indent + line for line in text.splitlines()]


def _host_line(mid, ans):
    status = ans.get("status", "up")
    if status != "up":
        return f"{mid}  {status}  ({ans.get('error') or 'no answer'})"
    h = ans.get("host") or {}
    if not h:
        return f"{mid}  up"
    parts = [
        f"{h.get('vcpus_used_by_vms', '?')}/{h.get('vcpus_total', '?')} vCPUs",
        f"{h.get('mem_used_by_vms', '?')}/{h.get('mem_total', '?')} MiB used by running VMs",
    ]
    if h.get("disk_free") is not None:
        parts.append(f"{h['disk_free']} MiB free in {h.get('images_dir', 'virt:images')}")
    maint = f"  in maintenance ({_printable(ans['maintenance'])})" if ans.get("maintenance") else ""
    return f"{mid}  up{maint}  ({h.get('hostname', mid)}: {', '.join(parts)})"


def _printable(value):
    """``value`` as text with control and non-ASCII characters escaped (data a guest may have shaped)."""
    text = str(value)
    return text if text.isascii() and text.isprintable() else ascii(text)[1:-1]


def _ip_line(ip):
    """``address/prefix (source)`` of one guest address; a malformed one is shown escaped and marked."""
    if not isinstance(ip, dict):
        return f"      IP: {_printable(ip)} (malformed)"
    try:
        address = str(ipaddress.ip_address(str(ip.get("address"))))
    except ValueError:
        return f"      IP: {_printable(ip.get('address'))} (malformed, {_printable(ip.get('source'))})"
    prefix = ip.get("prefix")
    where = f"{address}/{prefix}" if isinstance(prefix, int) and not isinstance(prefix, bool) else address
    return f"      IP: {where} ({_printable(ip.get('source') or '?')})"


def _rates_line(rate):
    parts = [f"cpu {rate.get('cpu_percent', 0)}%"]
    if "rd_bytes_per_s" in rate:
        parts.append(f"disk read {_size(rate['rd_bytes_per_s'])}/s, write {_size(rate['wr_bytes_per_s'])}/s")
    if "rx_bytes_per_s" in rate:
        parts.append(f"net in {_size(rate['rx_bytes_per_s'])}/s, out {_size(rate['tx_bytes_per_s'])}/s")
    return f"    Rates: {', '.join(parts)}"


def _nic_source(nic):
    source = nic.get("source_name") or nic.get("source") or "-"
    if isinstance(source, dict):  # Salt's shape: {network: ...} / {bridge: ...}
        source = ", ".join(f"{k}={v}" for k, v in sorted(source.items())) or "-"
    return source


def _recorded(vm):
    """The lines of what virt.init recorded in the VM's <metadata>: its group, the image it came from (a catalog
    name or a source: a caller's text, printed escaped)."""
    out = [f"    Group: {vm['group']}"] if vm.get("group") else []
    return out + ([f"    Image: {_printable(vm['image'])}"] if vm.get("image") else [])


def _vm(mid, name, vm):
    out = [f"  {name}"]
    if vm.get("error"):
        out.append(f"    Error: {vm['error']}")
    if vm.get("cpu") is not None:
        out.append(f"    CPU: {vm['cpu']}")
    if vm.get("mem") is not None:
        out.append(f"    Memory: {vm['mem']} MiB")
    if vm.get("state"):
        out.append(f"    State: {vm['state']}")
    out.extend(_recorded(vm))
    gfx = vm.get("graphics")
    if gfx and gfx.get("type") not in (None, "None"):  # Salt's shape: a headless VM's type is "None"
        port = gfx.get("port")
        where = gfx.get("address") or (f"{mid}:{port}" if str(port) not in ("None", "-1") else "not listening")
        local = gfx.get("listen") in ("127.0.0.1", "::1", "localhost")
        out.append(f"    Graphics: {gfx.get('type', '?')} - {where}" + (f" (loopback of {mid})" if local else ""))
        if gfx.get("tunnel"):
            out.append(f"      Reach it: {gfx['tunnel']}  then connect to localhost:{gfx['port']}")
    if vm.get("rates"):
        out.append(_rates_line(vm["rates"]))
    for target, disk in sorted((vm.get("disks") or {}).items()):
        out.append(f"    Disk - {target}:")
        size = _size(disk.get("virtual_size"))
        if disk.get("allocation") is not None:
            size += f" (allocated {_size(disk['allocation'])})"
        out.append(f"      Size: {size}")
        out.append(f"      File: {disk.get('file') or '-'}")
        out.append(f"      File Format: {disk.get('format') or '-'}")
        if disk.get("backing_file"):
            out.append(f"      Backing File: {disk['backing_file']}")
    for mac, nic in sorted((vm.get("nics") or {}).items()):
        out.append(f"    NIC - {mac}:")
        out.append(f"      Source: {_nic_source(nic)}")
        out.append(f"      Type: {nic.get('type') or '-'}")
        if nic.get("model"):
            out.append(f"      Model: {nic['model']}")
        out.extend(_ip_line(ip) for ip in nic.get("ips") or [])
    unknown = [n for n in (vm.get("nics") or {}).values() if isinstance(n, dict) and not n.get("ips")]
    if vm.get("ips_note") and unknown:  # a source that failed while another answered is no news
        out.append(f"    IPs: unknown ({_short(_printable(vm['ips_note']))})")
    return out


def _short(text, limit=100):
    """One short line: ``text`` cut at ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _host_facts(h):
    node = h.get("node") or {}
    return [
        f"  Hypervisor: {h.get('hypervisor', '?')} on {h.get('hostname', '?')} ({node.get('cpumodel', '?')})",
        f"  CPUs: {h.get('vcpus_total', '?')} (vCPUs of running VMs: {h.get('vcpus_used_by_vms', '?')})",
        f"  Memory: {h.get('mem_total', '?')} MiB (running VMs: {h.get('mem_used_by_vms', '?')} MiB)",
        f"  VMs: {h.get('vms_active', '?')} running, {h.get('vms_defined', '?')} defined",
        f"  Images: {h.get('images_dir', '?')}, {h.get('disk_free', '?')} MiB free",
    ]


def _fleet(data):
    lines = []
    for mid in sorted(data):
        ans = data[mid] if isinstance(data[mid], dict) else {"status": "up", "vms": data[mid]}
        lines.append(_host_line(mid, ans))
        if ans.get("status", "up") != "up":
            continue
        if "vm_info" in ans:
            for name in sorted(ans["vm_info"] or {}):
                lines.extend(_vm(mid, name, ans["vm_info"][name] or {}))
        elif "vms" in ans:
            lines.extend(f"  {name}: {state}" for name, state in sorted((ans["vms"] or {}).items()))
        elif ans.get("host"):
            lines.extend(_host_facts(ans["host"]))
    return lines


def _placement(data):
    req = data.get("request") or {}
    lines = [f"Next host: {data.get('host') or 'none'}", f"  {data.get('reason', '')}"]
    need = f"{req.get('cpu')} vCPU(s), {req.get('mem')} MiB"
    if req.get("disk_mib"):
        need += f", {req['disk_mib']} MiB disk"
    if req.get("group"):
        need += f", anti-affinity group {req['group']!r}"
    lines.append(f"Request: {need}" + (f" ({req['disk_note']})" if req.get("disk_note") else ""))
    if data.get("ranking"):
        lines.append("Ranking:")
        width = max(len(r["host"]) for r in data["ranking"])
        for r in data["ranking"]:
            parts = " ".join(f"{k} {v:.2f}" for k, v in r["scores"].items())
            free = r.get("free_after") or {}
            lines.append(
                f"  {r.get('rank', '-'):>3}. {r['host']:<{width}}  {r['score']:.4f}  ({parts})  free after: "
                f"{free.get('mem_mib')} MiB, {free.get('vcpus')} vCPUs, {free.get('disk_mib')} MiB disk"
            )
        more = (data.get("fit") or 0) - len(data["ranking"])
        if more > 0:
            lines.append(f"  ... and {more} more host(s) that fit (only the best {len(data['ranking'])} are listed)")
    if data.get("excluded"):
        lines.append("Excluded:")
        for host, reasons in sorted(data["excluded"].items()):
            lines.append(f"  {host}: {'; '.join(reasons)}")
    return lines


def _created(data):
    lines = [f"{data['name']}: created on {data['host']} in {data.get('seconds', '?')} s (job {data.get('jid', '?')})"]
    placement = data.get("placement") or {}
    if placement.get("reason"):
        lines.append(f"  Placement: {placement['reason']}")
    for t in data.get("tried") or []:
        lines.append(f"  Not on {t['host']}: {t['outcome']}: {t.get('error')}")
    key = data.get("key")
    if key:
        lines.append(
            f"  Key: minion {key['minion_id']} {key['state']} on the master "
            f"(sha256 of minion.pub {key['fingerprint'][:16]}...)"
        )
    for warning in data.get("warnings") or []:
        lines.append(f"  WARNING: {warning}")
    seed = (data.get("init") or {}).get("seed")
    if seed:
        lines.append(f"  Seeded with: {seed.get('backend')}")
    if data.get("vm_info"):
        lines.extend(_vm(data["host"], data["name"], data["vm_info"]))
    if data.get("wait"):
        lines.extend(_waited(data["wait"]))
    return lines


def _waited(wait):
    """The lines of ``salt-run virt.init ... wait=ip|minion``."""
    if wait.get("result") == "ok" and wait.get("for") == "ip":
        lines = [f"  Waited {wait.get('seconds')} s for an address:"]
        for mac, ips in sorted((wait.get("ips") or {}).items()):
            lines.append(f"    NIC - {_printable(mac)}:")
            lines.extend("  " + _ip_line(ip) for ip in ips)
        return lines
    if wait.get("result") == "ok":
        return [f"  Waited {wait.get('seconds')} s: minion {wait.get('minion')} answered test.ping"]
    lines = [f"  WAIT {str(wait.get('result')).upper()}: {wait.get('message')}"]
    seen = wait.get("seen") or {}
    if seen:
        what = [f"state {seen['state']}"] if seen.get("state") else [_printable(seen.get("vm"))]
        addrs = [f"{ip.get('address')} ({ip.get('source')})" for ips in (seen.get("ips") or {}).values() for ip in ips]
        what.append(f"addresses: {', '.join(_printable(a) for a in addrs) or 'none'}")
        if wait.get("pings"):
            what.append(f"{wait['pings']} test.ping publication(s) unanswered")
        lines.append(f"    Seen: {'; '.join(what)}")
    return lines


def _action(data):
    lines = [f"{data['name']} on {data['host']}:"]
    lines.extend(_dump(data["result"], 2))
    if "key_deleted" in data:
        lines.append(f"  Key deleted on the master: {data['key_deleted'] or 'there was none'}")
    return lines


def output(data, **kwargs):  # pylint: disable=unused-argument
    """Render a ``virt`` runner answer (see the module docstring)."""
    if isinstance(data, dict) and set(data) == {"suffix", "event"}:  # salt-run progress lines
        event = data["event"] if isinstance(data["event"], dict) else {}
        return f"[{data['suffix']}] {event.get('message', event)}"
    if not isinstance(data, dict):
        return str(data)
    if "error" in data:
        details = {k: v for k, v in data.items() if k not in ("error", "retcode")}
        return "\n".join([f"ERROR: {data['error']}"] + (_dump(details, 2) if details else []))
    if "ranking" in data and "excluded" in data:
        return "\n".join(_placement(data))
    if {"name", "host", "vm_info", "key"} <= set(data):
        return "\n".join(_created(data))
    if {"name", "host", "result"} <= set(data):
        return "\n".join(_action(data))
    if all(isinstance(v, dict) and "status" in v for v in data.values()):
        return "\n".join(_fleet(data)) if data else "no hypervisors found (see virt:hypervisors in the master config)"
    return "\n".join(_dump(data, 0))
