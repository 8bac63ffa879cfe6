"""Burst: N ``salt-run virt.init`` started at once against 3 hypervisor minions (one real salt-master,
plain daemons with ``-c`` dirs as bench_fleet runs them). Hypervisors are libvirt test-driver minions
(``test:///default`` kept open in the minion process by tests/support/minion_mods/svtest.py; jobs in
threads): 3072 MiB each, 2048 of it used by the driver's own running 'test' domain, so with
``mem_reserve_mib: 0`` a host has room for exactly ``1024 // mem`` VMs. The default sizes leave room
for 21 VMs of 146 MiB (7 per host) for a burst of 20.

Measured: wall time from the first start to the last answer (VMs per minute), each call's own time.
Proof that placement never overcommits: the VMs per host (virt.list) against its room, every host's
``mem_used_by_vms <= mem_total`` (virt.host_info), and how many calls the shared reservation moved
off a host whose room in-flight inits had taken (what placing from the same
snapshot alone would have piled on). Counted too: calls whose placement excluded a host because of
the reservations of in-flight inits (``excluded`` reasons), and calls whose first choice lost its
room between the snapshot and the reservation (``tried``: "no room").

    $VENV/bin/python bench/bench_burst.py [--quick] [--inits 20] [--mem 146]
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fleet
import common

FULL = {"inits": 20, "hosts": 3, "mem": 146}
QUICK = {"inits": 4, "hosts": 2, "mem": 400}
HOST_FREE_MIB = 1024  # test:///default: 3072 MiB, its 'test' domain runs with 2048


def run_init(stack, name, mem):
    """One ``salt-run virt.init`` as a user types it: wall time, exit code, its JSON answer."""
    cmd = [os.path.join(stack.bin, "salt-run"), "-c", stack.conf, "virt.init", name, "1", str(mem)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, "nic=None", "disk=None", "--out=json"], capture_output=True, text=True, timeout=900, check=False
    )
    wall = time.perf_counter() - t0
    return {"wall": wall, "rc": proc.returncode, "data": bench_fleet.last_json(proc.stdout), "err": proc.stderr[-500:]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--inits", type=int)
    ap.add_argument("--mem", type=int)
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg.update({k: getattr(args, k) for k in ("inits", "mem") if getattr(args, k)})
    room = HOST_FREE_MIB // cfg["mem"]
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svb", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    extra = {
        "virt": {
            "hypervisors": {
                "tgt": "hyper*",
                "tgt_type": "glob",
                "timeout": 30,
                "gather_job_timeout": 30,
                "max_wait": 900,
            },
            "placement": {"mem_reserve_mib": 0, "disk_reserve_mib": 0},
        }
    }
    if args.quick:
        extra.update(bench_fleet.QUICK_MASTER)
    stack = bench_fleet.Stack(
        "salt-virt",
        str(common.OUR_VENV),
        os.path.join(workdir, "s"),
        ["test:///default"] * cfg["hosts"],
        [str(common.ROOT / "_runners")],
        [str(common.ROOT / "_modules"), str(common.ROOT / "tests" / "support" / "minion_mods")],
        extra,
    )
    errors, calls = [], {}
    try:
        log(f"burst: salt-master + {cfg['hosts']} test-driver hypervisors")
        stack.start()
        held = stack.cli("salt", "hyper*", "svtest.hold", "--out=json", "--static")
        if held.returncode != 0:
            raise RuntimeError(f"svtest.hold: {held.stdout[-500:]} {held.stderr[-500:]}")
        names = [f"burst{i:02d}" for i in range(cfg["inits"])]
        log(f"burst: {len(names)} x salt-run virt.init at once ({cfg['mem']} MiB each, room for {room} per host)")
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
            futs = {n: pool.submit(run_init, stack, n, cfg["mem"]) for n in names}
            for name, fut in futs.items():
                calls[name] = fut.result()
        wall = time.perf_counter() - t0
        placed = json.loads(stack.cli("salt-run", "virt.list", "--out=json").stdout or "{}")
        facts = json.loads(stack.cli("salt-run", "virt.host_info", "--out=json").stdout or "{}")
    except Exception as exc:  # noqa: BLE001 - reported in the result
        errors.append(str(exc))
        wall, placed, facts = None, {}, {}
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    ok = [n for n, c in calls.items() if c["rc"] == 0]
    steered = 0  # calls whose placement excluded a host because of in-flight inits' reservations
    moved = 0  # calls whose first choice had lost its room to in-flight inits (the reservation moved them)
    for name, c in calls.items():
        data = c["data"] or {}
        if c["rc"] != 0:
            errors.append(f"{name}: rc={c['rc']}: {data.get('error') or c['err']}")
        moved += any(t.get("outcome") == "no room" for t in data.get("tried") or [])
        excluded = ((data.get("placement") or {}).get("excluded") or {}).values()
        steered += any("in-flight" in reason for reasons in excluded for reason in reasons)
    per_host, over = {}, []
    for host in sorted(placed):
        ours = sorted(n for n in (placed[host].get("vms") or {}) if n.startswith("burst"))
        per_host[host] = len(ours)
        h = (facts.get(host) or {}).get("host") or {}
        if len(ours) > room or (h and h.get("mem_used_by_vms", 0) > h.get("mem_total", 0)):
            over.append(host)
    times = [c["wall"] for c in calls.values()]
    st = common.summary(times)
    rate = len(ok) / wall * 60 if wall else None
    rows = [
        [
            f"{cfg['inits']} x salt-run virt.init at once, {cfg['hosts']} hosts x room for {room}",
            f"{wall:.1f} s" if wall else "-",
            f"{rate:.1f}" if rate else "-",
            common.fmt_stat(st),
            f"{len(ok)}/{cfg['inits']}",
            ", ".join(f"{h}: {n}" for h, n in per_host.items()),
            "none" if not over and per_host else ", ".join(over) or "?",
            str(steered),
            str(moved),
        ]
    ]
    if over:
        errors.append(f"OVERCOMMITTED: {', '.join(over)}")
    table = common.table(
        [
            "burst",
            "wall (first start to last answer)",
            "VMs per minute",
            "one call: median (min–max, n)",
            "created",
            "VMs per host",
            "hosts over their room",
            "calls that placement kept off a host reserved by in-flight inits",
            "calls moved after a lost compare-and-set",
        ],
        rows,
    )
    result = {
        "title": f"7. burst: {cfg['inits']} salt-run virt.init at once on {cfg['hosts']} hypervisors",
        "tables": [table],
        "raw": {"calls": calls, "per_host": per_host, "room": room, "median_call": st and statistics.median(times)},
        "notes": [f"load average before/after: {load0} / {common.loadavg()}"] + [f"ERROR {e}" for e in errors],
    }
    common.emit("burst", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
