"""Fleet query: a real salt-master + 10 minions, each minion's ``virt:connection:uri`` a test:/// node
with 100 domains (1,000 VMs in all). Two stacks, one after the other, each in its own venv with its
own master and minions (plain daemons with ``-c`` dirs, as scripts/demo.py runs them):

  salt-virt     ``salt-run virt.query`` (our runner, saltvirt.fleet.publish) and
                ``salt -G virtual:physical virt.full_info``
  saltext-virt  ``salt-run virt.query`` (saltext-virt 0.1.0's runner) and the same ``salt`` fan-out of its module

Minions run jobs in threads (``multiprocessing: False``, both stacks) so that a minion's VmHWM includes
the query's memory. Timed: the whole ``salt-run`` / ``salt`` command (a fresh process, same start-up
cost for both stacks); its peak RSS is getrusage(RUSAGE_CHILDREN).

    bench/run --only fleet            # or: $VENV/bin/python bench/bench_fleet.py [--quick]
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import nodexml

FULL = {"minions": 10, "domains": 100, "reps": 3}
QUICK = {"minions": 1, "domains": 5, "reps": 1}
# --quick's masters (every script's): 2 request workers, not Stack's 5. Each is a process that sets up its own
# loaders (~0.8 CPU-s); a smoke run starts five masters beside each other on 2 cores and sends them a few jobs
QUICK_MASTER = {"worker_threads": 2}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def session_pids(sid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


class Stack:
    """One salt-master + N minions from one venv, configured for one implementation."""

    def __init__(self, name, venv, base, nodes, runner_dirs, module_dirs, master_extra=None):
        self.name, self.bin, self.base = name, os.path.join(venv, "bin"), base
        self.nodes, self.runner_dirs, self.module_dirs = nodes, runner_dirs, module_dirs
        self.master_extra = master_extra or {}
        self.procs = []
        self.minion_ids = [f"hyper{i:02d}" for i in range(len(nodes))]

    def _write(self, path, data):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(data, fh, indent=1)

    def configure(self):
        publish, ret = free_port(), free_port()
        self.ret_port = ret
        common_cfg = {"user": "root", "log_level": "quiet", "log_level_logfile": "warning"}
        self.conf = os.path.join(self.base, "master")
        master = dict(
            common_cfg,
            root_dir=self.conf,
            interface="127.0.0.1",
            publish_port=publish,
            ret_port=ret,
            auto_accept=True,
            runner_dirs=self.runner_dirs,
            log_file=os.path.join(self.base, "master.log"),
            file_roots={"base": [os.path.join(self.base, "srv")]},
            worker_threads=5,
        )
        master.update(self.master_extra)
        self._write(os.path.join(self.conf, "master"), master)
        self.minion_confs = []
        for mid, uri in zip(self.minion_ids, self.nodes, strict=True):
            d = os.path.join(self.base, mid)
            self._write(
                os.path.join(d, "minion"),
                dict(
                    common_cfg,
                    id=mid,
                    root_dir=d,
                    master="127.0.0.1",
                    master_port=ret,
                    publish_port=publish,
                    module_dirs=self.module_dirs,
                    multiprocessing=False,
                    acceptance_wait_time=1,
                    log_file=os.path.join(d, "minion.log"),
                    grains={"virtual": "physical"},
                    virt={"connection": {"uri": uri}, "images": os.path.join(d, "images")},
                ),
            )
            self.minion_confs.append(d)

    def _spawn(self, tool, conf):
        proc = subprocess.Popen(
            [os.path.join(self.bin, tool), "-c", conf],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def cli(self, tool, *args, timeout=1800):
        return subprocess.run(
            [os.path.join(self.bin, tool), "-c", self.conf, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,  # callers read returncode and output
        )

    def start(self, timeout=300):
        self.configure()
        self._spawn("salt-master", self.conf)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # minions that find no master wait acceptance_wait_time
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.ret_port)) == 0:
                    break
            time.sleep(0.1)
        self.minion_procs = [self._spawn("salt-minion", d) for d in self.minion_confs]
        # no ping before every minion's key is accepted: a minion without one is no target, so each such
        # `salt` command (~1 CPU-s) came back at once with nothing, again and again while the minions start
        keys = self.pki_dir("minions")
        while time.monotonic() < deadline and not all(os.path.exists(os.path.join(keys, m)) for m in self.minion_ids):
            time.sleep(0.2)
        while time.monotonic() < deadline:
            out = self.cli("salt", "*", "test.ping", "--out=json", "--static", "-t", "10", timeout=120)
            try:
                answered = {k for k, v in json.loads(out.stdout or "{}").items() if v is True}
            except ValueError:
                answered = set()
            if answered >= set(self.minion_ids):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{self.name}: minions did not all answer within {timeout}s (logs in {self.base})")

    def pki_dir(self, kind):
        """The master's key directory ``kind`` (``minions``: accepted, ``minions_pre``: pending)."""
        return os.path.join(self.conf, "etc", "salt", "pki", "master", kind)

    def minion_memory(self):
        """{minion: (VmRSS, VmHWM) of its biggest process}; jobs run in threads, so the HWM has the jobs."""
        out = {}
        for mid, proc in zip(self.minion_ids, self.minion_procs, strict=True):
            vals = [(status_kib(p, "VmRSS") or 0, status_kib(p, "VmHWM") or 0) for p in session_pids(proc.pid)]
            out[mid] = max(vals, key=lambda v: v[1]) if vals else (None, None)
        return out

    def stop(self):
        common.stop_groups(self.procs, 5)


def count_vms(name, data):
    """VMs in an answer of either stack (runner answers and plain salt fan-out have different shapes)."""
    if isinstance(data, dict) and "data" in data and "outputter" in data:
        data = data["data"]
    if isinstance(data, dict) and "hosts" in data and isinstance(data["hosts"], dict):
        data = data["hosts"]
    total, hosts = 0, 0
    for answer in (data or {}).values():
        ans = answer["ret"] if isinstance(answer, dict) and isinstance(answer.get("ret"), dict) else answer
        if isinstance(ans, dict) and isinstance(ans.get("vm_info"), dict):
            total += len(ans["vm_info"])
            hosts += 1
    return hosts, total


def last_json(text):
    """The last JSON document in ``text`` (salt-run prints progress events before the answer)."""
    dec, pos, last = json.JSONDecoder(), 0, None
    while True:
        start = text.find("{", pos)
        if start < 0:
            return last
        try:
            last, pos = dec.raw_decode(text, start)
        except ValueError:
            pos = start + 1


def timed(stack, *args, timeout=1800):
    """Run a CLI command; wall time and that process's own peak RSS (wait4 rusage)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([os.path.join(stack.bin, args[0]), "-c", stack.conf, *args[1:]], stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    data = last_json(stdout)
    return {
        "wall": wall,
        "maxrss_kib": usage.ru_maxrss,
        "rc": proc.returncode,
        "counted": count_vms(stack.name, data),
        "tail": (stderr or stdout)[-600:],
    }


def timed_init(stack, vm):
    """``salt-run virt.init`` of a small VM (no image: define + start on a test-driver hypervisor), timed
    whole, with the answer's per-step ``timeline``."""
    cmd = ("salt-run", "virt.init", vm, "1", "64", "nic=None", "disk=None", "seed=False", "--out=json")
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [os.path.join(stack.bin, cmd[0]), "-c", stack.conf, *cmd[1:]],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=900,
            check=False,
        )
        wall = time.perf_counter() - t0
        out.seek(0)
        data = last_json(out.read()) or {}
    return {
        "wall": wall,
        "rc": proc.returncode,
        "host": data.get("host"),
        "started": (data.get("init") or {}).get("started"),
        "timeline": data.get("timeline") or [],
        "tail": proc.stderr[-600:],
    }


# where a command's time goes: cumulative time of these functions in a cProfile of one run
BREAKDOWN = {
    "salt-run virt.query": [
        ("whole command (under cProfile)", ("salt-run", "<module>")),
        ("Salt CLI start-up before the runner (imports, config, parsing)", None),
        ("load the runner module (Salt's loader + our imports)", ("utils/lazy.py", "verify_fun")),
        ("Salt's MasterMinion for the runner job", ("client/mixins.py", "mminion")),
        ("our runner function virt.query", ("_runners/virt.py", "query")),
        ("  of which: publish (LocalClient.run_job)", ("client/__init__.py", "run_job")),
        ("  of which: publish + wait for the minions' answers (fleet.run)", ("fleet/publish.py", "run")),
        ("fire events on the master bus (the job's return event)", ("utils/event.py", "fire_event")),
        ("print the answer (json outputter)", ("client/mixins.py", "print_async_event")),
    ],
    "salt -G virtual:physical virt.full_info": [
        ("whole command (under cProfile)", ("bin/salt", "<module>")),
        ("LocalClient set-up", ("client/__init__.py", "get_local_client")),
        ("publish + wait for the answers (batch path of --static)", ("cli/batch.py", "run")),
        ("print the answer (json outputter)", ("output/__init__.py", "display_output")),
    ],
}


def profile_breakdown(stack, label, cmd):
    """One run of ``cmd`` under cProfile: [(part, seconds)] per BREAKDOWN[label]."""
    import pstats

    out = os.path.join(stack.base, f"prof-{label.split()[0]}.prof")
    python = os.path.join(stack.bin, "python")
    subprocess.run(
        [python, "-m", "cProfile", "-o", out, os.path.join(stack.bin, cmd[0]), "-c", stack.conf, *cmd[1:]],
        capture_output=True,
        timeout=1800,
        check=False,
    )
    stats = pstats.Stats(out).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}

    def cum(key):
        hits = [v[3] for (f, _ln, fn), v in stats.items() if f.endswith(key[0]) and fn == key[1]]
        return max(hits) if hits else None

    parts = []
    for part, key in BREAKDOWN[label]:
        if key is None:  # everything before the runner ran: the whole command minus runner.run
            whole, runner = cum(("salt-run", "<module>")), cum(("salt/runner.py", "run"))
            parts.append((part, whole - runner if whole and runner else None))
        else:
            parts.append((part, cum(key)))
    return parts


def render_init(runs):
    """Median time of each step of the runner's virt.init (seconds since the runner began)."""
    good = [r for r in runs if r["rc"] == 0 and r["started"]]
    steps = {}
    for r in good:
        for t in r["timeline"]:
            steps.setdefault(t["step"], []).append(t["at"])
    rows = [[step, common.fmt_stat(common.summary(ats))] for step, ats in steps.items()]
    rows.append(
        ["whole salt-run command (process start to exit)", common.fmt_stat(common.summary([r["wall"] for r in good]))]
    )
    return (
        "salt-run virt.init end to end (no image: define + start on a test-driver hypervisor; the answer's "
        "`timeline`, seconds since the runner function began), median (min–max, n)\n\n"
        + common.table(["step", "at"], rows)
    ), [f"salt-run virt.init rc={r['rc']} started={r['started']}: {r['tail']}" for r in runs if r not in good]


PLACEMENT_COMMANDS = {
    "salt -G virtual:physical virt.capacity": (
        "salt",
        "-G",
        "virtual:physical",
        "virt.capacity",
        "--out=json",
        "--static",
        "-t",
        "900",
    ),
    "salt -G virtual:physical test.ping (floor)": (
        "salt",
        "-G",
        "virtual:physical",
        "test.ping",
        "--out=json",
        "--static",
        "-t",
        "900",
    ),
}
COMMANDS = {
    "salt-run virt.query": ("salt-run", "virt.query", "--out=json"),
    "salt -G virtual:physical virt.full_info": (
        "salt",
        "-G",
        "virtual:physical",
        "virt.full_info",
        "--out=json",
        "--static",
        "-t",
        "900",
    ),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--minions", type=int)
    ap.add_argument("--domains", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--no-saltext", action="store_true", help="salt-virt's stack only (saltext-virt's takes minutes)")
    ap.add_argument(
        "--grains-cache",
        action="store_true",
        help="grains_cache: True in both masters' config (salt-run's job then reads the master's grains from "
        "its cache instead of running every grains module; the salt CLI loads no grains)",
    )
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("minions", "domains", "reps"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svf", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    nodes = [
        nodexml.write_node(os.path.join(workdir, "nodes"), cfg["domains"], prefix=f"h{i:02d}vm")
        for i in range(cfg["minions"])
    ]
    master_extra = {"grains_cache": True} if args.grains_cache else {}
    if args.quick:
        master_extra.update(QUICK_MASTER)
    saltext = not args.no_saltext  # its venv may not exist without it (bench/setup-saltext.sh)
    stacks = [
        (
            "salt-virt",
            common.OUR_VENV,
            [str(common.ROOT / "_runners")],
            [str(common.ROOT / "_modules")],
            {"virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "max_wait": 900}}, **master_extra},
        ),
    ] + (
        [
            (
                "saltext-virt",
                common.SALTEXT_VENV,
                [common.saltext_module_dir("runners")],
                [common.saltext_module_dir("modules")],
                dict(master_extra),
            )
        ]
        if saltext
        else []
    )
    results, errors = {}, []
    fanout = {}  # placement's question and the test.ping floor (salt-virt's stack)

    def run_stack(name, venv, runner_dirs, module_dirs, extra):
        stack = Stack(name, str(venv), os.path.join(workdir, name[:6]), nodes, runner_dirs, module_dirs, extra)
        log(f"fleet {name}: starting salt-master + {cfg['minions']} minions")
        t0 = time.perf_counter()
        try:
            stack.start()
            log(f"fleet {name}: all minions answer after {time.perf_counter() - t0:.1f}s")
            mem0 = stack.minion_memory()
            for rep in range(cfg["reps"]):
                for label, cmd in COMMANDS.items():
                    log(f"fleet {name}: {label} {rep + 1}/{cfg['reps']}")
                    results.setdefault((name, label), []).append(timed(stack, *cmd))
            if name == "salt-virt" and not args.quick:  # where the time goes, runner vs plain fan-out
                for label, cmd in COMMANDS.items():
                    log(f"fleet {name}: {label} under cProfile")
                    results[(name, "_profile")] = results.get((name, "_profile"), {})
                    try:
                        results[(name, "_profile")][label] = profile_breakdown(stack, label, cmd)
                    except Exception as exc:  # noqa: BLE001 - a diagnostic: never loses the other figures
                        errors.append(f"salt-virt profile of {label}: {exc}")
            if name == "salt-virt":  # placement's question beside the floor of any fan-out (test.ping)
                for rep in range(cfg["reps"]):
                    for label, cmd in PLACEMENT_COMMANDS.items():
                        log(f"fleet {name}: {label} {rep + 1}/{cfg['reps']}")
                        fanout.setdefault(label, []).append(timed(stack, *cmd))
            if name == "salt-virt":  # the runner's virt.init end to end, with its own per-step timeline
                for rep in range(cfg["reps"]):
                    log(f"fleet {name}: salt-run virt.init {rep + 1}/{cfg['reps']}")
                    results.setdefault((name, "_init"), []).append(timed_init(stack, f"fbench{rep}"))
            mem1 = stack.minion_memory()
            results[(name, "_mem")] = {m: {"rss_before": mem0[m][0], "hwm_after": mem1[m][1]} for m in mem1}
        except Exception as exc:  # noqa: BLE001 - report and go on with the other stack
            errors.append(f"{name}: {exc}")
        finally:
            stack.stop()

    try:
        # full runs: one stack at a time (the other's daemons must not share the CPUs); --quick only
        # checks that everything runs, so both stacks go side by side to keep the smoke test short
        with concurrent.futures.ThreadPoolExecutor(max_workers=2 if args.quick else 1) as pool:
            for fut in [pool.submit(run_stack, *st) for st in stacks]:
                fut.result()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    body = []
    expected = cfg["minions"] * cfg["domains"]
    for label in COMMANDS:
        meds = {}
        cells = []
        for name in ("salt-virt", "saltext-virt"):
            runs = results.get((name, label), [])
            good = [r for r in runs if r["rc"] == 0 and r["counted"][1] == expected]
            for r in runs:
                if r not in good:
                    errors.append(f"{name} {label}: rc={r['rc']} saw {r['counted'][1]}/{expected} VMs: {r['tail']}")
            st = common.summary([r["wall"] for r in good])
            meds[name] = st and st["median"]
            rss = common.summary([r["maxrss_kib"] for r in good])
            cells.append(f"{common.fmt_stat(st)}; CLI peak RSS {common.fmt_mib(rss and rss['median'])}")
        body.append([label] + cells + [f"**{common.ratio(meds['saltext-virt'], meds['salt-virt'])}**"])
    mem_rows = []
    for name in ("salt-virt", "saltext-virt"):
        mem = results.get((name, "_mem"))
        if mem:
            hwm = [v["hwm_after"] for v in mem.values() if v["hwm_after"]]
            growth = [v["hwm_after"] - v["rss_before"] for v in mem.values() if v["hwm_after"] and v["rss_before"]]
            mem_rows.append(
                [name, common.fmt_mib(max(hwm) if hwm else None), common.fmt_mib(max(growth) if growth else None)]
            )
    prof = results.get(("salt-virt", "_profile")) or {}
    prof_rows = [[label, part, common.fmt_s(sec)] for label, parts in prof.items() for part, sec in parts]
    fan_rows = []
    for label in ("salt -G virtual:physical virt.full_info", *PLACEMENT_COMMANDS):
        runs = results.get(("salt-virt", label), []) if label in COMMANDS else fanout.get(label, [])
        runs = [r for r in runs if r["rc"] == 0]
        fan_rows.append([label, common.fmt_stat(common.summary([r["wall"] for r in runs]))])
    init_table, init_errors = render_init(results.get(("salt-virt", "_init"), []))
    errors += [f"salt-virt {e}" for e in init_errors]
    tables = [
        f"{cfg['minions']} minions x {cfg['domains']} domains (test driver), whole command, median (min–max, n)\n\n"
        + common.table(["command", "salt-virt", "saltext-virt 0.1.0", "saltext / salt-virt"], body),
        "Minion memory after all queries (largest minion process)\n\n"
        + common.table(["stack", "peak RSS (VmHWM)", "growth over RSS before the queries"], mem_rows),
        "What placement asks (virt.capacity) beside virt.full_info and the floor of any fan-out (test.ping), "
        "whole `salt` command, median (min–max, n)\n\n" + common.table(["command", "salt-virt"], fan_rows),
        init_table,
    ] + (
        [
            "Where the time goes (salt-virt stack, one run of each under cProfile: cumulative seconds, profiler "
            "overhead included)\n\n" + common.table(["command", "part", "seconds"], prof_rows)
        ]
        if prof_rows
        else []
    )
    result = {
        "title": f"3b. fleet query: {cfg['minions']} minions x {cfg['domains']} domains",
        "tables": tables,
        "raw": {f"{k[0]}/{k[1]}": v for k, v in results.items()},
        "fanout": fanout,
        "init": results.get(("salt-virt", "_init"), []),
        "profile": prof,
        "notes": [f"load average before/after: {load0} / {common.loadavg()}", f"master config extra: {master_extra}"]
        + [f"ERROR {e}" for e in errors],
    }
    common.emit("fleet", result)
    return 1 if any(e.startswith("salt-virt") for e in errors) else 0


if __name__ == "__main__":
    sys.exit(main())
