"""Fleet scale: ``salt-run virt.query`` and ``salt-run virt.next_host`` as the fleet grows.

Part 1, real daemons: one salt-master + M hypervisor minions (default 50), each on a test:/// node of D
domains (default 100), jobs in threads (bench_fleet.Stack). Timed: the whole CLI command (fresh process),
beside the plain fan-out ``salt -G virtual:physical virt.full_info``; memory: the CLI's peak RSS (the
runner runs inside salt-run) and the salt-master's processes (largest VmHWM, total RSS).

Part 2, synthetic answers: 100 / 1,000 / 10,000 hypervisors (20 VMs each, bench_placement's hosts, 1 %
down) fed through the runner's own code: ``virt.query`` / ``virt.next_host`` loaded by Salt's runner
loader from ``_runners``, the master's real key store (N accepted keys) and ``virt:hypervisors``
target, ``saltvirt.fleet.publish.Fleet.run``'s classification, ``gather``'s shaping and ``placement.rank``. Only the
transport is replaced: LocalClient is a stand-in that hands back the synthetic answers at once (no
network: what is timed is the aggregation and placement work of the master). One call per fresh process;
memory: VmHWM growth of that process over its RSS before the call (the answers are built before, then
the peak is reset: /proc/self/clear_refs).

    bench/run --only scale            # or: $VENV/bin/python bench/bench_scale.py [--quick] [--minions 50]
    bench/plot.py                     # the PNG (time against size) from the JSON of query and scale
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fleet
import common
import nodexml

FULL = {"minions": 50, "domains": 100, "reps": 3, "sizes": [100, 1000, 10000], "syn_reps": {100: 5, 1000: 5, 10000: 3}}
# --quick: the 50 synthetic hosts keep their down host (hyper00013), given up after 1 + 1 s instead of the
# runner's default 5 + 20 s (virt:hypervisors timeout, down_after): a smoke test waits for nothing
QUICK = {
    "minions": 1,
    "domains": 5,
    "reps": 1,
    "sizes": [10, 50],
    "syn_reps": {10: 1, 50: 1},
    "syn_waits": {"timeout": 1, "down_after": 1},
    "master": bench_fleet.QUICK_MASTER,
}
SYN_VMS = 20


# part 2: one synthetic measurement in a fresh process ------------------------------------------------
class SyntheticClient:
    """LocalClient's part that saltvirt.fleet.publish.Fleet.run uses, answering every published job at once, each
    answer signed (saltvirt.pki.answers) with one key all synthetic hosts share: their signing runs inside the
    measured call, so the figures overstate the master's own share a little."""

    def __init__(self, answers, pki):
        self.answers, self.pki, self.queue = answers, pki, []
        self.event = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        from saltvirt.pki import answers as signed

        jid = jid or "20261124000000000000"
        for mid in tgt:
            ans = self.answers.get(mid)
            if ans is not None and kwarg["fun"] != signed.JOB_CHECK:  # a down host never answers
                ret = signed.sign(self.pki, mid, kwarg["fun"], kwarg["nonce"], ans)
                self.queue.append({"tag": f"salt/job/{jid}/ret/{mid}", "data": {"id": mid, "return": ret}})
        return {"jid": jid, "minions": list(tgt)}

    def get_event(self, tag="", wait=0, no_block=False, **_kw):
        if self.queue and str(self.queue[-1]["tag"]).startswith(tag):
            return self.queue.pop()
        if not no_block:  # the master's bus blocks this long when nothing comes (publish._wait reads so)
            time.sleep(wait)
        return None

    def _clean_up_subscriptions(self, jid):
        pass


def child(spec):
    import salt.client
    import salt.config
    import salt.loader
    import salt.runner

    sys.path.insert(0, os.path.join(str(common.ROOT), "bench"))
    from bench_placement import synthetic_hosts
    from worker import vm_hwm_kib, vm_rss_kib

    from saltvirt.pki import envelope

    workdir = tempfile.mkdtemp(prefix="svscale")
    try:
        opts = salt.config.master_config(None)
        opts.update(
            {
                "root_dir": workdir,
                "pki_dir": os.path.join(workdir, "pki"),
                "cachedir": os.path.join(workdir, "cache"),
                "sock_dir": os.path.join(workdir, "sock"),
                "conf_file": os.path.join(workdir, "master"),
                "runner_dirs": [str(common.ROOT / "_runners")],
                "virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", **spec.get("waits", {})}},
            }
        )
        hosts = synthetic_hosts(spec["hosts"], vms_per_host=SYN_VMS)
        keys = os.path.join(opts["pki_dir"], "minions")
        os.makedirs(keys)
        pub, priv = envelope.new_keypair()  # one key the synthetic hypervisors share
        minion_pki = os.path.join(workdir, "minion-pki")
        os.makedirs(minion_pki)
        with open(os.path.join(minion_pki, "minion.pem"), "w") as fh:
            fh.write(priv)
        for mid in hosts:  # the master's accepted keys: who the hypervisors are
            with open(os.path.join(keys, mid), "w") as fh:
                fh.write(pub)
        answers = {mid: {"host": h["host"], "vm_info": h["vm_info"]} for mid, h in hosts.items() if h["status"] == "up"}
        del hosts
        salt.client.get_local_client = lambda *a, **k: SyntheticClient(answers, minion_pki)
        runners = salt.loader.runner(opts, utils=salt.loader.utils(opts))
        func = runners[spec["func"]]
        gc.collect()
        with open("/proc/self/clear_refs", "w") as fh:  # VmHWM := VmRSS now: the peak of the call alone
            fh.write("5")
        rss0 = vm_rss_kib()
        t0 = time.perf_counter()
        ret = func(**spec.get("kwargs", {}))
        wall = time.perf_counter() - t0
        hwm = vm_hwm_kib()
        data = ret.get("data", ret) if isinstance(ret, dict) else ret
        if spec["func"] == "virt.query":
            seen = {
                "hosts": len(data),
                "up": sum(1 for a in data.values() if a.get("status") == "up"),
                "vms": sum(len(a.get("vm_info") or {}) for a in data.values()),
            }
        else:
            fit = data.get("fit", len(data.get("ranking") or []))  # the runner lists the best RANK_TOP of them
            seen = {"host": data.get("host"), "ranked": fit, "error": data.get("error")}
        return {"ok": True, "wall": wall, "rss_before_kib": rss0, "hwm_kib": hwm, "seen": seen}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


SYN_FUNCS = {
    "virt.query": {},
    "virt.next_host": {"cpu": 2, "mem": 4096},
}


def run_synthetic(cfg, log):
    rows = []
    for size in cfg["sizes"]:
        for func, kwargs in SYN_FUNCS.items():
            runs = []
            spec = {"hosts": size, "func": func, "kwargs": kwargs, "waits": cfg.get("syn_waits", {})}
            for rep in range(cfg["syn_reps"][size]):
                log(f"scale synthetic {func} {size} hosts {rep + 1}/{cfg['syn_reps'][size]}")
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    check=False,
                )
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                runs.append(json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr[-2000:]})
            ok = [r for r in runs if r.get("ok")]
            rows.append(
                {
                    "part": "synthetic",
                    "size": size,
                    "func": func,
                    "wall": common.summary([r["wall"] for r in ok]),
                    "growth_kib": common.summary([r["hwm_kib"] - r["rss_before_kib"] for r in ok]),
                    "hwm_kib": common.summary([r["hwm_kib"] for r in ok]),
                    "seen": ok[0]["seen"] if ok else None,
                    "errors": [r.get("error") for r in runs if not r.get("ok")],
                }
            )
    return rows


# part 1: real salt-master + minions ----------------------------------------------------------------------
REAL_COMMANDS = {
    "salt-run virt.query": ("salt-run", "virt.query", "--out=json"),
    "salt-run virt.next_host": ("salt-run", "virt.next_host", "cpu=1", "mem=256", "--out=json"),
    "salt -G virtual:physical virt.full_info (plain fan-out)": bench_fleet.COMMANDS[
        "salt -G virtual:physical virt.full_info"
    ],
}


def master_memory(stack):
    """(largest VmHWM, total VmRSS) over the salt-master's processes, KiB."""
    pids = bench_fleet.session_pids(stack.procs[0].pid)
    hwm = [bench_fleet.status_kib(p, "VmHWM") or 0 for p in pids]
    rss = [bench_fleet.status_kib(p, "VmRSS") or 0 for p in pids]
    return (max(hwm) if hwm else None), sum(rss)


def run_real(cfg, workdir, log):
    rows, errors = [], []
    nodes = [
        nodexml.write_node(os.path.join(workdir, "nodes"), cfg["domains"], prefix=f"h{i:02d}vm")
        for i in range(cfg["minions"])
    ]
    stack = bench_fleet.Stack(
        "salt-virt",
        str(common.OUR_VENV),
        os.path.join(workdir, "stack"),
        nodes,
        [str(common.ROOT / "_runners")],
        [str(common.ROOT / "_modules")],
        # a saturated 2-core machine (50 minion daemons) answers Salt's find_job slowly: with the default
        # 5 s + 5 s a busy minion is reported down; the bench wants every answer
        {
            "virt": {
                "hypervisors": {
                    "tgt": "hyper*",
                    "tgt_type": "glob",
                    "timeout": 60,
                    "gather_job_timeout": 60,
                    "max_wait": 900,
                }
            },
            **cfg.get("master", {}),
        },
    )
    log(f"scale: starting salt-master + {cfg['minions']} minions x {cfg['domains']} domains")
    t0 = time.perf_counter()
    try:
        stack.start(timeout=900)
        log(f"scale: all minions answer after {time.perf_counter() - t0:.1f}s")
        mem0 = master_memory(stack)
        results = {label: [] for label in REAL_COMMANDS}
        loads = []
        for rep in range(cfg["reps"]):
            for label, cmd in REAL_COMMANDS.items():
                log(f"scale: {label} {rep + 1}/{cfg['reps']}")
                loads.append(common.loadavg())
                results[label].append(bench_fleet.timed(stack, *cmd))
        mem1 = master_memory(stack)
        expected = cfg["minions"] * cfg["domains"]
        for label, runs in results.items():
            good = []
            for r in runs:
                if r["rc"] != 0:
                    errors.append(f"{label}: rc={r['rc']}: {r['tail']}")
                elif "next_host" not in label and r["counted"][1] != expected:
                    errors.append(f"{label}: saw {r['counted'][1]}/{expected} VMs")
                else:
                    good.append(r)
            rows.append(
                {
                    "part": "real",
                    "size": cfg["minions"],
                    "func": label,
                    "wall": common.summary([r["wall"] for r in good]),
                    "cli_rss_kib": common.summary([r["maxrss_kib"] for r in good]),
                    "seen": good[0]["counted"] if good else None,
                }
            )
        rows.append(
            {
                "part": "real-master",
                "size": cfg["minions"],
                "master_hwm_kib": mem1[0],
                "master_rss_before_kib": mem0[1],
                "master_rss_after_kib": mem1[1],
                "loads": loads,
            }
        )
    except Exception as exc:  # noqa: BLE001 - reported
        errors.append(f"real stack: {exc}")
    finally:
        stack.stop()
    return rows, errors


def render(rows, cfg):
    tables = []
    real = [r for r in rows if r["part"] == "real"]
    if real:
        fanout = next((r for r in real if "fan-out" in r["func"]), None)
        base = fanout and fanout["wall"] and fanout["wall"]["median"]
        body = [
            [
                r["func"],
                common.fmt_stat(r["wall"]),
                f"**{common.ratio(r['wall'] and r['wall']['median'], base)}**",
                common.fmt_mib(r["cli_rss_kib"] and r["cli_rss_kib"]["median"]),
                f"{r['seen'][0]} hosts, {r['seen'][1]} VMs" if r["seen"] and "next_host" not in r["func"] else "—",
            ]
            for r in real
        ]
        mem = next((r for r in rows if r["part"] == "real-master"), {})
        tables.append(
            f"**{cfg['minions']} hypervisor minions x {cfg['domains']} domains (test driver), real salt-master**, "
            "whole command, median (min–max, n)\n\n"
            + common.table(["command", "time", "vs plain fan-out", "CLI peak RSS", "answer"], body)
            + f"\n\nsalt-master processes: largest VmHWM {common.fmt_mib(mem.get('master_hwm_kib'))}; "
            f"total RSS {common.fmt_mib(mem.get('master_rss_before_kib'))} before the commands, "
            f"{common.fmt_mib(mem.get('master_rss_after_kib'))} after"
        )
    syn = [r for r in rows if r["part"] == "synthetic"]
    if syn:
        body = []
        for r in syn:
            per = r["wall"]["median"] / r["size"] if r["wall"] else None
            seen = r["seen"] or {}
            what = (
                f"{seen.get('up')}/{seen.get('hosts')} up, {seen.get('vms')} VMs"
                if r["func"] == "virt.query"
                else f"{seen.get('host')} ({seen.get('ranked')} fit)"
            )
            body.append(
                [
                    r["size"],
                    r["func"],
                    common.fmt_stat(r["wall"]),
                    common.fmt_s(per),
                    f"+{common.fmt_mib(r['growth_kib'] and r['growth_kib']['median'])}",
                    what,
                ]
            )
        tables.append(
            f"**Synthetic host answers ({SYN_VMS} VMs each) through the runner's own code** (transport "
            "replaced), one call per fresh process, median (min–max, n)\n\n"
            + common.table(["hosts", "runner function", "time", "per host", "memory growth (VmHWM)", "answer"], body)
        )
    return tables


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--minions", type=int)
    ap.add_argument("--domains", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--sizes", help="synthetic host counts, comma-separated (default 100,1000,10000)")
    ap.add_argument("--skip-real", action="store_true", help="synthetic part only")
    ap.add_argument("--skip-synthetic", action="store_true", help="real daemons only")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("minions", "domains", "reps"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    if args.sizes:
        cfg["sizes"] = [int(s) for s in args.sizes.split(",")]
        cfg["syn_reps"] = {s: cfg["syn_reps"].get(s, 3) for s in cfg["sizes"]}
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svs", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    rows, errors = [], []
    try:
        if not args.skip_synthetic:
            rows += run_synthetic(cfg, log)
        if not args.skip_real:
            real_rows, errors = run_real(cfg, workdir, log)
            rows += real_rows
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    errors += [f"synthetic {r['func']} {r['size']}: {e}" for r in rows if r["part"] == "synthetic" for e in r["errors"]]
    result = {
        "title": "8. fleet scale: salt-run virt.query / virt.next_host",
        "rows": rows,
        "tables": render(rows, cfg),
        "notes": [f"load average before/after: {load0} / {common.loadavg()}"] + [f"ERROR {e}" for e in errors],
    }
    common.emit("scale", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
