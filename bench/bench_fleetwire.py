"""The fleet at 20,000 VMs (issue #40): ``salt-run virt.list`` / ``virt.query`` on a real salt-master, real wire.

Real: the salt-master (its ReqServer workers decrypt each return, write its job cache, fire its event bus), the
``salt-run`` CLI (a fresh process per command: start-up, the runner, Salt's key store, the publication, the
wait on the bus, the verification of every answer with that hypervisor's accepted key, the outputter), and H
minion identities, each with its own key pair, authenticated with Salt's own request channel and returning as
a minion does. Simulated: the hypervisors' work (bench/simhyper.py: each answer is the real ``virt.full_info``
of a test:/// node of D domains, renamed per host, computed once; per request only the signature is made).

Floor (plain Salt, the same answers over the same wire): ``salt 'hyper*' virt.answer fun=... --static
--out=json``: one publication, every return gathered and printed, nothing verified, nothing rendered. Commands
run interleaved (floor, ours, floor, ours, ...) so load hits both alike. Memory: the CLI's peak RSS (wait4) and
the salt-master's processes (sum of VmRSS sampled every 0.1 s during the commands, and the largest VmHWM).

    $VENV/bin/python bench/bench_fleetwire.py [--sizes 20,50,100,200] [--domains 100] [--reps 5]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fleet
import common
import nodexml
import worker

VM_LINE = re.compile(r"^  h\d{3}vm\d{3}(:|$)", re.M)


def template(workdir, domains):
    """The real ``virt.full_info`` of a test:/// node of ``domains`` domains (our module, Salt's loader)."""
    uri = nodexml.write_node(os.path.join(workdir, "nodes"), domains, prefix="tvm")
    spec = {"module_dirs": [str(common.ROOT / "_modules")], "virt": {"connection": {"uri": uri}}}
    fi = worker.minion_mods(spec, os.path.join(workdir, "tmpl"))["virt.full_info"]()
    path = os.path.join(workdir, "full_info.json")
    with open(path, "w") as fh:
        json.dump(fi, fh, default=str)
    return path


def make_identities(base, count, log):
    sys.path.insert(0, str(common.ROOT / "_utils"))
    from saltvirt.pki import envelope

    pubs = {}
    for i in range(count):
        mid = f"hyper{i:03d}"
        pki = os.path.join(base, mid, "pki")
        os.makedirs(pki, exist_ok=True)
        pub, priv = envelope.new_keypair()
        for name, text in (("minion.pub", pub), ("minion.pem", priv)):
            with open(os.path.join(pki, name), "w") as fh:
                fh.write(text)
        os.chmod(os.path.join(pki, "minion.pem"), 0o400)
        pubs[mid] = pub
    log(f"fleetwire: {count} key pairs made")
    return pubs


def accept(stack, pubs, count):
    """The master's accepted keys: exactly hyper000..hyper<count-1> (the hypervisors the runner expects)."""
    keys = stack.pki_dir("minions")
    os.makedirs(keys, exist_ok=True)
    for name in os.listdir(keys):
        os.unlink(os.path.join(keys, name))
    for mid in sorted(pubs)[:count]:
        with open(os.path.join(keys, mid), "w") as fh:
            fh.write(pubs[mid])


class MasterSampler(threading.Thread):
    """Peak of the salt-master's summed VmRSS while it runs (0.1 s samples)."""

    def __init__(self, stack):
        super().__init__(daemon=True)
        self.stack, self.peak, self.stop = stack, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            pids = bench_fleet.session_pids(self.stack.procs[0].pid)
            self.peak = max(self.peak, sum(bench_fleet.status_kib(p, "VmRSS") or 0 for p in pids))
            time.sleep(0.1)


def timed(stack, args):
    """Wall time, CPU and peak RSS of one CLI command. The peak is GNU time's %M: wait4's ru_maxrss of a child
    forked from this (large) process starts at this process's RSS, so it is measured from a small parent."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, tempfile.NamedTemporaryFile() as rss:
        t0 = time.perf_counter()
        cmd = ["/usr/bin/time", "-f", "%M %U %S", "-o", rss.name, os.path.join(stack.bin, args[0]), "-c", stack.conf]
        proc = subprocess.Popen([*cmd, *args[1:]], stdout=out, stderr=err)
        proc.wait()
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        with open(rss.name) as fh:
            maxrss, user, system = fh.read().split()[-3:]
    return {
        "wall": wall,
        "maxrss_kib": int(maxrss),
        "cpu": float(user) + float(system),
        "rc": proc.returncode,
        "stdout": stdout,
        "tail": (stderr or stdout)[-600:],
    }


def commands(replay):
    floor = ("salt", "hyper*", "virt.answer", "nonce=nfloor", "--out=json", "-t", "60")
    return {
        # no --static: that goes through Salt's batch path (a test.ping round first)
        "floor: salt 'hyper*' virt.answer fun=virt.vm_state": (*floor[:3], "fun=virt.vm_state", *floor[3:]),
        "salt-run virt.list": ("salt-run", "virt.list"),
        "floor: salt 'hyper*' virt.answer fun=virt.host_info": (*floor[:3], "fun=virt.host_info", *floor[3:]),
        "salt-run virt.host_info": ("salt-run", "virt.host_info"),
        "floor: salt-run returning the recorded virt.query answer": ("salt-run", "benchreplay.query", f"path={replay}"),
        "salt-run virt.query": ("salt-run", "virt.query"),
        "salt-run virt.query --out=json": ("salt-run", "virt.query", "--out=json"),
    }


def all_json(text):
    dec, pos, docs = json.JSONDecoder(), 0, []
    while (start := text.find("{", pos)) >= 0:
        try:
            doc, pos = dec.raw_decode(text, start)
            docs.append(doc)
        except ValueError:
            pos = start + 1
    return docs


def counted(label, run):
    """(hosts, VMs) the command's output shows."""
    if label == "salt-run virt.host_info":  # per host: "  VMs: <running> running, <defined> defined"
        defined = re.findall(r"^  VMs: \d+ running, (\d+) defined$", run["stdout"], re.M)
        return len(re.findall(r"^hyper\d{3}  up", run["stdout"], re.M)), sum(int(n) for n in defined)
    if "recorded" in label:
        return len(re.findall(r"^hyper\d{3}  up", run["stdout"], re.M)), len(VM_LINE.findall(run["stdout"]))
    if label.startswith("floor"):
        docs = all_json(run["stdout"])  # one document per minion, as each return arrives
        return len(docs), sum(1 for d in docs for v in d.values() if isinstance(v, dict) and v.get("sig"))
    if "--out=json" in label:
        return bench_fleet.count_vms("salt-virt", bench_fleet.last_json(run["stdout"]))
    hosts = len(re.findall(r"^hyper\d{3}  up", run["stdout"], re.M))
    return hosts, len(VM_LINE.findall(run["stdout"]))


def record_replay(stack, path):
    """The runner's own answer (``salt-run virt.query --out=json``, untimed) as the replay floor's data."""
    import salt.payload

    run = timed(stack, ("salt-run", "virt.query", "--out=json"))
    data = bench_fleet.last_json(run["stdout"]) or {}
    with open(path, "wb") as fh:
        fh.write(salt.payload.dumps(data.get("data", data), use_bin_type=True))


def _check(label, run, hosts, want):
    if run["rc"] != 0:
        return f"rc={run['rc']}: {run['tail']}"
    if label.startswith("floor: salt ") and run["counted"] != (hosts, hosts):
        return f"saw {run['counted'][0]} returns, {run['counted'][1]} signed, want {hosts}"
    if not label.startswith("floor: salt ") and run["counted"] != want:
        return f"saw {run['counted']}, want {want}"
    return None


def run_size(stack, spec, hosts, cfg, log):
    accept(stack, spec["pubs"], hosts)
    path = os.path.join(spec["workdir"], f"sim-{hosts}.json")
    with open(path, "w") as fh:
        json.dump(dict(spec["sim"], hosts=hosts), fh)
    with open(os.path.join(spec["workdir"], f"sim-{hosts}.err"), "w") as err:
        sim = subprocess.Popen(
            [sys.executable, str(common.BENCH / "simhyper.py"), path],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    sim_log = []
    try:
        line = sim.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"simulator did not start: {line!r}")
        threading.Thread(target=lambda: sim_log.extend(sim.stdout), daemon=True).start()
        replay = os.path.join(spec["workdir"], f"replay-{hosts}.msgpack")
        record_replay(stack, replay)
        cmds = commands(replay)
        results = {label: [] for label in cmds}
        sampler = MasterSampler(stack)
        sampler.start()
        load0 = common.loadavg()
        for cmd in cmds.values():  # one untimed run of each first: the master's first job per key fills caches
            timed(stack, cmd)
        for rep in range(cfg["reps"]):
            for label, cmd in cmds.items():
                log(f"fleetwire {hosts} hosts: {label} {rep + 1}/{cfg['reps']}")
                seen = len(sim_log)
                run = timed(stack, cmd)
                run["counted"] = counted(label, run)
                # the simulated hypervisors' side: from the publication seen to the master taking the last return
                wire = [float(ln.rsplit(" in ", 1)[1].rstrip("s\n")) for ln in sim_log[seen:] if "virt.answer" in ln]
                run["wire"] = max(wire) if wire else None
                run.pop("stdout")
                results[label].append(run)
        load1 = common.loadavg()
        sampler.stop.set()
        sampler.join()
        pids = bench_fleet.session_pids(stack.procs[0].pid)
        hwm = max((bench_fleet.status_kib(p, "VmHWM") or 0) for p in pids)
        rows, errors = [], []
        want = (hosts, hosts * cfg["domains"])
        for label, runs in results.items():
            bad = [(r, _check(label, r, hosts, want)) for r in runs]
            errors += [f"{hosts} hosts, {label}: {why}" for _r, why in bad if why]
            good = [r for r, why in bad if not why]
            rows.append(
                {
                    "hosts": hosts,
                    "vms": hosts * cfg["domains"],
                    "func": label,
                    "wall": common.summary([r["wall"] for r in good]),
                    "cpu": common.summary([r["cpu"] for r in good]),
                    "wire": common.summary([r["wire"] for r in good]),
                    "cli_rss_kib": common.summary([r["maxrss_kib"] for r in good]),
                    "seen": good[0]["counted"] if good else None,
                }
            )
        rows.append(
            {"hosts": hosts, "func": "master", "rss_peak_kib": sampler.peak, "hwm_kib": hwm, "load": [load0, load1]}
        )
        return rows, errors
    finally:
        common.stop_groups([sim], 5)


FLOOR_OF = {
    "salt-run virt.list": "floor: salt 'hyper*' virt.answer fun=virt.vm_state",
    "salt-run virt.host_info": "floor: salt 'hyper*' virt.answer fun=virt.host_info",
    "salt-run virt.query": "floor: salt-run returning the recorded virt.query answer",
    "salt-run virt.query --out=json": "floor: salt-run returning the recorded virt.query answer",
}


def render(rows, cfg):
    body = []
    for r in rows:
        if r["func"] == "master":
            continue
        floor = next((x for x in rows if x["hosts"] == r["hosts"] and x["func"] == FLOOR_OF.get(r["func"])), None)
        per = r["wall"]["median"] / r["vms"] * 1e6 if r["wall"] else None
        body.append(
            [
                f"{r['hosts']} x {cfg['domains']} = {r['vms']}",
                r["func"],
                common.fmt_stat(r["wall"]),
                common.ratio(r["wall"] and r["wall"]["median"], floor and floor["wall"] and floor["wall"]["median"]),
                "—" if per is None else f"{per:.0f} µs",
                common.fmt_s(r["wire"] and r["wire"]["median"]),
                common.fmt_s(r["cpu"] and r["cpu"]["median"]),
                common.fmt_mib(r["cli_rss_kib"] and r["cli_rss_kib"]["max"]),
            ]
        )
    mem = [
        [r["hosts"], common.fmt_mib(r["rss_peak_kib"]), common.fmt_mib(r["hwm_kib"]), " → ".join(r["load"])]
        for r in rows
        if r["func"] == "master"
    ]
    head = ["hosts x VMs", "command", "time", "/ its floor", "per VM", "wire (sim)", "CLI CPU", "CLI peak RSS"]
    return [
        "**Real salt-master, real wire, simulated hypervisors** (whole command, fresh process, median "
        "(min–max, n)); wire: the simulated hypervisors' side, publication seen to the last return taken\n\n"
        + common.table(head, body),
        "**salt-master memory during the commands** (all its processes)\n\n"
        + common.table(["hosts", "sum of VmRSS, peak", "largest process VmHWM", "load (1/5/15) start → end"], mem),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="20,50,100,200")
    ap.add_argument("--domains", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 and 4 hosts of 5 domains, once (bench/run --quick)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.domains, args.reps = "2,4", 5, 1
    cfg = {"sizes": [int(s) for s in args.sizes.split(",")], "domains": args.domains, "reps": args.reps}
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svw", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    rows, errors = [], []
    stack = bench_fleet.Stack(
        "salt-virt",
        str(common.OUR_VENV),
        os.path.join(workdir, "stack"),
        [],
        [str(common.ROOT / "_runners"), str(common.BENCH / "runners")],
        [str(common.ROOT / "_modules")],
        {
            "virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 30, "gather_job_timeout": 30}},
            "worker_threads": 5,
            "outputter_dirs": [str(common.ROOT / "_output")],  # what saltutil.sync_all gives an installed master
        },
    )
    try:
        tmpl = template(workdir, cfg["domains"])
        pubs = make_identities(os.path.join(workdir, "sim"), max(cfg["sizes"]), log)
        stack.start(timeout=120)
        spec = {
            "workdir": workdir,
            "pubs": pubs,
            "sim": {
                "base": os.path.join(workdir, "sim"),
                "template": tmpl,
                "domains": cfg["domains"],
                "ret_port": stack.ret_port,
                "master_conf": os.path.join(stack.conf, "master"),
                "utils": str(common.ROOT / "_utils"),
            },
        }
        for hosts in cfg["sizes"]:
            got, errs = run_size(stack, spec, hosts, cfg, log)
            rows += got
            errors += errs
    finally:
        stack.stop()
        if os.environ.get("FLEETWIRE_KEEP"):
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "title": "fleet at 20,000 VMs: salt-run virt.list / virt.query, real master and wire",
        "rows": rows,
        "tables": render(rows, cfg),
        "notes": [f"load average before/after: {load0} / {common.loadavg()}"] + [f"ERROR {e}" for e in errors],
    }
    common.emit("fleetwire", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
