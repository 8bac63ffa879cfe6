"""The tutorial as ratios that travel between machines (issue #40): TCG speed differs per host, so the
absolute time to the first ``test.ping`` does not; these three ratios, each measured against its floor in
the same run, interleaved (ours, floor, ours, floor, ...) so the shared machine's load hits both alike:

(a) salt-virt's share of the time to the first ping: the whole ``salt-run virt.init`` command (Salt's CLI
    start-up, the runner to ``started``, the rest, exit) over ``salt-run virt.init`` start → first
    ``salt <id> test.ping`` True (bench_tutorial's clock). Goal: <= 5 %.
(b) the image's minion start → its ``salt/minion/<id>/start`` event (``SALT-MINION-START`` on the serial
    console → the event on the master, host clock) over a bare ``salt-call --local test.ping`` in the same
    guest, run after the first ping through the master (``cmd.run``; timed by the guest's /proc/uptime), the
    first run (cold: the first ``salt-call`` in that guest) and the next ones (warm). Goal: <= 1.5x.
(c) boot → DHCP lease (the guest's uptime at ``SV-PHASE dhcp``: kernel start → a routable address) of
    salt-virt's VM over the same image defined and started with raw libvirt-python: a qcow2 overlay on
    the same base salt-virt cloned from, on the same bridge (br0: the lab fabric's DHCP), BIOS boot, no
    seeding, the VM's size; its serial console to a file. Goal: <= 1.2x. Host-clock figures beside it:
    domain started → lease seen (raw: ``createWithFlags`` returned; salt-virt: ``salt-run`` returned, the
    domain having started a little earlier, within the command's rest).

One lab hypervisor (placement has one choice; the first ``virt.init`` on it is reported apart, as in
bench_tutorial), a real salt-master, the Debian 12 + salt-minion image (scripts/build-debian-image.sh).

    $VENV/bin/python bench/bench_tutorial.py --ratios [--reps 3]
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_tutorial as bt
import common

lab = bt.lab  # tests/support/lab.py, imported the way bench_tutorial does

# /proc/uptime before and after, the exit code: the guest's own clock, no process more than the shell
SALT_CALL = (
    "read a _ < /proc/uptime; salt-call --local test.ping >/dev/null 2>&1; rc=$?; read b _ < /proc/uptime; "
    'echo "SVT $a $b $rc"'
)
SALT_CALLS = 3  # the first is the cold one
# a tighter floor beside it: the interpreter, Salt's config and one full grains pass (no cache), what a
# minion must do before it authenticates; salt-call --local also updates a local fileserver and renders
# a local pillar, which a minion's start does not
GRAINS_PASS = SALT_CALL.replace(
    "salt-call --local test.ping",
    "/opt/saltstack/salt/bin/python -c 'import salt.config, salt.loader; "
    'salt.loader.grains(salt.config.minion_config("/etc/salt/minion"), force_refresh=True)\'',
)
# once, after them: where a salt-call's time goes (Salt's debug log has a timestamp per line)
SALT_CALL_LOG = (
    "salt-call --local test.ping -l quiet --log-file /tmp/svt-call.log --log-file-level debug >/dev/null 2>&1; "
    "cat /tmp/svt-call.log"
)
LEASE_TIMEOUT = 300

RAW_XML = """<domain type='{type}'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{mem}</memory>
  <vcpu>{vcpus}</vcpu>
  <os><type arch='x86_64'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <mac address='{mac}'/>
      <source bridge='br0'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='{serial}'/><target port='0'/></serial>
  </devices>
</domain>"""


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def salt_calls(stack, name, script=SALT_CALL, times=SALT_CALLS):
    """``salt-call --local test.ping`` (or ``script``) in the guest ``name``, ``times`` one after the other:
    the guest's seconds for each (None: no answer or a failed call)."""
    out = []
    for _ in range(times):
        proc = stack.cli("salt", name, "cmd.run", script, "--out=json", "-t", "300", timeout=420)
        m = re.search(r"SVT (\d+\.\d+) (\d+\.\d+) (\d+)", proc.stdout)
        out.append(float(m.group(2)) - float(m.group(1)) if m and m.group(3) == "0" else None)
        if out[-1] is None:
            log(f"salt-call --local in {name}: {proc.stdout[-400:]} {proc.stderr[-400:]}")
    return out


def salt_call_log(stack, name):
    proc = stack.cli("salt", name, "cmd.run", SALT_CALL_LOG, "--out=json", "-t", "300", timeout=420)
    return (bt.bench_fleet.last_json(proc.stdout) or {}).get(name)


def cli_floor(stack):
    """Plain Salt's ``salt-run`` start-up and exit on the same master: ``salt-run test.arg 1``, seconds."""
    t0 = time.monotonic()
    stack.cli("salt-run", "test.arg", "1", "--out=json", timeout=300)
    return time.monotonic() - t0


def vm_facts(conn, name):
    """(domain type, disk path, the disk's backing file, machine, cpu mode) of salt-virt's VM."""
    root = ET.fromstring(conn.lookupByName(name).XMLDesc(0))
    disk = root.find("./devices/disk[@device='disk']/source").get("file")
    backing = root.find("./devices/disk[@device='disk']/backingStore/source")
    cpu = root.find("./cpu")
    return {
        "type": root.get("type"),
        "disk": disk,
        "backing": backing.get("file") if backing is not None else None,
        "machine": root.find("./os/type").get("machine"),
        "cpu": None if cpu is None else cpu.get("mode"),
        "devices": sorted({c.tag for c in root.find("./devices")}),
    }


def raw_vm(conn, hv, base, name, vcpus, mem, vm_type):
    """The floor of (c): a fresh overlay on ``base`` (a hard link to the base salt-virt's VM cloned from:
    the purge may collect the base), defined and started with libvirt-python; the guest's uptime at
    ``SV-PHASE dhcp`` and the host's seconds from the start's return to seeing it."""
    disk = os.path.join(os.path.dirname(base), f"{name}.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, disk], check=True)
    serial = hv.path("log", "qemu", f"{name}-serial.log")
    console = bt.Console(serial)
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in os.urandom(3))
    xml = RAW_XML.format(type=vm_type, name=name, uuid=uuid.uuid4(), mem=mem, vcpus=vcpus, disk=disk,
                         mac=mac, serial=serial)  # fmt: skip
    dom = conn.defineXML(xml)
    res = {"name": name}
    try:
        t_create = time.monotonic()
        dom.createWithFlags(0)
        t0 = time.monotonic()
        res["create"] = t0 - t_create  # the floor of the runner's define → started step
        deadline = t0 + LEASE_TIMEOUT
        while time.monotonic() < deadline and "dhcp" not in console.phases():
            time.sleep(0.2)
        ph = console.phases()
        res["phases"] = {k: {"at": t - t0, "uptime": up} for k, (t, up) in ph.items()}
        res["first_line"] = None if console.first() is None else console.first() - t0
    finally:
        console.stop.set()
        dom.destroy() if dom.isActive() else None
        dom.undefine()
        for f in (disk, base):
            with contextlib.suppress(OSError):
                os.unlink(f)
    return res


def ours(stack, hv, events, name, conn):
    """bench_tutorial's 1-VM tutorial, then (b)'s floor in the same guest, then the facts (c) needs."""
    r = bt.one_vm(stack, {"hyper00": hv}, events, name, False)
    if r.get("ping") is not None:
        r["salt_call"] = salt_calls(stack, name)
        r["grains_pass"] = salt_calls(stack, name, GRAINS_PASS, 1)[0]
        if name == "web1":
            r["salt_call_log"] = salt_call_log(stack, name)
    try:
        r["facts"] = vm_facts(conn, name)
    except Exception as exc:  # noqa: BLE001 - the VM may be gone (a failed init): reported
        r["facts"] = {"error": str(exc)}
    return r


def _step(r, step):
    """Seconds of one timeline step (since the step before it)."""
    tl = r["timeline"]
    i = next((i for i, t in enumerate(tl) if t["step"] == step), None)
    return None if not i else tl[i]["at"] - tl[i - 1]["at"]


def _started(r):
    return bt._at(r["timeline"], "started")


def rows(runs, raws):
    """The ratio table: each figure median (min–max, n), the goal and met/not met."""
    stat = lambda vals: common.fmt_stat(common.summary(vals))  # noqa: E731
    med = lambda vals: (common.summary(vals) or {}).get("median")  # noqa: E731
    good = [r for r in runs if r["rc"] == 0 and r.get("ping") is not None]
    share = [r["returned"] / r["ping"] for r in good]
    warm_only = [r["returned"] / r["ping"] for r in good[1:]]  # not the hypervisor's first init
    mstart = [bt._d(r, "marker", "event") for r in good]
    cold = [(r.get("salt_call") or [None])[0] for r in good]
    warm = [x for r in good for x in (r.get("salt_call") or [None])[1:]]
    b_cold = [m / c for m, c in zip(mstart, cold, strict=True) if m and c]
    grains = [r.get("grains_pass") for r in good]
    b_grains = [m / g for m, g in zip(mstart, grains, strict=True) if m and g]
    own = [(r["returned"] - r["cli_floor"]) / r["ping"] for r in good if r.get("cli_floor")]
    b_warm = [m / w for m, r in zip(mstart, good, strict=True) for w in (r.get("salt_call") or [])[1:2] if m and w]
    up_ours = [bt._ph(r, "dhcp", "uptime") for r in runs if r["rc"] == 0]
    up_raw = [bt._ph(r, "dhcp", "uptime") for r in raws]
    host_ours = [bt._d(r, "returned", "dhcp") for r in runs if r["rc"] == 0]
    host_raw = [bt._ph(r, "dhcp") for r in raws]
    pairs = [bt._ph(r, "dhcp", "uptime") / bt._ph(r["raw"], "dhcp", "uptime") for r in runs
             if r.get("raw") and bt._ph(r, "dhcp", "uptime") and bt._ph(r["raw"], "dhcp", "uptime")]  # fmt: skip
    pct = lambda v: "—" if v is None else f"{100 * v:.1f} %"  # noqa: E731
    x = lambda v: "—" if v is None else f"{v:.2f}x"  # noqa: E731
    spread = lambda vals, f: (  # noqa: E731
        f"{f(med(vals))} ({f(min(vals))}–{f(max(vals))}, n={len(vals)})" if vals else "—"
    )
    verdict = lambda v, goal: "—" if v is None else ("**met**" if v <= goal else "**not met**")  # noqa: E731
    ratio_rows = [
        ["(a) `salt-run virt.init` command / time to first ping", spread(share, pct), "<= 5 %",
         verdict(med(share), 0.05)],
        ["(a) the same, not the first pair", spread(warm_only, pct), "<= 5 %", verdict(med(warm_only), 0.05)],
        ["(a) minus plain Salt's `salt-run test.arg 1` of the same pair / time to first ping", spread(own, pct),
         "(for the cause)", ""],
        ["(b) minion start → start event / cold `salt-call --local test.ping`", spread(b_cold, x), "<= 1.5x",
         verdict(med(b_cold), 1.5)],
        ["(b) the same / warm `salt-call --local test.ping` (2nd run)", spread(b_warm, x), "<= 1.5x",
         verdict(med(b_warm), 1.5)],
        ["(b) the same / interpreter + Salt's config + one grains pass (no cache)", spread(b_grains, x),
         "(a tighter floor)", ""],
        ["(c) kernel start → lease (guest uptime): salt-virt / raw libvirt, pairs", spread(pairs, x), "<= 1.2x",
         verdict(med(pairs), 1.2)],
    ]  # fmt: skip
    parts = [
        ["`salt-run virt.init` command (s)", stat([r["returned"] for r in good])],
        ["  of it: runner function to `started`", stat([_started(r) for r in good])],
        ["  of it: `defined` → `started` (the hypervisor's domain start)", stat([_step(r, "started") for r in good])],
        [
            "  floor: raw libvirt's `createWithFlags` of the same image",
            stat([(r.get("raw") or {}).get("create") for r in good]),
        ],
        ["  floor: plain Salt's `salt-run test.arg 1` (CLI start-up + exit)", stat([r.get("cli_floor") for r in good])],
        ["first `test.ping` True (s)", stat([r["ping"] for r in good])],
        ["SALT-MINION-START → start event (s)", stat(mstart)],
        ["`salt-call --local test.ping` in the guest, cold (s)", stat(cold)],
        ["`salt-call --local test.ping` in the guest, warm (s)", stat(warm)],
        ["interpreter + Salt's config + one grains pass in the guest (s)", stat(grains)],
        ["salt-virt's VM: kernel start → lease (guest uptime, s)", stat(up_ours)],
        ["raw libvirt VM: kernel start → lease (guest uptime, s)", stat(up_raw)],
        [
            "salt-virt's VM: `salt-run` returned → lease seen (host, s; started before it by < the CLI's rest)",
            stat(host_ours),
        ],
        ["raw libvirt VM: `createWithFlags` returned → lease seen (host, s)", stat(host_raw)],
        ["salt-virt's VM: uptime at `SV-PHASE systemd` (s)", stat([bt._ph(r, "systemd", "uptime") for r in runs])],
        ["raw libvirt VM: uptime at `SV-PHASE systemd` (s)", stat([bt._ph(r, "systemd", "uptime") for r in raws])],
    ]
    return ratio_rows, parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=3, help="pairs (salt-virt's VM, raw libvirt VM)")
    ap.add_argument("--vcpus", type=int, default=1)
    ap.add_argument("--mem", type=int, default=512)
    args = ap.parse_args(argv)
    if not os.path.isfile(bt.DEBIAN):
        print(f"{bt.DEBIAN} is missing: run scripts/setup.sh", file=sys.stderr)
        return 2
    import libvirt

    bt.SIZE[:] = [str(args.vcpus), str(args.mem)]
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svr", dir="/tmp")
    os.chmod(workdir, 0o755)
    fabric, hv, stack, events, conn = None, None, None, None, None
    runs, raws, errors, loads = [], [], [], []
    try:
        fabric = lab.Fabric(lab.new_tag()).start()
        master_ip = fabric.master_link()
        fabric.dhcp()
        hv = lab.Hypervisor(os.path.join(workdir, "hv"), 1, fabric).start()
        srv = os.path.join(workdir, "s", "srv", "images")
        os.makedirs(srv)
        os.symlink(bt.DEBIAN, os.path.join(srv, "debian.qcow2"))
        extra = {
            "interface": "0.0.0.0",
            "auto_accept": False,
            "virt": {
                "hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 30, "gather_job_timeout": 30},
                "guest_master": master_ip,
            },
        }
        stack = bt.TutStack("salt-virt", str(common.OUR_VENV), os.path.join(workdir, "s"), [hv.uri],
                            [str(common.ROOT / "_runners")], [str(common.ROOT / "_modules")], extra)  # fmt: skip
        log("ratios: salt-master + 1 lab hypervisor")
        stack.start()
        stack._accepted = True
        cached = stack.cli("salt", "hyper*", "virt.image_warm", "salt://images/debian.qcow2", "-t", "300")
        if cached.returncode != 0:
            raise RuntimeError(f"virt.image_warm: {cached.stdout[-500:]} {cached.stderr[-500:]}")
        events = bt.Events(stack)
        time.sleep(3)  # the event listener is subscribed before the first init
        conn = libvirt.open(hv.uri)
        for rep in range(args.reps):
            name = "web1" if rep == 0 else f"web1r{rep}"
            loads.append(common.loadavg())
            log(f"ratios: rep {rep + 1}/{args.reps}: salt-virt's {name} (load {loads[-1]})")
            floor = cli_floor(stack)
            r = ours(stack, hv, events, name, conn)
            r["cli_floor"] = floor
            runs.append(r)
            log(f"ratios: {name}: " + json.dumps({k: r.get(k) for k in ("returned", "marker", "event", "ping",
                                                                        "salt_call", "phases", "facts")}))  # fmt: skip
            facts = r.get("facts") or {}
            base = os.path.join(workdir, f"rawbase{rep}.qcow2")
            if facts.get("backing"):
                os.link(facts["backing"], base)
            stack.cli("salt-run", "virt.purge", name, timeout=300)
            if not facts.get("backing"):
                errors.append(f"{name}: no backing file in its XML: {facts}")
                continue
            log(f"ratios: rep {rep + 1}/{args.reps}: raw libvirt rawvm{rep}")
            raws.append(raw_vm(conn, hv, base, f"rawvm{rep}", args.vcpus, args.mem, facts["type"]))
            r["raw"] = raws[-1]
            log(f"ratios: rawvm{rep}: {json.dumps(raws[-1])}")
    except Exception as exc:  # noqa: BLE001 - reported in the result
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        if conn:
            conn.close()
        if events:
            events.close()
        if stack:
            stack.stop()
        if hv:
            hv.stop()
        if fabric:
            fabric.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    errors += [f"{r['name']}: rc={r['rc']}: {r['error']}" for r in runs if r["error"]]
    ratio_rows, parts = rows(runs, raws)
    facts = next((r["facts"] for r in runs if "type" in (r.get("facts") or {})), {})
    result = {
        "title": "9b. the tutorial as ratios (issue #40)",
        "tables": [
            common.table(["ratio, median (min–max, n)", "measured", "goal", ""], ratio_rows),
            common.table(["figure, median (min–max, n)", "seconds"], parts),
        ],
        "runs": runs,
        "notes": [
            f"pairs: {args.reps} (salt-virt's VM then the raw libvirt VM, one at a time, 1 lab hypervisor); "
            f"VM size {args.vcpus} vCPU, {args.mem} MiB; image {os.path.realpath(bt.DEBIAN)}",
            f"load average before/after: {load0} / {common.loadavg()}; before each pair: {', '.join(loads)}",
            f"salt-virt's domain: type {facts.get('type')}, machine {facts.get('machine')}, cpu mode "
            f"{facts.get('cpu')}, devices {', '.join(facts.get('devices') or [])}; the raw one: the same type, "
            "libvirt's default machine and CPU, disk + NIC + serial",
        ]
        + [f"ERROR {e}" for e in errors],
    }
    common.emit("tutorial_ratios", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
