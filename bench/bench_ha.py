"""Automatic HA's bound (issue 38): a hypervisor lost -> its HA VM beating on another one, measured ``--reps`` times
in one lab: three namespaced libvirtd hypervisors (tests/support/lab.py) on shared storage with the virtlockd
lockspace, a real salt-master running the ``virt_ha`` engine and three hypervisor minions (plain daemons with ``-c``
dirs, as bench_fleet.py runs them; each minion connects from its own loopback address, which its grains say: the
master's connection view, HA's second signal, tells them apart).

One repetition: the HA VM ``ha1`` runs on host X (recorded by ``salt-run virt.record``); X loses power at t0 (its
minion SIGKILLed, every process of its namespaces killed: libvirtd, virtlockd, the guest's qemu); the figure is t0 ->
ha1 booted and beating three times on another host's console (the guest's own proof that it runs). Then X comes back
(libvirtd, minion), HA logs ``back`` and ``salt-run virt.reconcile X`` undefines its stale copy; the next repetition
kills the host ha1 runs on now. Settings: the ones docs/topics/recovery.md ("The bound") names, printed with the
figures.

    $VENV/bin/python bench/bench_ha.py [--reps 3] [--quick] [--interval 2] [--lost-after 5] [--down-after 10]
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fleet
import common

sys.path.insert(0, str(common.ROOT))
sys.path.insert(0, str(common.ROOT / "_utils"))

INDEXES = (25, 26, 27)  # lab indexes, as tests/integration/test_ha_real.py (labs carry their own tag)
INTERVAL = 2
HA = {"enabled": True, "vms": ["ha*"], "fence": "command", "lost_after": 5, "down_after": 10}
HYPERVISORS = {"tgt": "hv2[567]", "tgt_type": "glob", "timeout": 5, "gather_job_timeout": 5, "down_after": 30}
WAIT = 600


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Lab:
    """The hypervisors, the shared store, the master and the minions."""

    def __init__(self, base, ha, interval):
        from tests.support import fleetlab, lab
        from tests.support.paths import GUEST_DIR

        self.base, self.lab, self.fleetlab = pathlib.Path(base), lab, fleetlab
        self.ha, self.interval = ha, interval
        self.store = self.base / "ha-store"
        self.store.mkdir()
        shutil.copyfile(GUEST_DIR / "disk.qcow2", self.store / "golden.qcow2")
        (self.store / ".lockspace").mkdir()
        self.fabric = lab.Fabric(lab.new_tag()).start()
        self.hvs = {
            f"hv{i}": lab.Hypervisor(str(base), i, self.fabric, lockspace=str(self.store / ".lockspace"))
            for i in INDEXES
        }
        self.guest = {"kernel": str(GUEST_DIR / "vmlinux"), "initrd": str(GUEST_DIR / "initrd.img")}
        self.procs, self.minions = [], {}
        self.fence_log = self.base / "fence.ran"

    # daemons ----------------------------------------------------------------------------------------------
    def _write(self, path, data):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(data, fh, indent=1)

    def _spawn(self, tool, conf):
        bin_dir = os.path.dirname(sys.executable)
        proc = subprocess.Popen(
            [os.path.join(bin_dir, tool), "-c", conf],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def fence_script(self):
        script = self.base / "fence.sh"
        script.write_text(
            "#!/bin/sh\nset -e\n"
            'case "$1" in\n'
            + "".join(f"  {n}) ns={hv.netns} ;;\n" for n, hv in self.hvs.items())
            + '  *) echo "unknown host $1"; exit 2 ;;\nesac\n'
            'for pid in $(ip netns pids "$ns"); do kill -9 "$pid" || true; done\n'
            f'echo "$1 $(date +%s.%N)" >> {self.fence_log}\n'
        )
        script.chmod(0o755)
        return str(script)

    def start(self):
        publish, ret = free_port(), free_port()
        self.conf = str(self.base / "master")
        virt = {
            "hypervisors": HYPERVISORS,
            "placement": {"mem_reserve_mib": 256, "disk_reserve_mib": 0},
            "ha": self.ha,
            "recovery": {"probe_wait": 5},
            "fence": {"command": [self.fence_script(), "{host}"], "timeout": 30},
        }
        root = common.ROOT
        self._write(
            os.path.join(self.conf, "master"),
            {
                "user": "root",
                "root_dir": self.conf,
                "interface": "127.0.0.1",
                "publish_port": publish,
                "ret_port": ret,
                "auto_accept": True,
                "worker_threads": 3,
                "log_file": str(self.base / "master.log"),
                "log_level_logfile": "info",
                "runner_dirs": [str(root / "_runners")],
                "engines_dirs": [str(root / "_engines")],
                "engines": [{"virt_ha": {"interval": self.interval}}],
                "virt": virt,
            },
        )
        self._spawn("salt-master", self.conf)
        deadline = time.monotonic() + 300
        while not listening(ret):
            assert time.monotonic() < deadline, "the salt-master did not start"
            time.sleep(0.2)
        configs = self.fleetlab.minion_configs(self.hvs, str(self.base), self.store)
        self.minion_confs = {}
        for name, hv in self.hvs.items():
            d = str(self.base / f"{name}-minion")
            config = dict(
                configs[name],
                id=name,
                user="root",
                root_dir=d,
                master="127.0.0.1",
                master_port=ret,
                publish_port=publish,
                module_dirs=[str(root / "_modules")],
                acceptance_wait_time=1,
                log_file=str(self.base / f"{name}-minion.log"),
                log_level_logfile="info",
                source_address=hv.loopback,  # its own address, and its grains say so
                grains=dict(configs[name]["grains"], ipv4=[hv.loopback]),
            )
            self._write(os.path.join(d, "minion"), config)
            self.minion_confs[name] = d
            self.start_minion(name)
        for hv in self.hvs.values():
            hv.start().warm_up()
        import salt.client

        self.local = salt.client.get_local_client(os.path.join(self.conf, "master"))
        while sorted(self.local.cmd("hv*", "test.ping", timeout=10)) != sorted(self.hvs):
            assert time.monotonic() < deadline, "the minions did not all answer"
            time.sleep(1)

    def start_minion(self, name):
        self.minions[name] = self._spawn("salt-minion", self.minion_confs[name])

    def salt_run(self, *args):
        bin_dir = os.path.dirname(sys.executable)
        out = subprocess.run(
            [os.path.join(bin_dir, "salt-run"), "-c", self.conf, "--out=json", *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        data = bench_fleet.last_json(out.stdout)
        if out.returncode or not isinstance(data, dict):
            raise RuntimeError(f"salt-run {' '.join(args)}: rc {out.returncode}: {out.stdout[-2000:]}{out.stderr}")
        return data

    def stop(self):
        common.stop_groups(self.procs, 10)
        for hv in self.hvs.values():
            if hv.pid:
                power_off(hv)  # a lost host's guests too
                hv.stop()
        self.fabric.stop()


def power_off(hv):
    from tests.integration.test_ha_real import power_off as off

    off(hv)


def ha_entries(lab, host, after):
    return [e for e in lab.salt_run("virt.ha_log", "last=200")["entries"][after:] if e["host"] == host]


def wait_decision(lab, host, after, decision):
    deadline = time.monotonic() + WAIT
    while decision not in [e["decision"] for e in ha_entries(lab, host, after)]:
        assert time.monotonic() < deadline, ha_entries(lab, host, after)
        time.sleep(2)


def one_rep(lab, host):
    """Power loss of ``host``, which runs ha1: ``(seconds until libvirt started ha1 elsewhere, seconds until it beats
    there, that host)``."""
    from tests.integration.test_ha_real import beating_on, domain_started, offsets, qemu_holding

    others = {h: hv for h, hv in lab.hvs.items() if h != host}
    lab.salt_run("virt.record")
    mark = len(lab.salt_run("virt.ha_log", "last=200")["entries"])
    before = offsets(others, "ha1")
    t0, killed = time.monotonic(), time.time()
    os.killpg(lab.minions[host].pid, signal.SIGKILL)
    lab.minions[host].wait()
    lab.hvs[host].kill_daemon()
    power_off(lab.hvs[host])
    while not (target := beating_on(others, "ha1", before)):
        assert time.monotonic() - t0 < WAIT, ha_entries(lab, host, mark)
        time.sleep(0.3)
    took = time.monotonic() - t0
    started = domain_started(lab.hvs[target], "ha1") - killed
    assert len(qemu_holding(lab.store / "ha1.qcow2")) == 1
    wait_decision(lab, host, mark, "recovered")
    # the host back: its libvirtd as after a boot, its minion; HA logs it back, reconcile undefines its stale copy
    for marker in pathlib.Path(lab.hvs[host].path("run")).rglob("autostarted"):
        marker.unlink()
    mark = len(lab.salt_run("virt.ha_log", "last=200")["entries"])
    lab.hvs[host].restart_daemon()
    lab.start_minion(host)
    wait_decision(lab, host, mark, "back")
    assert "ha1" in lab.salt_run("virt.reconcile", host)["undefined"]
    return started, took, target


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--interval", type=float, default=INTERVAL, help="the engine's seconds between rounds")
    ap.add_argument("--lost-after", type=float, default=HA["lost_after"], help="virt:ha:lost_after")
    ap.add_argument("--down-after", type=float, default=HA["down_after"], help="virt:ha:down_after")
    args = ap.parse_args(argv)
    reps = 1 if args.quick else args.reps
    ha = dict(HA, lost_after=args.lost_after, down_after=args.down_after)
    from saltvirt.fleet import ha as ha_lib

    ha_lib.config({"ha": ha, "fence": {"command": ["fence", "{host}"]}})  # a setting HA refuses stops here, not later
    from tests.support.fleetlab import beating, shared_vm

    load0 = common.loadavg()
    base = tempfile.mkdtemp(prefix="svbench-ha", dir="/var/tmp")
    os.chmod(base, 0o755)
    lab = Lab(base, ha, args.interval)
    times, starts, rows = [], [], []
    try:
        log("ha: salt-master + 3 lab hypervisors")
        lab.start()
        host = "hv25"
        shared_vm(lab.local, lab.store, lab.guest, host, "ha1")
        beating(lab.hvs[host], "ha1")
        for rep in range(reps):
            started, took, target = one_rep(lab, host)
            log(f"ha: rep {rep + 1}: {host} lost -> ha1 started on {target} {started:.1f} s, beating {took:.1f} s")
            times.append(took)
            starts.append(started)
            rows.append([rep + 1, host, target, f"{started:.1f} s", f"{took:.1f} s", common.loadavg()])
            host = target
    finally:
        lab.stop()
        shutil.rmtree(base, ignore_errors=True)
    st, sst = common.summary(times), common.summary(starts)
    result = {
        "title": "Automatic HA: host lost -> its HA VM beating on another host",
        "details": {
            "times": times,
            "stat": st,
            "starts": starts,
            "start_stat": sst,
            "ha": ha,
            "interval": args.interval,
            "hypervisors": HYPERVISORS,
        },
        "tables": [
            common.table(
                ["rep", "lost host", "ha1 now on", "lost -> started (libvirt)", "lost -> beating", "load after"], rows
            )
        ],
        "notes": [
            f"lost -> beating: {common.fmt_stat(st)}; lost -> started by libvirt: {common.fmt_stat(sst)}",
            f"engine interval {args.interval:g} s; virt:ha down_after {ha['down_after']:g} s, lost_after "
            f"{ha['lost_after']:g} s; "
            f"virt:hypervisors timeout {HYPERVISORS['timeout']} s, down_after {HYPERVISORS['down_after']} s; "
            "virt:recovery:probe_wait 5 s; the fence: a script killing the host's namespaces",
            "started: libvirt's 'starting up' line of the new copy (the rest is the guest's TCG boot to its third "
            "heartbeat, one a second)",
            f"load average before/after: {load0} / {common.loadavg()}",
        ],
    }
    common.emit("ha", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
