"""bench/run's driver: runs each bench script in its own process, prints one markdown report.

Each script is also runnable alone (``$VENV/bin/python bench/bench_<name>.py [--quick]``).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

BENCHES = ["placement", "clone", "query", "init", "fleet", "burst", "scale", "tutorial", "resources", "ha"]
BENCHES += ["backup", "pushplace", "migrate", "fleetwire", "jobstart"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="salt-virt benchmarks")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks that every script runs")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--out", help="also write the markdown report to this file")
    args = ap.parse_args(argv)
    selected = args.only.split(",") if args.only else BENCHES
    unknown = set(selected) - set(BENCHES)
    if unknown:
        ap.error(f"unknown bench(es) {', '.join(sorted(unknown))}; known: {', '.join(BENCHES)}")
    facts = common.machine_facts()
    json_dir = tempfile.mkdtemp(prefix="svbench-json")
    env = dict(os.environ, BENCH_JSON_DIR=json_dir)
    cmd_line = "bench/run" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    report = [
        "# salt-virt benchmark run",
        "",
        f"- command: `{cmd_line}`",
        f"- date: {facts['date']}",
        f"- machine: {facts['cpus']} CPUs ({facts['cpu_model']}), {facts['mem_gib']} GiB RAM, "
        f"kernel {facts['kernel']}, "
        f"Python {facts['python']}, {facts['libvirtd']}, {facts['qemu']}; guests run under TCG (type qemu)",
        f"- load average at start: {facts['loadavg_start']}",
    ]
    failed = []
    for name in BENCHES:
        if name not in selected:
            continue
        script = os.path.join(common.BENCH, f"bench_{name}.py")
        t0 = time.perf_counter()
        print(f"[bench] === {name} ===", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, script] + (["--quick"] if args.quick else []),
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            check=False,  # a failing bench is listed, the others still run
        )
        took = time.perf_counter() - t0
        report.append(proc.stdout.rstrip())
        report.append(f"\n_{name}: {took:.0f} s, exit {proc.returncode}_")
        if proc.returncode != 0:
            failed.append(name)
    report.append(f"\n- load average at end: {common.loadavg()}")
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    summary = {"failed": failed, "json_dir": json_dir, "facts": facts}
    print(json.dumps(summary), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
