"""Placement without a round trip (issue 40): ``salt-run virt.init`` to ``started`` with 100 hypervisors, the
capacity question published to all of them (the old path, ``virt:capacity_push:max_age: 0``) against the capacity
they pushed (the new path), interleaved in one run on one master.

The 100 hypervisors: one real salt-minion (``hyper00``, a test:/// node with room, running the ``virt_events``
engine that pushes its record through Salt's mine) that every VM goes to, and 99 simulated ones (``sim01`` ..
``sim99``): accepted keys of their own on the master, in ``virt:hypervisors``, and full (no room: placement
ranks them and excludes each with its reasons). They are no daemons: for the old path a responder process
answers each capacity question published to them with a reply signed by each one's own key, fired straight on
the master's event bus (no return channel, no job-cache write: so the old path's figure is a lower bound of 99 real
minions' cost); its signing is serial (~1 ms per host, printed) where real hosts sign in parallel. For the new path
their records are written into the master's mine bank (signed, fresh) before each run, as the master's ``_mine``
stores what ``virt.push_capacity`` sends (tests/unit/pki/test_answers.py).

Timed: ``started`` in the answer's ``timeline`` (seconds since the runner function began, the hypervisor's own
``started`` event as the runner saw it) and the whole ``salt-run`` command; each run is a fresh CLI process.

    $VENV/bin/python bench/bench_pushplace.py [--reps 10] [--quick]
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fleet
import common
import nodexml

SIMS = [f"sim{i:02d}" for i in range(1, 100)]
# a full simulated host: 16 GiB, 15 GiB used by running VMs: below placement's default 1 GiB reserve
SIM_CAP = {
    "host": {
        "mem_total": 16384,
        "mem_used_by_vms": 15872,
        "vcpus_total": 16,
        "vcpus_used_by_vms": 16,
        "vms_defined": 20,
        "vms_active": 20,
        "disk_free": 102400,
        "images_dir": "/srv/salt-images",
        "groups": {},
    },
    "vm_info": {f"v{i}": {"group": None, "state": "running", "cpu": 1, "mem": 768} for i in range(20)},
}


def respond(conf, keys_dir, log_path):
    """The 99 simulated hypervisors' answers to ``virt.capacity`` (runs until killed)."""
    import salt.config
    import salt.utils.event

    sys.path.insert(0, str(common.ROOT / "_utils"))
    from saltvirt.pki import answers

    # every simulated host's key loaded once (answers keeps 4: a real host signs with its one key)
    answers._private_key = functools.lru_cache(maxsize=256)(answers._private_key.__wrapped__)
    opts = salt.config.master_config(os.path.join(conf, "master"))
    bus = salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True)
    with open(log_path, "a") as log:
        while True:
            ev = bus.get_event(wait=1, tag="salt/job/", full=True)
            if not ev or not ev["tag"].endswith("/new") or ev["data"].get("fun") != "virt.answer":
                continue
            data = ev["data"]
            req = next((a for a in data.get("arg") or [] if isinstance(a, dict) and "nonce" in a), None)
            if not req or req.get("fun") != "virt.capacity":
                continue
            jid, t0 = data["jid"], time.perf_counter()
            for sim in sorted(set(data.get("minions") or []) & set(SIMS)):
                signed = answers.sign(os.path.join(keys_dir, sim), sim, "virt.capacity", req["nonce"], SIM_CAP)
                ret = {"id": sim, "jid": jid, "fun": "virt.answer", "return": signed, "retcode": 0, "success": True}
                bus.fire_event(ret, f"salt/job/{jid}/ret/{sim}")
            log.write(json.dumps({"jid": jid, "signed_s": time.perf_counter() - t0}) + "\n")
            log.flush()


class PushStack(bench_fleet.Stack):
    """bench_fleet's master + minions, the minions running the virt_events engine (pushing every 5 s)."""

    def configure(self):
        super().configure()
        for d in self.minion_confs:
            path = os.path.join(d, "minion")
            with open(path) as fh:
                conf = json.load(fh)
            conf["engines"] = [{"virt_events": {}}]
            conf["engines_dirs"] = [str(common.ROOT / "_engines")]
            conf["virt"]["capacity_push"] = {"every": 5}
            self._write(path, conf)


def add_sims(stack, workdir):
    """The 99 simulated hypervisors' keys: accepted on the master, private halves in ``workdir/simkeys``."""
    sys.path.insert(0, str(common.ROOT / "_utils"))
    from saltvirt.pki import envelope

    keys = os.path.join(workdir, "simkeys")
    for sim in SIMS:
        pub, priv = envelope.new_keypair()
        os.makedirs(os.path.join(keys, sim), exist_ok=True)
        with open(os.path.join(keys, sim, "minion.pem"), "w") as fh:
            fh.write(priv)
        with open(os.path.join(stack.pki_dir("minions"), sim), "w") as fh:
            fh.write(pub)
    return keys


def push_sims(stack, keys):
    """The simulated hosts' records, signed now, in the master's mine bank (as its ``_mine`` stores them)."""
    import salt.cache
    import salt.config
    import salt.utils.mine

    from saltvirt.pki import answers

    opts = salt.config.master_config(os.path.join(stack.conf, "master"))
    cache = salt.cache.Cache(opts)
    now = time.time()
    for sim in SIMS:
        record = answers.sign_record(os.path.join(keys, sim), sim, SIM_CAP, now)
        entry = salt.utils.mine.wrap_acl_structure(record, allow_tgt=sim, allow_tgt_type="list")
        cache.store("mine", sim, {answers.MINE_KEY: entry})
    return cache.fetch("mine", "hyper00")  # hyper00 pushes its own, through its engine


def timed_init(conf, bin_dir, vm):
    cmd = ["salt-run", "-c", conf, "virt.init", vm, "1", "64", "nic=None", "disk=None", "seed=False", "--out=json"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [os.path.join(bin_dir, cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=600, check=False
    )
    wall = time.perf_counter() - t0
    data = bench_fleet.last_json(proc.stdout) or {}
    steps = {t["step"]: t for t in data.get("timeline") or []}
    return {
        "wall": wall,
        "rc": proc.returncode,
        "host": data.get("host"),
        "started": (steps.get("started") or {}).get("at"),
        "queried": steps.get("hosts_queried") or {},
        "tail": (proc.stderr or proc.stdout)[-400:],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--respond", nargs=3, help=argparse.SUPPRESS)  # the responder process: conf keys log
    args = ap.parse_args(argv)
    if args.respond:
        respond(*args.respond)
        return 0
    reps = 1 if args.quick else args.reps
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svp", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    node = nodexml.write_node(os.path.join(workdir, "nodes"), 5, prefix="pp")
    hyps = {"tgt": ["hyper00", *SIMS], "tgt_type": "list", "max_wait": 120}
    stack = PushStack(
        "salt-virt",
        str(common.OUR_VENV),
        os.path.join(workdir, "salt"),
        [node],
        [str(common.ROOT / "_runners")],
        [str(common.ROOT / "_modules")],
        {"virt": {"hypervisors": hyps, "capacity_push": {"max_age": 90}}},
    )
    runs, responder, errors = {"old": [], "new": []}, None, []
    try:
        log("starting salt-master + hyper00")
        stack.start()
        keys = add_sims(stack, workdir)
        old_conf = os.path.join(workdir, "salt", "master-old")  # the same master, pushed records never used
        with open(os.path.join(stack.conf, "master")) as fh:
            conf = json.load(fh)
        conf["virt"]["capacity_push"] = {"max_age": 0}
        stack._write(os.path.join(old_conf, "master"), conf)
        resp_log = os.path.join(workdir, "responder.jsonl")
        responder = subprocess.Popen(
            [sys.executable, __file__, "--respond", stack.conf, keys, resp_log], start_new_session=True
        )
        stack.procs.append(responder)
        deadline = time.monotonic() + 120
        while not push_sims(stack, keys) and time.monotonic() < deadline:  # hyper00's engine pushed once
            time.sleep(0.5)
        bin_dir = stack.bin
        for rep in range(reps + 1):  # the first pair warms both paths up (fileserver, key cache): not counted
            order = ("old", "new") if rep % 2 else ("new", "old")
            for path in order:
                if path == "new":
                    push_sims(stack, keys)
                log(f"{path} path {rep}/{reps}")
                res = timed_init(old_conf if path == "old" else stack.conf, bin_dir, f"pp{path}{rep}")
                if rep:
                    runs[path].append(res)
                if res["rc"] or res["host"] != "hyper00":
                    errors.append(f"{path} rep {rep}: rc={res['rc']} host={res['host']}: {res['tail']}")
        with open(resp_log) as fh:
            signed = [json.loads(line)["signed_s"] for line in fh]
    finally:
        stack.stop()
    load1 = common.loadavg()
    rows = []
    for path, label in (("old", "asks all 100 (max_age 0)"), ("new", "pushed records")):
        good = [r for r in runs[path] if not r["rc"] and r["started"] is not None]
        queried = good[0]["queried"] if good else {}
        rows.append(
            [
                f"{path}: {label}",
                common.fmt_stat(common.summary([r["started"] for r in good])),
                common.fmt_stat(common.summary([r["queried"].get("at") for r in good])),
                common.fmt_stat(common.summary([r["wall"] for r in good])),
                f"pushed {queried.get('pushed')}, asked {queried.get('asked')}",
            ]
        )
    result = {
        "title": "Placement without a round trip: salt-run virt.init with 100 hypervisors (1 real, 99 simulated)",
        "notes": [
            f"load average (1/5/15 min) start: {load0}; end: {load1}",
            f"old and new interleaved, {reps} pairs after one warm-up pair; every VM on hyper00 (test driver)",
            "simulated hosts' answers to the old path's question, signed one after the other in one process: "
            + common.fmt_stat(common.summary(signed)),
            *errors,
        ],
        "tables": [
            common.table(
                ["path", "started", "hosts_queried", "whole salt-run", "placement's snapshot"],
                rows,
            )
        ],
        "runs": runs,
    }
    common.emit("pushplace", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
