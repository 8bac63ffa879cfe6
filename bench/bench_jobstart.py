"""A hypervisor's job round trip (issue 40): ``salt hyper virt.vm_state`` on a minion with Salt's default
``multiprocessing: True`` (each job a fork of the minion's main process), against plain Salt's ``test.ping`` on
the same minion (the floor: publication, fork, return) and against a second minion that has the library
loaded only by its jobs (``virt_hypervisor: False``: the grain then leaves the main process alone, as every
minion was before the grain imported the library there). Both minions drive a test:/// node; commands run
interleaved, each a fresh ``salt`` CLI, so load falls on all three alike.

    $VENV/bin/python bench/bench_jobstart.py [--reps 15] [--quick]
"""

import argparse
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

CASES = {
    "floor: `salt hyper00 test.ping`": ("hyper00", "test.ping"),
    "`salt hyper00 virt.vm_state` (library loaded in the main process)": ("hyper00", "virt.vm_state"),
    "`salt hyper01 virt.vm_state` (loaded by each job)": ("hyper01", "virt.vm_state"),
}


class JobStack(bench_fleet.Stack):
    """bench_fleet's stack with Salt's default multiprocessing (bench_fleet runs jobs in threads) and the grain."""

    def configure(self):
        super().configure()
        for mid, d in zip(self.minion_ids, self.minion_confs, strict=True):
            path = os.path.join(d, "minion")
            with open(path) as fh:
                cfg = json.load(fh)
            cfg.update(multiprocessing=True, grains_dirs=[str(common.ROOT / "_grains")])
            if mid == "hyper01":
                cfg["virt_hypervisor"] = False
            self._write(path, cfg)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    args = ap.parse_args(argv)
    reps = 2 if args.quick else args.reps
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    workdir = tempfile.mkdtemp(prefix="svj", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    stack = JobStack(
        "salt-virt",
        str(common.OUR_VENV),
        os.path.join(workdir, "stack"),
        ["test:///default", "test:///default"],
        [str(common.ROOT / "_runners")],
        [str(common.ROOT / "_modules")],
    )
    times = {label: [] for label in CASES}
    load0 = common.loadavg()
    try:
        stack.start(timeout=120)
        salt = os.path.join(stack.bin, "salt")
        for rep in range(reps + 1):  # the first round untimed: each minion's first job fills its caches
            for label, (mid, fun) in CASES.items():
                t0 = time.perf_counter()
                run = subprocess.run(
                    [salt, "-c", stack.conf, mid, fun, "--out=json", "-t", "60"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                took = time.perf_counter() - t0
                if run.returncode != 0 or mid not in json.loads(run.stdout or "{}"):
                    raise RuntimeError(f"{mid} {fun}: rc={run.returncode} {run.stdout[-300:]} {run.stderr[-300:]}")
                if rep:
                    times[label].append(took)
            log(f"jobstart: round {rep}/{reps}")
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    floor = statistics.median(times[next(iter(CASES))])
    rows = []
    for label, got in times.items():
        med = statistics.median(got)
        spread = f"{med * 1000:.0f} ms ({min(got) * 1000:.0f}–{max(got) * 1000:.0f}, n={len(got)})"
        rows.append([label, spread, f"+{(med - floor) * 1000:.0f} ms" if med != floor else "—"])
    result = {
        "title": "a hypervisor's job round trip: the library in the minion's main process or loaded by each job",
        "rows": {label: got for label, got in times.items()},
        "tables": [
            common.table(["command (each a fresh `salt` CLI)", "wall, median (min–max, n)", "over the floor"], rows)
        ],
        "notes": [f"load average before/after: {load0} / {common.loadavg()}"],
    }
    common.emit("jobstart", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
