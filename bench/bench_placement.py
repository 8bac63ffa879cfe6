"""Placement decision time: ``saltvirt.fleet.placement.rank`` over synthetic hosts shaped like the answers of
``virt.capacity`` (host facts with the group index + vm_info with anti-affinity groups), including the hosts that do
not fit (memory, vCPUs, disk, group, down, maintenance) so every branch is exercised.

For context, saltext-virt 0.1.0's runner decides with ``_determine_host``: the host with the most
``freemem``, nothing else (no vCPU, disk, anti-affinity or maintenance checks). It is timed on the same
hosts (in its own venv, its runner module file loaded as plain Python: the function uses nothing of Salt).

    bench/run --only placement        # or: $VENV/bin/python bench/bench_placement.py [--quick]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

sys.path.insert(0, str(common.ROOT / "_utils"))


def synthetic_hosts(count, vms_per_host=20, seed=42):
    """``{id: answer}`` for ``count`` hypervisors; deterministic."""
    rnd = random.Random(seed)
    hosts = {}
    for i in range(count):
        hid = f"hyper{i:05d}"
        if i % 97 == 13:
            hosts[hid] = {"status": "down", "error": "did not answer within 5 s"}
            continue
        mem_total = rnd.choice([65536, 131072, 262144, 524288])
        cpus = rnd.choice([16, 32, 64, 128])
        vm_info, groups = {}, {}
        for j in range(rnd.randint(0, vms_per_host)):
            group = rnd.choice([None, None, "web", "db", "cache"])
            vm_info[f"vm{i:05d}-{j:02d}"] = {"group": group, "state": "running", "cpu": 2, "mem": 4096}
            if group:
                groups.setdefault(group, []).append(f"vm{i:05d}-{j:02d}")
        hosts[hid] = {
            "status": "up",
            "host": {
                "mem_total": mem_total,
                "mem_used_by_vms": min(mem_total, int(mem_total * rnd.random())),
                "vcpus_total": cpus,
                "vcpus_used_by_vms": rnd.randint(0, cpus * 4),
                "disk_free": rnd.randint(1024, 4 * 1024 * 1024),
                "images_dir": "/srv/salt-images",
                "vms_defined": len(vm_info),
                "groups": groups,  # virt.capacity's group index
            },
            "vm_info": vm_info,
        }
    return hosts


SALTEXT_SNIPPET = r"""
import ast, json, sys, time, statistics
src = open(sys.argv[1]).read()
tree = ast.parse(src)
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_determine_host")
ns = {}
exec(compile(ast.Module(body=[fn], type_ignores=[]), sys.argv[1], "exec"), ns)
data = json.load(sys.stdin)
reps = int(sys.argv[2])
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    host = ns["_determine_host"](data)
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "host": host}))
"""


def saltext_determine_host(hosts, reps):
    """saltext-virt's runner decision on the same hosts, given the ``freemem`` its query reports."""
    data = {}
    for hid, ans in hosts.items():
        if ans.get("status") != "up":
            continue  # its query drops hosts that do not answer
        h = ans["host"]
        data[hid] = {"freemem": h["mem_total"] - h["mem_used_by_vms"] - 256, "vm_info": ans["vm_info"]}
    runner = os.path.join(common.saltext_module_dir("runners"), "virt.py")
    out = subprocess.run(
        [common.py(common.SALTEXT_VENV), "-c", SALTEXT_SNIPPET, runner, str(reps)],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def placement_at(rev):
    """``saltvirt.fleet.placement`` as committed at ``rev`` (git), as a module beside the working tree's."""
    import importlib.util

    src = subprocess.run(
        ["git", "-C", str(common.ROOT), "show", f"{rev}:_utils/saltvirt/fleet/placement.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader(f"placement_{rev}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(src, f"{rev}:placement.py", "exec"), mod.__dict__)
    return mod


def timed(mod, hosts, req_args):
    """One decision as the runner asks it: (wall, CPU, result)."""
    t0, c0 = time.perf_counter(), time.process_time()
    pol = mod.make_policy({"maintenance": ["hyper0001*"]})
    req = mod.make_request(**req_args)
    result = mod.rank(hosts, req, pol, top=mod.RANK_TOP)
    return time.perf_counter() - t0, time.process_time() - c0, result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hosts", default=None, help="comma-separated host counts (default 100,1000,10000)")
    ap.add_argument("--no-saltext", action="store_true", help="skip saltext-virt's row (its venv is not needed)")
    ap.add_argument(
        "--against",
        metavar="REV",
        help="also time placement.py as committed at REV (git), alternating with this tree's, and check "
        "that both give the same answer",
    )
    args = ap.parse_args(argv)
    from saltvirt.fleet import placement

    before = placement_at(args.against) if args.against else None

    counts = (
        [int(c) for c in args.hosts.split(",")] if args.hosts else ([10, 100] if args.quick else [100, 1000, 10000])
    )
    load0 = common.loadavg()
    rows, details = [], {}
    for count in counts:
        hosts = synthetic_hosts(count)
        reps = 3 if args.quick else max(5, min(200, 200_000 // count))
        cases = {
            "1 vCPU / 2 GiB": dict(cpu=1, mem=2048, disk_mib=10240),
            "4 vCPU / 16 GiB, group web": dict(cpu=4, mem=16384, disk_mib=40960, group="web"),
        }
        for label, req_args in cases.items():
            times, cpu, result = [], [], None
            old_times, old_cpu = [], []
            for _ in range(reps):
                wall, used, result = timed(placement, hosts, req_args)
                times.append(wall)
                cpu.append(used)
                if before is not None:  # alternate, so that load from elsewhere hits both
                    wall, used, old = timed(before, hosts, req_args)
                    old_times.append(wall)
                    old_cpu.append(used)
                    if old != result:
                        raise SystemExit(f"{count} hosts, {label}: {args.against} answers differently")
            if before is not None:
                st, cst = common.summary(old_times), common.summary(old_cpu)
                details[f"{count}/{label}/{args.against}"] = {"stat": st, "cpu": cst}
                rows.append(
                    [
                        count,
                        f"{label}, as of {args.against} (same answer)",
                        common.fmt_stat(st),
                        common.fmt_stat(cst),
                        common.fmt_s(st["median"] / count),
                        result["host"],
                    ]
                )
            st, cst = common.summary(times), common.summary(cpu)
            details[f"{count}/{label}"] = {
                "stat": st,
                "cpu": cst,
                "host": result["host"],
                "fit": result["fit"],
                "excluded": len(result["excluded"]),
            }
            rows.append(
                [
                    count,
                    label,
                    common.fmt_stat(st),
                    common.fmt_stat(cst),
                    common.fmt_s(st["median"] / count),
                    f"{result['host']} ({result['fit']} fit, {len(result['excluded'])} excluded)",
                ]
            )
        if args.no_saltext:
            continue
        theirs = saltext_determine_host(hosts, reps)
        st = common.summary(theirs["times"])
        details[f"{count}/saltext"] = {"stat": st, "host": theirs["host"]}
        rows.append(
            [
                count,
                "saltext-virt `_determine_host` (most freemem only)",
                common.fmt_stat(st),
                "—",
                common.fmt_s(st["median"] / count),
                theirs["host"],
            ]
        )
    tbl = common.table(
        ["hosts", "decision", "wall median (min–max, n)", "CPU time of the process", "per host (wall)", "chosen"],
        rows,
    )
    result = {
        "title": "4. placement decision time",
        "details": details,
        "tables": [tbl],
        "notes": [
            f"load average before/after: {load0} / {common.loadavg()}",
            "salt-virt time = make_policy + make_request + rank (every host checked and scored, "
            "reasons for every excluded host, the best RANK_TOP listed as the runner lists them); CPU time "
            "(time.process_time) beside wall time: on a loaded machine wall time is mostly waiting for a CPU",
        ],
    }
    common.emit("placement", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
