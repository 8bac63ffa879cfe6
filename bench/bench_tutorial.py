"""Tutorial: seconds from ``salt-run virt.init web1 ...`` to the first ``salt web1 test.ping`` that
answers True, for the Debian 12 + salt-minion image (scripts/build-debian-image.sh, cached in
/var/cache/salt-virt/debian), on real lab hypervisors (tests/support/lab.py: namespaced libvirtd, TCG
guests) and a real salt-master (plain daemons with ``-c`` dirs, as bench_fleet runs them).

The guest reaches the master as in tests/integration/test_tutorial.py: the lab fabric has DHCP and a
link to the root namespace (``Fabric.master_link``); the master listens on 0.0.0.0 and
``virt:guest_master`` tells new VMs where it is. The master does not auto-accept keys: virt.init
pre-accepts the new minion's key.

Split of one VM's time (all from the same clock, 0 = the ``salt-run virt.init`` process starts):

* runner: the answer's per-step ``timeline`` (seconds since the runner function began) and the whole
  command (process start to exit: Salt's CLI start-up and exit included);
* boot: the guest's serial console log (``<hv>/log/qemu/<vm>-serial.log``), each line timestamped as it
  arrives (the file is polled every 0.1 s): its first line, the image's phase markers ``SV-PHASE <name>
  <seconds since the guest's kernel started>`` (``systemd``: PID 1 runs units; ``dhcp``: a routable
  address; ``minion-start``: just before the minion's Python starts, with ``SALT-MINION-START <id>``),
  each with both clocks (the host's stamp and the guest's uptime);
* minion: the master's ``salt/minion/<id>/start`` event (``salt-run state.event``, lines timestamped
  as they arrive) and the first ``salt <id> test.ping`` answering True (polled once the start event was
  seen, so that the polls' CPU does not slow the guest's boot; each poll is a whole ``salt`` command, as
  a user types it). A True return the master stored after its poll's CLI had given up (``-t 10`` plus
  ``gather_job_timeout``: a guest slower than that) counts too, at the time it was stored (its file in the
  master's job cache); such VMs are marked "after its poll's CLI had given up" in the notes.

Cases: 1 VM (``--reps`` times, one after the other) and ``--burst`` VMs started at once (one
``salt-run virt.init`` each, in threads) on 2 lab hypervisors. The image is cached on every hypervisor
before the clock starts (``virt.image_warm``: fetched, checked, imported as a base, libvirt's domain type
asked once), as docs/topics/image-warm-up.md recommends: the tutorial's "already cached" case.

``--direct-kernel``: the VMs boot the image's own kernel and initrd directly (``boot={kernel, initrd,
cmdline}`` from ``debian-minion.{vmlinuz,initrd,cmdline}`` next to the image, which the recipe exports;
no BIOS, no boot loader). virt.init takes those paths only from a directory the operator allows: the
bench's hypervisors list the image's directory in ``virt:allowed_paths`` for this case only.
``--debug`` (with ``--direct-kernel``): ``sv.debug`` on the kernel command line: the guest forwards its
journal to the console (monotonic timestamps), runs the minion with ``-l debug`` and prints
``systemd-analyze blame``; every console line is kept in the JSON (``console``).

``--quick`` (the smoke test): 1 VM of the tiny busybox guest (no minion in it) on 1 hypervisor,
measured to the runner's "started" and the console's first line; no ping.

    $VENV/bin/python bench/bench_tutorial.py [--quick] [--reps 2] [--burst 5] [--direct-kernel [--debug]]
    $VENV/bin/python bench/bench_tutorial.py --ratios [--reps 3]   (bench_tutorial_ratios.py: issue #40)
"""

import argparse
import concurrent.futures
import contextlib
import glob
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

sys.path.insert(0, str(common.ROOT))  # the lab the way the tests import it
from tests.support import lab

DEBIAN = os.path.join(os.environ.get("SALT_VIRT_DEBIAN", str(common.CACHE / "debian")), "debian-minion.qcow2")
MARKER = "SALT-MINION-START"
PHASE_RE = re.compile(r"SV-PHASE (\S+) (\d+\.\d+)")
GUEST_PHASES = ("systemd", "dhcp", "minion-start")
FULL = {"reps": 2, "burst": 5, "hosts": 2}
QUICK = {"reps": 1, "burst": 0, "hosts": 1}
PING_TIMEOUT = 600  # TCG boot of systemd + salt-minion, five at once on 2 cores
PING_PER_VM = 60  # a larger burst shares the same 2 cores: its window grows by this per VM started at once
SIZE = ["1", "512"]  # vCPUs, MiB (--vcpus/--mem; the README's tutorial types 2 1024)
MARKER_GRACE = 240  # no start event this long after SALT-MINION-START: poll test.ping anyway


class TutStack(bench_fleet.Stack):
    """bench_fleet's master + hypervisor minions, plus what the tutorial needs: the master reachable by
    guests, no auto-accept, the images' directory allowed for the busybox guest's kernel."""

    direct_kernel = False

    def configure(self):
        super().configure()
        for d in self.minion_confs:
            path = os.path.join(d, "minion")
            with open(path) as fh:
                cfg = json.load(fh)
            # the operator's opt-in for a direct kernel boot of the Debian image: its directory allowed
            extra = [os.path.dirname(DEBIAN)] if self.direct_kernel else []
            cfg["virt"]["allowed_paths"] = [str(common.GUEST), *extra]
            cfg["grains"]["virt_hypervisor"] = True
            self._write(path, cfg)
        self.auto_accept_minions()

    def auto_accept_minions(self):
        """auto_accept is off (as the tutorial runs): the hypervisor minions' keys are accepted by a
        thread while they start (the guests' keys are pre-accepted by virt.init)."""

        def accept():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not getattr(self, "_accepted", False):
                with contextlib.suppress(OSError):  # salt-key only for a pending key: each is a Salt CLI
                    if os.listdir(self.pki_dir("minions_pre")):
                        self.cli("salt-key", "-y", "-A", timeout=60)
                time.sleep(0.5)

        threading.Thread(target=accept, daemon=True).start()


class Console:
    """Lines of a serial log file, each with the time (time.monotonic) it was first seen."""

    def __init__(self, path):
        self.path, self.lines, self.stop = path, [], threading.Event()
        try:
            self.offset = os.path.getsize(path)  # append="on": skip an earlier VM's lines
        except OSError:
            self.offset = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        buf = ""
        while not self.stop.is_set():
            try:
                with open(self.path, errors="replace") as fh:
                    fh.seek(self.offset)
                    chunk = fh.read()
                    self.offset = fh.tell()
            except OSError:
                chunk = ""
            if chunk:
                now = time.monotonic()
                buf += chunk
                *done, buf = re.split(r"\r?\n", buf)
                self.lines += [(now, ln) for ln in done if ln.strip()]
            time.sleep(0.1)

    def first(self, text=None):
        for t, ln in self.lines:
            if text is None or text in ln:
                return t
        return None

    def phases(self):
        """{name: (time.monotonic seen, guest uptime)} of the image's ``SV-PHASE`` markers (first of each)."""
        found = {}
        for t, ln in self.lines:
            m = PHASE_RE.search(ln)
            if m:
                found.setdefault(m.group(1), (t, float(m.group(2))))
        return found


class Events:
    """``salt-run state.event`` on the master: the first ``salt/minion/<id>/start`` per id, timestamped."""

    def __init__(self, stack):
        self.starts = {}
        self.proc = subprocess.Popen(
            [os.path.join(stack.bin, "salt-run"), "-c", stack.conf, "state.event", "tagmatch=salt/minion/*/start"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for line in self.proc.stdout:
            m = re.match(r"salt/minion/([^/\s]+)/start", line)
            if m:
                self.starts.setdefault(m.group(1), time.monotonic())

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Poller:
    """A burst's test.ping polls: ONE ``salt -L id1,id2,... test.ping`` at a time for every VM whose minion
    said it is up and has not answered yet (one CLI per VM, 16 at once, was itself most of the host's load).
    An answer stored in the master's job cache after a poll gave up still counts (``late_ping``)."""

    def __init__(self, stack, size):
        self.size = size  # VMs in the burst (each VM's window grows with it)
        self.stack, self.waiting, self.answers, self.polls, self.slow = stack, set(), {}, 0, 0
        self.lock, self.stop = threading.Lock(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def ask(self, name):
        """``name`` started: poll it from now on; the monotonic time of its first True, or None yet."""
        with self.lock:
            if name not in self.answers:
                self.waiting.add(name)
            return self.answers.get(name)

    def _run(self):
        while not self.stop.is_set():
            with self.lock:
                names = sorted(self.waiting)
            if not names:
                time.sleep(1)
                continue
            try:
                out = self.stack.cli(
                    "salt", "-L", ",".join(names), "test.ping", "--out=json", "-t", "30", timeout=180
                ).stdout
            except subprocess.TimeoutExpired:  # the CLI itself outlasted 180 s: no answer from it
                out = ""
                self.slow += 1
            self.polls += 1
            now = time.monotonic()
            for n in names:
                t = now if re.search(rf'"{re.escape(n)}":\s*true', out) else late_ping(self.stack, n)
                if t is not None:
                    with self.lock:
                        self.answers[n] = (t, t != now)
                        self.waiting.discard(n)
            time.sleep(1)


def direct_boot(debug):
    """virt.init's ``boot`` for a direct kernel boot of the Debian image (files the recipe exports)."""
    base = DEBIAN[: -len(".qcow2")]
    with open(base + ".cmdline") as fh:
        cmdline = fh.read().strip()
    if debug and "sv.debug" not in cmdline:
        cmdline = cmdline.replace(" quiet", "") + " sv.debug systemd.journald.forward_to_console=1"
    return json.dumps({"kernel": base + ".vmlinuz", "initrd": base + ".initrd", "cmdline": cmdline})


def one_vm(stack, hvs, events, name, quick, boot=None, keep_console=False, poller=None):
    """virt.init of ``name`` as the tutorial types it, then its boot and first answer: times since t0.
    ``hvs``: {hypervisor minion id: lab.Hypervisor}; ``boot``: virt.init's boot= (a direct kernel boot);
    ``poller``: a burst's shared ``Poller`` (else this VM polls with its own ``salt <id> test.ping``)."""
    consoles = {mid: Console(h.path("log", "qemu", f"{name}-serial.log")) for mid, h in hvs.items()}
    if quick:
        boot = json.dumps(
            {"kernel": str(common.GUEST / "vmlinuz"), "initrd": str(common.GUEST / "initrd.img"),
             "cmdline": "console=ttyS0 quiet"}
        )  # fmt: skip
        args = [
            "virt.init",
            name,
            "1",
            "256",
            "salt://images/guest.qcow2",
            "enable_qcow=True",
            "nic=None",
            f"boot={boot}",
        ]
    else:
        args = ["virt.init", name, *SIZE, "salt://images/debian.qcow2", "enable_qcow=True"]
        if boot:
            args.append(f"boot={boot}")
    cmd = ["salt-run", *args]
    t0 = time.monotonic()
    proc = subprocess.run(
        [os.path.join(stack.bin, "salt-run"), "-c", stack.conf, *args, "--out=json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    t_ret = time.monotonic()
    data = bench_fleet.last_json(proc.stdout) or {}
    res = {
        "name": name,
        "command": " ".join(cmd),
        "rc": proc.returncode,
        "host": data.get("host"),
        "started": bool((data.get("init") or {}).get("started")),
        "timeline": data.get("timeline") or [],
        "t0": t0,
        "returned": t_ret - t0,
        "error": None if proc.returncode == 0 else (data.get("error") or proc.stderr[-800:] or proc.stdout[-800:]),
    }
    console = consoles.get(res["host"])
    window = 120 if quick else max(PING_TIMEOUT, PING_PER_VM * (poller.size if poller else 1))
    deadline = time.monotonic() + window
    first_line = marker = event = ping = None
    while res["rc"] == 0 and time.monotonic() < deadline:
        if console is None:  # host name unknown: whichever console got lines
            console = next((c for c in consoles.values() if c.lines), None)
        if console is not None:
            first_line = console.first()
            marker = console.first(MARKER)
        event = events.starts.get(name) if events else None
        if quick:
            if first_line:
                break
        elif event or (marker and time.monotonic() > marker + MARKER_GRACE):
            # poll only once the minion said it is up: every `salt` command costs the host ~1-2 s of CPU,
            # which a TCG guest booting on the same 2 cores would otherwise pay for
            if poller is not None:
                got = poller.ask(name)
                if got is not None:
                    ping, res["ping_late"] = got
                    event = event or (events.starts.get(name) if events else None)
                    break
                time.sleep(1)
                continue
            try:
                out = stack.cli("salt", name, "test.ping", "--out=json", "-t", "10", timeout=60).stdout
            except subprocess.TimeoutExpired:  # the CLI itself took over 60 s (a 20-VM burst's load)
                out = ""
                res["slow_polls"] = res.get("slow_polls", 0) + 1
            if f'"{name}": true' in out:
                ping = time.monotonic()
            else:  # the CLI gave up (its -t 10 + gather_job_timeout) before the guest's answer came?
                ping = late_ping(stack, name)
                res["ping_late"] = ping is not None
            if ping is not None:
                event = event or (events.starts.get(name) if events else None)
                break
        time.sleep(0.5 if quick else 1)
    if keep_console and console and ping is not None:  # sv.debug: the guest's report comes a minute later
        end = time.monotonic() + 300
        while time.monotonic() < end and console.first("SV-DEBUG-END") is None:
            time.sleep(1)
    for c in consoles.values():
        c.stop.set()
    rel = lambda t: None if t is None else t - t0  # noqa: E731
    res.update(first_line=rel(first_line), marker=rel(marker), event=rel(event), ping=rel(ping))
    res["console_head"] = [ln for _, ln in (console.lines[:3] if console else [])]
    # the guest's phase markers: when the host saw each (since t0) and the guest's uptime in it
    res["phases"] = {k: {"at": rel(t), "uptime": up} for k, (t, up) in (console.phases() if console else {}).items()}
    if keep_console and console:
        res["console"] = [[round(rel(t), 2), ln] for t, ln in console.lines]
    if res["rc"] == 0 and (first_line is None or (not quick and ping is None)):
        res["error"] = "no console line" if first_line is None else f"no test.ping True within {window:g} s"
    return res


def identity(fabric, hvs, stack, name):
    """Where a VM's minion stood at the end, to tell the causes apart when it never answered: its MACs
    (libvirt), the addresses the fabric's DHCP server leased to them (two VMs with one address: only one of
    them can keep a TCP connection to the master), and how many returns (any job: test.ping, find_job)
    from it the master's job cache holds (answers that came after every poll had given up count here)."""
    import libvirt

    macs = []
    for h in hvs:
        conn = libvirt.open(h.uri)
        try:  # listed, not looked up: a lookup on the other hypervisors would print libvirt's error
            for dom in conn.listAllDomains():
                if dom.name() == name:
                    macs = re.findall(r"<mac address=.([0-9a-f:]+).", dom.XMLDesc())
        finally:
            conn.close()
    leased = {}
    if fabric.leases and os.path.exists(fabric.leases):
        with open(fabric.leases) as fh:
            for line in fh:  # <expiry> <mac> <ip> <hostname> <client id>
                f = line.split()
                if len(f) >= 5:
                    leased.setdefault(f[1].lower(), []).append({"ip": f[2], "client_id": f[4]})
    jobs = os.path.join(stack.conf, "var", "cache", "salt", "master", "jobs")
    returns = len(glob.glob(os.path.join(glob.escape(jobs), "*", "*", name, "return.p")))
    return {"macs": macs, "leases": {m: leased.get(m, []) for m in macs}, "master_returns": returns}


def late_ping(stack, name):
    """When (time.monotonic) the master stored the first True return of a ``test.ping`` from ``name``,
    whichever poll published it: a guest slower than one poll's window answers after its CLI gave up,
    and that answer is still an answer. None if there is none in the master's job cache."""
    import salt.payload

    jobs = os.path.join(stack.conf, "var", "cache", "salt", "master", "jobs")
    first = None
    for ret in glob.glob(os.path.join(glob.escape(jobs), "*", "*", name, "return.p")):
        job = os.path.dirname(os.path.dirname(ret))
        try:
            with open(os.path.join(job, ".load.p"), "rb") as fh:
                fun = salt.payload.loads(fh.read()).get("fun")
            with open(ret, "rb") as fh:
                answer = salt.payload.loads(fh.read())
            mtime = os.path.getmtime(ret)
        except (OSError, ValueError, AttributeError):
            continue
        answer = answer.get("return") if isinstance(answer, dict) else answer  # {return, retcode, success}
        if fun == "test.ping" and answer is True and (first is None or mtime < first):
            first = mtime
    return None if first is None else time.monotonic() - (time.time() - first)


def identity_notes(burst):
    """One line per burst VM (MACs, leased addresses, returns the master got) and the shared addresses."""
    notes, owners = [], {}
    for r in burst:
        ident = r.get("identity") or {}
        ips = sorted({x["ip"] for leases in ident.get("leases", {}).values() for x in leases})
        for ip in ips:
            owners.setdefault(ip, []).append(r["name"])
        notes.append(
            f"{r['name']} on {r['host']}: MAC {', '.join(ident.get('macs') or ['?'])}, "
            f"leased {', '.join(ips) or 'none'}, "
            f"{ident.get('master_returns', '?')} return(s) in the master's job cache, first True ping "
            + ("none" if r.get("ping") is None else f"at {r['ping']:.1f} s")
            + (" (after its poll's CLI had given up)" if r.get("ping_late") else "")
        )
    shared = {ip: names for ip, names in owners.items() if len(names) > 1}
    notes.append(f"addresses leased to more than one VM: {shared or 'none'}")
    answered = [r["t0"] + r["ping"] for r in burst if r.get("ping") is not None]
    if answered:
        wall = max(answered) - min(r["t0"] for r in burst)
        notes.append(
            f"{len(answered)}/{len(burst)} answered; first `salt-run virt.init` start to the last first True "
            f"ping: {wall:.1f} s = {len(answered) * 60 / wall:.2f} VMs per minute"
        )
    return notes if burst else []


def _at(timeline, step):
    return next((t["at"] for t in timeline if t["step"] == step), None)


def _ph(r, name, clock="at"):
    return (r.get("phases") or {}).get(name, {}).get(clock)


def _up(r, a, b):
    """Guest uptime between two markers (the guest's own clock)."""
    return _ph(r, b, "uptime") - _ph(r, a, "uptime") if _ph(r, a) is not None and _ph(r, b) is not None else None


PHASES = [
    ("salt-run virt.init: runner function to `started` (timeline)", lambda r: _at(r["timeline"], "started")),
    (
        "salt-run virt.init: rest of the command (CLI start-up, after `started`, exit)",
        lambda r: r["returned"] - _at(r["timeline"], "started") if _at(r["timeline"], "started") else None,
    ),
    ("returned → console's first line (firmware, bootloader, quiet kernel)", lambda r: _d(r, "returned", "first_line")),
    ("returned → SV-PHASE systemd (firmware, boot loader, kernel, initrd)", lambda r: _d(r, "returned", "systemd")),
    ("  of it: kernel + initrd (guest uptime at SV-PHASE systemd)", lambda r: _ph(r, "systemd", "uptime")),
    ("SV-PHASE systemd → dhcp (guest uptime: udev, networkd, the lease)", lambda r: _up(r, "systemd", "dhcp")),
    ("SV-PHASE systemd → minion-start (guest uptime: units first)", lambda r: _up(r, "systemd", "minion-start")),
    ("console's first line → SALT-MINION-START (systemd to the minion unit)", lambda r: _d(r, "first_line", "marker")),
    ("SALT-MINION-START → salt/minion/<id>/start event (minion start-up, auth)", lambda r: _d(r, "marker", "event")),
    ("start event → first test.ping True (a `salt` command each poll)", lambda r: _d(r, "event", "ping")),
]  # fmt: skip
POINTS = [
    ("salt-run virt.init returned", "returned"),
    ("console's first line", "first_line"),
    ("SV-PHASE systemd (PID 1 runs units)", "systemd"),
    ("SV-PHASE dhcp (a routable address)", "dhcp"),
    ("SALT-MINION-START on the console", "marker"),
    ("salt/minion/<id>/start event", "event"),
    ("first `salt <id> test.ping` True", "ping"),
]


def _v(r, k):
    return r.get(k) if k in r else _ph(r, k)


def _d(r, a, b):
    va, vb = _v(r, a), _v(r, b)
    return vb - va if va is not None and vb is not None else None


def render(label, runs, quick):
    good = [r for r in runs if r["rc"] == 0]  # a VM that never answered still counts up to where it got (n)
    steps = {}
    for r in good:
        for t in r["timeline"]:
            steps.setdefault(t["step"], []).append(t["at"])
    last = "first_line" if quick else "ping"
    stat = lambda vals: common.fmt_stat(common.summary(vals))  # noqa: E731
    points = [[p, stat([_v(r, k) for r in good])] for p, k in POINTS if not quick or k in ("returned", "first_line")]
    phases = [[p, stat([f(r) for r in good])] for p, f in PHASES[: 3 if quick else None]]
    phases = [row for row in phases if not row[1].startswith("—")] if not quick else phases
    tl = [[s, stat(v)] for s, v in steps.items()]
    return [
        f"{label}: seconds since `salt-run virt.init` started, median (min–max, n); "
        f"{sum(1 for r in good if r.get(last) is not None)}/{len(runs)} reached the last point\n\n"
        + common.table(["point", "at"], points),
        f"{label}: where the time goes (phase durations), median (min–max, n)\n\n"
        + common.table(["phase", "seconds"], phases),
        f"{label}: the runner's `timeline` (seconds since the runner function began)\n\n"
        + common.table(["step", "at"], tl),
    ]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--ratios" in argv:  # issue #40's three ratios, each against its floor: bench_tutorial_ratios.py
        import bench_tutorial_ratios

        return bench_tutorial_ratios.main([a for a in argv if a != "--ratios"])
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ratios", action="store_true", help="issue #40's ratios: bench_tutorial_ratios.py (its --help)")
    ap.add_argument("--reps", type=int, help="1-VM runs, one after the other")
    ap.add_argument("--burst", type=int, help="VMs started at once (0: none)")
    ap.add_argument("--direct-kernel", action="store_true", help="boot the image's kernel + initrd directly")
    ap.add_argument("--debug", action="store_true", help="with --direct-kernel: sv.debug, whole console kept")
    ap.add_argument("--vcpus", type=int, default=1, help="each VM's vCPUs (the README's tutorial: 2)")
    ap.add_argument("--mem", type=int, default=512, help="each VM's MiB (the README's tutorial: 1024)")
    args = ap.parse_args(argv)
    if args.debug and not args.direct_kernel:
        ap.error("--debug needs --direct-kernel (the image's own command line is fixed)")
    cfg = dict(QUICK if args.quick else FULL)
    SIZE[:] = [str(args.vcpus), str(args.mem)]
    cfg.update({k: getattr(args, k) for k in ("reps", "burst") if getattr(args, k) is not None})
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    if not args.quick and not os.path.isfile(DEBIAN):
        print(f"{DEBIAN} is missing: run scripts/setup.sh (it builds the Debian guest image)", file=sys.stderr)
        return 2
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svt", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)  # QEMU (libvirt-qemu) must reach the VM disks below it
    fabric, hvs, stack, events = None, [], None, None
    runs, errors = {"single": [], "burst": []}, []
    try:
        fabric = lab.Fabric(lab.new_tag()).start()
        master_ip = None
        if not args.quick:
            master_ip = fabric.master_link()
            fabric.dhcp()
        for i in range(cfg["hosts"]):
            hvs.append(lab.Hypervisor(os.path.join(workdir, "hv"), i + 1, fabric).start())
        srv = os.path.join(workdir, "s", "srv", "images")
        os.makedirs(srv)
        if args.quick:
            shutil.copyfile(common.GUEST / "disk.qcow2", os.path.join(srv, "guest.qcow2"))
        else:
            os.symlink(DEBIAN, os.path.join(srv, "debian.qcow2"))
        extra = {
            "interface": "127.0.0.1" if args.quick else "0.0.0.0",
            "auto_accept": False,
            "virt": {
                "hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 30, "gather_job_timeout": 30},
                "guest_master": master_ip or "127.0.0.1",
            },
        }
        if args.quick:
            extra.update(bench_fleet.QUICK_MASTER)
        TutStack.direct_kernel = args.direct_kernel and not args.quick
        # placement allows 4 vCPUs per host CPU (virt:placement:cpu_overcommit): the lab hypervisors all run
        # on this machine's CPUs, so a larger burst gets the operator's higher ratio, or its last VMs are
        # refused for room
        cpus = cfg["hosts"] * (os.cpu_count() or 1)
        if cfg["burst"] > 4 * cpus:
            extra["virt"]["placement"] = {"cpu_overcommit": float(-(-cfg["burst"] // cpus))}
        stack = TutStack(
            "salt-virt",
            str(common.OUR_VENV),
            os.path.join(workdir, "s"),
            [h.uri for h in hvs],
            [str(common.ROOT / "_runners")],
            [str(common.ROOT / "_modules")],
            extra,
        )
        log(f"tutorial: salt-master + {cfg['hosts']} lab hypervisor(s)")
        stack.start()
        stack._accepted = True
        image = "salt://images/guest.qcow2" if args.quick else "salt://images/debian.qcow2"
        if not args.quick:  # the busybox disk is tiny: --quick saves the extra salt command
            log(f"tutorial: warming {image} on every hypervisor")
            cached = stack.cli("salt", "hyper*", "virt.image_warm", image, "--out=json", "--static", "-t", "300")
            if cached.returncode != 0:
                raise RuntimeError(f"virt.image_warm: {cached.stdout[-500:]} {cached.stderr[-500:]}")
        events = None if args.quick else Events(stack)
        time.sleep(0 if args.quick else 3)  # the event listener is subscribed before the first init
        vm_hvs = {f"hyper{i:02d}": h for i, h in enumerate(hvs)}
        boot = direct_boot(args.debug) if args.direct_kernel and not args.quick else None
        for rep in range(cfg["reps"]):
            name = "web1" if rep == 0 else f"web1r{rep}"
            log(f"tutorial: 1 VM ({name}), rep {rep + 1}/{cfg['reps']}")
            r = one_vm(stack, vm_hvs, events, name, args.quick, boot, args.debug)
            runs["single"].append(r)
            log(
                f"tutorial: {name}: "
                + json.dumps({k: r[k] for k in ("returned", "first_line", "marker", "event", "ping", "phases")})
            )
            stack.cli("salt-run", "virt.purge", name, timeout=300)
        if cfg["burst"]:
            load_b = common.loadavg()
            names = [f"web{i + 2}" for i in range(cfg["burst"])]
            log(f"tutorial: {len(names)} VMs at once: {', '.join(names)} (load {load_b})")
            poller = Poller(stack, len(names))
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
                futs = [pool.submit(one_vm, stack, vm_hvs, events, n, False, boot, args.debug, poller) for n in names]
                runs["burst"] = [f.result() for f in futs]
            poller.stop.set()
            runs["burst_polls"] = (poller.polls, poller.slow)
            runs["burst_load"] = (load_b, common.loadavg())
            for r in runs["burst"]:
                r["identity"] = identity(fabric, hvs, stack, r["name"])
            for r in runs["burst"]:
                log(f"tutorial: {r['name']} on {r['host']}: ping at {r['ping']}: {json.dumps(r['identity'])}")
    except Exception as exc:  # noqa: BLE001 - reported in the result
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        if events:
            events.close()
        if stack:
            stack.stop()
        for h in hvs:
            h.stop()
        if fabric:
            fabric.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    for r in runs["single"] + runs["burst"]:
        if r["error"]:
            errors.append(f"{r['name']}: rc={r['rc']}: {r['error']}")
    guest = "busybox test guest (no minion)" if args.quick else "Debian 12 + salt-minion"
    tables = render(f"1 VM ({guest}), one after the other", runs["single"], args.quick)
    if runs["burst"]:
        per_host = {}
        for r in runs["burst"]:
            per_host[r["host"]] = per_host.get(r["host"], 0) + 1
        tables += render(
            f"{cfg['burst']} VMs at once on {cfg['hosts']} hypervisors "
            f"({', '.join(f'{h}: {n}' for h, n in sorted(per_host.items(), key=str))})",
            runs["burst"],
            False,
        )
    result = {
        "title": "9. tutorial: salt-run virt.init to the first test.ping",
        "tables": tables,
        "runs": runs,
        "notes": [
            f"command: `{(runs['single'] or runs['burst'] or [{'command': '?'}])[0]['command']}` "
            "(then `salt <id> test.ping` until True)",
            f"load average before/after: {load0} / {common.loadavg()}",
            f"image: {os.path.realpath(DEBIAN)}; boot: "
            + (
                "direct kernel (the image's exported kernel, initrd, command line)"
                if args.direct_kernel
                else "BIOS + extlinux"
            )
            + (", sv.debug" if args.debug else ""),
        ]
        + ([f"load average before/after the burst: {' / '.join(runs['burst_load'])}"] if "burst_load" in runs else [])
        + (
            [
                f"burst polls: {runs['burst_polls'][0]} `salt -L <started ids> test.ping -t 30` CLIs, one at a time "
                f"({runs['burst_polls'][1]} outlasted 180 s)"
            ]
            if "burst_polls" in runs
            else []
        )  # fmt: skip
        + identity_notes(runs["burst"])
        + [f"ERROR {e}" for e in errors],
    }
    common.emit("tutorial", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
