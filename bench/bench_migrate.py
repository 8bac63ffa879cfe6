"""Live migration against its floor (issue 40): salt-virt's ``virt.migrate`` (the execution module through Salt's
loader, as a hypervisor minion runs it) vs raw libvirt-python ``migrateToURI3`` with the same flags and parameters,
on the same two namespaced libvirtd hypervisors (tests/support/lab.py), interleaved (raw, ours, ours, raw, ...: the
load hits both alike), each migration moving the VM to the other host.

Cells: shared storage (the disk on a directory both hosts see at the same path) and disk copy (copy_storage all:
the disk on the source's own directory, a blank image of the same size prepared on the target outside the timed
call, for both), each with an idle and a busy guest (dd in the guest copying 16 MiB of random data
into its buffer again and again: pages that are not zero, which QEMU would send as a header only).

Downtime is measured from the guest: its second serial port is a UDP chardev (QEMU sends what the guest writes to
the fabric's 10.252.0.1, from the source's QEMU, then from the target's; a datagram a character); the guest writes a
line every 10 ms; a receiver in the fabric's namespace keeps each datagram's kernel receive stamp. A migration's
downtime is the largest gap between two datagrams while it ran; the baseline is the largest gap in the same length of
time just before it (a TCG guest on a loaded host misses beats by itself). libvirt's own figure (the target's
completed job statistics) is shown too.

Both calls run in a worker process inside the source hypervisor's namespaces (its /etc/hosts names the target, its
network reaches it), so ours pays its real extra work (settings, checks, the watchdog, the target view).

    $VENV/bin/python bench/bench_migrate.py [--reps 3] [--quick] [--cells shared-idle,copy-busy] [--proof]
"""

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

sys.path.insert(0, str(common.ROOT))
sys.path.insert(0, str(common.ROOT / "_utils"))

INDEXES = (23, 24)  # lab indexes (a lab's namespaces carry its own tag)
PORT = 5999  # the receiver's UDP port in the fabric namespace
MEM_MIB = 128
CELLS = ("shared-idle", "shared-busy", "copy-idle", "copy-busy")
BEAT_S = 0.010
UNIT = "salt-virt-hb.service"
CAP_S = 240  # a raw migration still running then is aborted by the bench (raw libvirt has no bound of its own)
GOAL_RATIO, GOAL_DOWNTIME_MS = 1.05, 300
HOOK = """cat > /tmp/hb.sh <<'HB'
mkfifo /tmp/hbtick; exec 3<>/tmp/hbtick
n=0
while :; do echo "b $n"; n=$((n+1)); read -t 0.01 -u 3 _; done > /dev/ttyS1
HB
sh /tmp/hb.sh </dev/null >/dev/null 2>&1 &
if grep -q hb.busy /proc/cmdline; then
  dd if=/dev/urandom of=/tmp/noise bs=1M count=16 2>/dev/null  # not zeros: QEMU sends a zero page as a header
  D='while :; do dd if=/tmp/noise of=/dev/null bs=16M 2>/dev/null; done'
  sh -c "$D" </dev/null >/dev/null 2>&1 &
fi
echo "HB-FAST started"
"""


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# the guest's disk: the test image with a boot hook starting the 10 ms heartbeat -------------------------------------
def heartbeat_disk(guest_dir, out):
    """A standalone qcow2 of the test guest's disk whose ext4 holds a salt-virt-*.service unit the test guest's init
    runs at boot (scripts/build-guest.sh: BOOT-HOOK), starting the 10 ms heartbeat (and with ``hb.busy`` on the
    kernel command line the memory-dirtying loop)."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="hbdisk", dir=os.path.dirname(out)))
    raw, part = work / "disk.raw", work / "part.img"
    shutil.copyfile(guest_dir / "disk.raw", raw)
    start, sectors = 2048, 129024  # partition 1 of the test image (build-guest.sh: sfdisk start=2048)
    subprocess.run(
        ["dd", f"if={raw}", f"of={part}", "bs=512", f"skip={start}", f"count={sectors}"],
        check=True,
        capture_output=True,
    )
    (work / "hb-hook.sh").write_text(HOOK)
    (work / "unit").write_text("[Service]\nExecStart=/bin/sh /hb-hook.sh\n")
    cmds = [
        "mkdir /etc",
        "mkdir /etc/systemd",
        "mkdir /etc/systemd/system",
        "mkdir /etc/systemd/system/multi-user.target.wants",
        f"write {work / 'hb-hook.sh'} /hb-hook.sh",
        f"write {work / 'unit'} /etc/systemd/system/{UNIT}",
        f"symlink /etc/systemd/system/multi-user.target.wants/{UNIT} /etc/systemd/system/{UNIT}",
    ]
    subprocess.run(
        ["debugfs", "-w", "-f", "-", str(part)],
        input="\n".join(cmds) + "\n",
        text=True,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["dd", f"if={part}", f"of={raw}", "bs=512", f"seek={start}", "conv=notrunc"], check=True, capture_output=True
    )
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), out], check=True)
    shutil.rmtree(work)


def domain_xml(name, disk, guest_dir, busy):
    cmdline = "console=ttyS0 quiet" + (" hb.busy" if busy else "")
    return f"""<domain type='qemu'>
  <name>{name}</name><memory unit='MiB'>{MEM_MIB}</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><kernel>{guest_dir}/vmlinux</kernel>
    <initrd>{guest_dir}/initrd.img</initrd><cmdline>{cmdline}</cmdline></os>
  <on_poweroff>destroy</on_poweroff><on_reboot>destroy</on_reboot>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='none'/>
      <source file='{disk}'/><target dev='vda' bus='virtio'/></disk>
    <serial type='file'><source path='/var/log/libvirt/qemu/{name}-serial.log' append='on'/>
      <target port='0'/></serial>
    <serial type='udp'><source mode='bind' host='0.0.0.0' service='0'/>
      <source mode='connect' host='10.252.0.1' service='{PORT}'/><target port='1'/></serial>
  </devices>
</domain>"""


# the processes: the beat receiver (fabric namespace), a worker per hypervisor (its namespaces) ---------------------
def receiver(port, out):
    """Each datagram's arrival as a line of ``out``: the kernel's receive timestamp (SO_TIMESTAMPNS, wall clock),
    not when this process got to read it (on a loaded host it may not run for a while: the socket buffer holds
    the datagrams meanwhile, 8 MiB of it)."""
    import socket
    import struct

    stamp = getattr(socket, "SO_TIMESTAMPNS", 35)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, stamp, 1)
    sock.bind(("10.252.0.1", port))
    with open(out, "w", buffering=1) as fh:
        while True:
            _data, anc, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(16))
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == stamp:
                    sec, nsec = struct.unpack("qq", raw[:16])
                    fh.write(f"{sec + nsec / 1e9:.6f}\n")


def worker(uri, tmp):
    """Migrations on request (one JSON line in, one ``@@``-prefixed JSON line out), from this hypervisor: ``raw``
    (libvirt-python) or ``ours`` (``virt.migrate`` through Salt's loader, minion settings ``migration``)."""
    import libvirt

    loaders = {}
    conn = libvirt.open(uri)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = {"ok": True, **OPS[req["op"]](conn, req, loaders, uri, tmp)}
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which decides
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print("@@" + json.dumps(answer, default=str), flush=True)


def op_raw(conn, req, _loaders, _uri, _tmp):
    import libvirt

    dom = conn.lookupByName(req["name"])
    flags = (
        libvirt.VIR_MIGRATE_PEER2PEER
        | libvirt.VIR_MIGRATE_PERSIST_DEST
        | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
        | libvirt.VIR_MIGRATE_LIVE
    )
    if req["converge"] == "auto":
        flags |= libvirt.VIR_MIGRATE_AUTO_CONVERGE
    if req.get("unsafe"):
        flags |= libvirt.VIR_MIGRATE_UNSAFE
    params = {libvirt.VIR_MIGRATE_PARAM_URI: f"tcp://{req['target']}"}
    if req.get("disk_map"):
        flags |= libvirt.VIR_MIGRATE_NON_SHARED_DISK
        secure = libvirt.VIR_DOMAIN_XML_MIGRATABLE | libvirt.VIR_DOMAIN_XML_SECURE
        live, persist = dom.XMLDesc(secure), dom.XMLDesc(secure | libvirt.VIR_DOMAIN_XML_INACTIVE)
        for src, dst in req["disk_map"].items():
            live, persist = live.replace(f"'{src}'", f"'{dst}'"), persist.replace(f"'{src}'", f"'{dst}'")
        params.update(
            {
                libvirt.VIR_MIGRATE_PARAM_DEST_XML: live,
                libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: persist,
                libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS: ["vda"],
            }
        )
    if req.get("max_bandwidth"):
        params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = req["max_bandwidth"]
    capped = threading.Timer(req.get("cap", CAP_S), dom.abortJob)  # raw libvirt has no bound: the bench's own
    polling = threading.Event()
    if req.get("poll"):  # as ours' watchdog does: jobInfo() once a second while the migration runs

        def poll():
            while not polling.wait(1.0):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.jobInfo()

        threading.Thread(target=poll, daemon=True).start()
    t0 = time.perf_counter()
    capped.start()
    try:
        dom.migrateToURI3(f"qemu+tcp://{req['target']}/system", params, flags)
    except libvirt.libvirtError as exc:
        return {"s": time.perf_counter() - t0, "failed": exc.get_error_message(), "capped": not capped.is_alive()}
    finally:
        capped.cancel()
        polling.set()
    return {"s": time.perf_counter() - t0}


def op_warm(_conn, req, loaders, uri, tmp):
    """The minion's loader for these settings, built before anything is timed (a running minion has it)."""
    from tests.support.saltloader import make_minion_mods

    key = json.dumps(req["migration"], sort_keys=True)
    if key not in loaders:
        path = pathlib.Path(tmp) / f"minion-{len(loaders)}"
        path.mkdir(parents=True)
        loaders[key] = make_minion_mods(path, uri, migration=req["migration"])
        assert loaders[key]["virt.migrate"]  # Salt's lazy loader imports the module now
    return {"key": key}


def op_ours(conn, req, loaders, uri, tmp):
    key = op_warm(conn, req, loaders, uri, tmp)["key"]
    kwargs = {"transport": "tcp", "report": True, "unsafe": bool(req.get("unsafe"))}
    if req.get("max_bandwidth"):
        kwargs["max_bandwidth"] = req["max_bandwidth"]
    if req.get("disk_map"):
        kwargs.update(copy_storage="all", disk_map=req["disk_map"], migrate_disks=["vda"])
    t0 = time.perf_counter()
    if os.environ.get("BENCH_MIGRATE_PROFILE"):  # where ours' time goes: cProfile's top entries on stderr
        import cProfile
        import pstats

        prof = cProfile.Profile()
        try:
            ret = prof.runcall(loaders[key]["virt.migrate"], req["name"], req["target"], **kwargs)
        finally:
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
        return {"s": time.perf_counter() - t0, "ret": ret}
    try:
        ret = loaders[key]["virt.migrate"](req["name"], req["target"], **kwargs)
    except Exception as exc:  # noqa: BLE001 - an abort is a result here
        return {"s": time.perf_counter() - t0, "failed": str(exc)}
    return {"s": time.perf_counter() - t0, "ret": ret}


def op_stats(conn, req, *_):
    """The completed migration's statistics as the target's libvirtd keeps them."""
    import xml.etree.ElementTree as ET

    import libvirt

    dom = conn.lookupByName(req["name"])
    stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
    disk = ET.fromstring(dom.XMLDesc(0)).find("devices/disk/source").get("file")  # the copy went where it should
    return {"stats": {k: v for k, v in stats.items() if isinstance(v, int | float)}, "disk": disk}


OPS = {"raw": op_raw, "ours": op_ours, "stats": op_stats, "warm": op_warm}


class Lab:
    def __init__(self, base):
        from tests.support import lab
        from tests.support.paths import GUEST_DIR

        self.base, self.lab, self.guest_dir = pathlib.Path(base), lab, GUEST_DIR
        self.store = self.base / "store"
        for sub in ("shared", *(f"hv{i}" for i in INDEXES)):
            (self.store / sub).mkdir(parents=True)
        self.fabric = lab.Fabric(lab.new_tag()).start()
        self.hvs = {f"hv{i}": lab.Hypervisor(str(base), i, self.fabric) for i in INDEXES}
        self.procs, self.workers, self.beats = [], {}, self.base / "beats.txt"

    def start(self):
        for hv in self.hvs.values():
            hv.start()
            hv.warm_up()
        py = sys.executable
        me = os.path.abspath(__file__)
        self.procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", self.fabric.netns, py, me, "--receiver", str(PORT), str(self.beats)],
                start_new_session=True,
            )
        )
        for name, hv in self.hvs.items():
            proc = subprocess.Popen(
                [
                    "nsenter",
                    "-t",
                    str(hv.pid),
                    "-n",
                    "-m",
                    "-u",
                    "--",
                    py,
                    me,
                    "--worker",
                    hv.uri,
                    str(self.base / f"worker-{name}"),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env=dict(os.environ, PYTHONPATH=f"{common.ROOT}:{common.ROOT / '_utils'}"),
            )
            self.procs.append(proc)
            self.workers[name] = proc
        heartbeat_disk(self.guest_dir, str(self.store / "hb.qcow2"))

    def ask(self, host, **req):
        proc = self.workers[host]
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise RuntimeError(f"the worker on {host} ended")

    def conn(self, host):
        import libvirt

        return libvirt.open(self.hvs[host].uri)

    def stop(self):
        import libvirt

        for hv in self.hvs.values():
            if hv.pid:
                with contextlib.suppress(libvirt.libvirtError):
                    conn = libvirt.open(hv.uri)
                    for dom in conn.listAllDomains(0):
                        if dom.isActive():
                            dom.destroy()
                        dom.undefine()
        common.stop_groups(self.procs, 10)
        for hv in self.hvs.values():
            if hv.pid:
                hv.stop()
        self.fabric.stop()


# measuring -----------------------------------------------------------------------------------------------------------
def beats(path):
    with open(path) as fh:
        return [float(x) for x in fh.read().split()]


def max_gap(times, t0, t1):
    """The largest gap between consecutive beats that overlaps [t0, t1] (the beat before t0 and the first after t1
    count: a pause across either edge)."""
    inside = [t for t in times if t0 <= t <= t1]
    before = [t for t in times if t < t0][-1:]
    after = [t for t in times if t > t1][:1]
    seq = before + inside + after
    return max((b - a for a, b in zip(seq, seq[1:], strict=False)), default=None)


def wait_beating(lab, seconds=3.0, timeout=300):
    """Until the guest beat for ``seconds`` without a gap above 1 s (booted, its hook running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.procs[0].poll() is not None:
            raise RuntimeError("the beat receiver ended (its traceback is above)")
        now = time.time()
        times = beats(lab.beats) if lab.beats.exists() else []
        recent = [t for t in times if t > now - seconds]
        # the gap from the beat before the window counts: the last beat of a VM before this one is not a beat
        if len(recent) > seconds / BEAT_S and max_gap(times, now - seconds, now) < 1.0:
            return
        time.sleep(0.5)
    raise RuntimeError("the guest does not beat (see the hypervisors' log/qemu/*-serial.log)")


def cell_run(lab, cell, reps, migration, methods=None, extra=None, pair=None):
    """One cell: a VM booted on the first host, then 2*reps migrations (raw/ours interleaved ABBA), host to host."""
    import libvirt

    storage, load = cell.split("-")
    name = f"mig-{cell}"
    hosts = list(lab.hvs)
    here = hosts[0]
    disk_dir = (lambda h: lab.store / "shared") if storage == "shared" else (lambda h: lab.store / h)
    disk = disk_dir(here) / f"{name}.qcow2"
    shutil.copyfile(lab.store / "hb.qcow2", disk)
    conn = lab.conn(here)
    conn.defineXML(domain_xml(name, disk, lab.guest_dir, load == "busy")).create()
    conn.close()
    for host in hosts:
        lab.ask(host, op="warm", migration=migration)
    wait_beating(lab)
    if load == "busy":
        time.sleep(5)  # the dirtying loop runs
    pair = pair or ("raw", "ours")
    order = methods or [m for i in range(reps) for m in (pair if i % 2 == 0 else pair[::-1])]
    rows = []
    for method in order:
        there = hosts[1] if here == hosts[0] else hosts[0]
        req = {
            "op": method.split("+")[0],
            "poll": method.endswith("+poll"),
            "name": name,
            "target": there,
            "migration": migration,
            "converge": migration["converge"],
        }
        req.update(extra or {})
        if storage == "copy":
            src, dst = disk_dir(here) / f"{name}.qcow2", disk_dir(there) / f"{name}.qcow2"
            dst.unlink(missing_ok=True)
            size = json.loads(
                subprocess.run(
                    ["qemu-img", "info", "-U", "--output=json", str(src)], check=True, capture_output=True, text=True
                ).stdout
            )["virtual-size"]
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(dst), str(size)], check=True)
            req["disk_map"] = {str(src): str(dst)}
        else:  # the same files on both hosts, as the runner proves with its probe before it passes unsafe
            req["unsafe"] = True
        time.sleep(2)  # the baseline window
        t0 = time.time()  # the receiver's stamps are the kernel's wall clock
        answer = lab.ask(here, **req)
        t1 = time.time()
        times = beats(lab.beats)
        deadline = time.monotonic() + 20
        while not (times and times[-1] > t1) and time.monotonic() < deadline:  # the first beat after it
            time.sleep(0.2)
            times = beats(lab.beats)
        gap, base = max_gap(times, t0, t1), max_gap(times, t0 - (t1 - t0) - 0.5, t0 - 0.5)
        if os.environ.get("BENCH_MIGRATE_DEBUG"):
            near = [round(t - t0, 3) for t in times if t0 - 6 < t < t1 + 1]
            log(
                f"beats: {len(times)} in all, last {times[-1] - t0 if times else None:.3f} after t0; t1-t0 "
                f"{t1 - t0:.3f}; near: {len(near)}, gaps > 50 ms: "
                f"{[(a, round(b - a, 3)) for a, b in zip(near, near[1:], strict=False) if b - a > 0.05]}"
            )
        moved = answer.get("ok") and not answer.get("failed")
        seen = lab.ask(there, op="stats", name=name) if moved else {}
        stats = seen.get("stats", {})
        if moved and storage == "copy" and seen.get("disk") != req["disk_map"][str(src)]:
            raise RuntimeError(f"{method}: the VM's disk on {there} is {seen.get('disk')}, not the copy's target")
        row = {
            "method": method,
            "from": here,
            "to": there,
            "s": answer.get("s"),
            "gap": gap,
            "baseline_gap": base,
            "libvirt_downtime_ms": stats.get("downtime"),
            "libvirt_elapsed_ms": stats.get("time_elapsed"),
            "iterations": stats.get("memory_iteration"),
            "throttle": stats.get("auto_converge_throttle"),
            "failed": answer.get("failed") or answer.get("error"),
            "capped": answer.get("capped"),
            "load": common.loadavg(),
            "converge": (answer.get("ret") or {}).get("converge"),
            "inner_s": (answer.get("ret") or {}).get("seconds"),
            "warnings": (answer.get("ret") or {}).get("warnings"),
        }
        rows.append(row)
        log(
            f"migrate {cell} {method} {here}->{there}: {row['s']:.2f} s (inner {row['inner_s']}), gap {fmt_ms(gap)} "
            f"(baseline {fmt_ms(base)}), libvirt downtime {row['libvirt_downtime_ms']} ms, "
            f"iterations {row['iterations']}{adaptive_note(row['converge'])}"
            + (f", FAILED: {row['failed'][:300]}" if row["failed"] else "")
        )
        if moved:
            if storage == "copy":
                (disk_dir(here) / f"{name}.qcow2").unlink(missing_ok=True)
            here = there
    conn = lab.conn(here)
    try:
        dom = conn.lookupByName(name)
        dom.destroy()
        dom.undefine()
    except libvirt.libvirtError:
        pass
    conn.close()
    return rows


def adaptive_note(converge):
    """Ours' switch-over target as its answer says (the adaptive one: raised at which memory pass, if)."""
    adaptive = (converge or {}).get("adaptive_downtime")
    if not adaptive:
        return ""
    raised = adaptive["raised_at_pass"]
    then = f" -> {converge['max_downtime_ms']} ms at pass {raised}" if raised else ""
    return f", target {adaptive['start_ms']} ms{then}"


def fmt_ms(seconds):
    return "—" if seconds is None else f"{seconds * 1000:.0f} ms"


LABELS = {"raw": "raw migrateToURI3", "raw+poll": "raw + jobInfo() each 1 s", "ours": "salt-virt virt.migrate"}


def cell_table(cell, rows, pair=("raw", "ours")):
    """Table rows and notes of one cell: ``pair`` = (the floor, the one measured against it)."""
    floor, ours = pair
    out, notes = [], []
    by = {m: [r for r in rows if r["method"] == m and not r["failed"]] for m in pair}
    st = {m: common.summary([r["s"] for r in by[m]]) for m in by}
    gaps = {m: common.summary([r["gap"] for r in by[m]]) for m in by}
    for m in pair:
        base = common.summary([r["baseline_gap"] for r in by[m]])
        lv = common.summary([r["libvirt_downtime_ms"] / 1000 for r in by[m] if r["libvirt_downtime_ms"] is not None])
        out.append(
            [
                cell,
                LABELS[m],
                common.fmt_stat(st[m]),
                common.fmt_stat(gaps[m]),
                common.fmt_stat(base),
                common.fmt_stat(lv),
                ", ".join(str(r["iterations"]) for r in by[m]),
                sum(1 for r in rows if r["method"] == m and r["failed"]),
            ]
        )
    ratio = st[ours]["median"] / st[floor]["median"] if st[ours] and st[floor] else None
    paired = [o["s"] / r["s"] for r, o in zip(by[floor], by[ours], strict=False)]
    met = ratio is not None and ratio <= GOAL_RATIO
    notes.append(
        f"{cell}: {ours}/{floor} {'—' if ratio is None else f'{ratio:.2f}x'} "
        f"(pairs: {', '.join(f'{p:.2f}' for p in paired)}): goal <= {GOAL_RATIO} {'met' if met else 'NOT met'}"
    )
    ways = sorted({(r["from"], r["to"]) for r in rows})
    per_way = {
        f"{a}->{b}": {m: common.summary([r["s"] for r in by[m] if (r["from"], r["to"]) == (a, b)]) for m in pair}
        for a, b in ways
    }
    notes.append(
        f"{cell}, by direction: "
        + "; ".join(
            f"{way} " + ", ".join(f"{m} {common.fmt_stat(v)}" for m, v in got.items()) for way, got in per_way.items()
        )
    )
    if cell.endswith("idle") and gaps[ours]:
        worst = gaps[ours]["max"] * 1000
        notes.append(
            f"{cell}: {ours}' largest beat gap {worst:.0f} ms (median {gaps[ours]['median'] * 1000:.0f} ms): "
            f"goal <= {GOAL_DOWNTIME_MS} ms {'met' if worst <= GOAL_DOWNTIME_MS else 'NOT met'}"
        )
    return out, notes, {"stat": st, "gaps": gaps, "ratio": ratio, "paired": paired, "per_way": per_way}


PROOFS = (  # (what, method, converge, converge_timeout): a busy guest on a link too thin for its dirty rate
    ("raw, no auto-converge", "raw", "none", None),
    ("ours, converge none", "ours", "none", 30),
    ("ours, converge auto (default)", "ours", "auto", None),
    ("ours, converge postcopy", "ours", "postcopy", 10),
)
PROOF_BANDWIDTH, PROOF_CAP = 8, 90  # MiB/s (max_bandwidth, both), seconds the bench lets raw run


def proofs(lab):
    """Convergence, one migration each: a busy guest whose dirty rate is above the link's (max_bandwidth)."""
    notes = []
    for what, method, mode, timeout in PROOFS:
        mig = {"allow_cleartext": True, "converge": mode}
        if timeout:
            mig["converge_timeout"] = timeout
        extra = {"max_bandwidth": PROOF_BANDWIDTH, "cap": PROOF_CAP}
        (r,) = cell_run(lab, "shared-busy", 1, mig, methods=[method], extra=extra)
        if r["failed"]:
            end = "stopped by the bench's cap" if r.get("capped") else "failed"
            got = f"{end} after {r['s']:.1f} s: {r['failed'][:400]}"
        else:
            got = (
                f"converged in {r['s']:.1f} s, {r['iterations']} memory passes, auto-converge throttle "
                f"{r['throttle']}%, beat gap {fmt_ms(r['gap'])}, libvirt downtime {r['libvirt_downtime_ms']} ms"
            )
        notes.append(
            f"proof: busy guest at max_bandwidth {PROOF_BANDWIDTH} MiB/s, {what}"
            + (f", converge_timeout {timeout} s" if timeout else "")
            + f": {got}"
        )
    return notes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=4, help="migrations per method and cell (even: as many each way)")
    ap.add_argument("--quick", action="store_true", help="one rep, the shared idle cell only")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument(
        "--proof",
        action="store_true",
        help="also: a busy guest with converge none (aborted) and postcopy (switched), ours only",
    )
    ap.add_argument("--pair", default="raw,ours", help="the floor and the measured: raw,ours (or raw,raw+poll)")
    ap.add_argument("--max-downtime", type=int, default=None, help="virt:migration:max_downtime (ms), ours only")
    ap.add_argument("--converge-timeout", type=float, default=None, help="virt:migration:converge_timeout")
    args = ap.parse_args(argv)
    pair = tuple(args.pair.split(","))
    reps, cells = (1, ["shared-idle"]) if args.quick else (args.reps, args.cells.split(","))
    migration = {"allow_cleartext": True, "converge": "auto"}
    if args.converge_timeout:
        migration["converge_timeout"] = args.converge_timeout
    if args.max_downtime:
        migration["max_downtime"] = args.max_downtime
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still tears its lab down (finally)
    load0 = common.loadavg()
    base = tempfile.mkdtemp(prefix="svbench-mig", dir="/var/tmp")
    os.chmod(base, 0o755)
    lab = Lab(base)
    rows, table, notes, details = [], [], [], {}
    try:
        log("migrate: 2 lab hypervisors, the beat receiver, a worker in each")
        lab.start()
        for cell in cells:
            got = cell_run(lab, cell, reps, migration, pair=pair)
            rows += [dict(r, cell=cell) for r in got]
            t, n, d = cell_table(cell, got, pair)
            table += t
            notes += n
            details[cell] = d
        if args.proof:
            notes += proofs(lab)
    finally:
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "title": "Live migration: salt-virt virt.migrate vs raw migrateToURI3",
        "details": {"rows": rows, "cells": details, "migration": migration, "mem_mib": MEM_MIB},
        "tables": [
            common.table(
                [
                    "cell",
                    "call",
                    "total time",
                    "beat gap during (downtime)",
                    "beat gap before (baseline)",
                    "libvirt downtime",
                    "memory passes",
                    "failed",
                ],
                table,
            )
        ],
        "notes": notes
        + [
            f"guest: TCG, {MEM_MIB} MiB, 1 vCPU, the test image's 64 MiB qcow2 disk; busy: dd copying 16 MiB "
            "of random data into its buffer in a loop; heartbeat every 10 ms over a UDP serial port",
            f"flags (both): PEER2PEER|PERSIST_DEST|UNDEFINE_SOURCE|LIVE|AUTO_CONVERGE (ours' default converge auto)"
            f" (+UNSAFE on shared storage, as the runner after its probe; +NON_SHARED_DISK, migrate_disks vda, "
            "dest/persist XML for a copy); plain tcp (no TLS); "
            f"ours' minion settings {migration}",
            f"load average before/after: {load0} / {common.loadavg()}",
        ],
    }
    common.emit("migrate", result)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--receiver":
        receiver(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
