"""VM creation on a real libvirtd: salt-virt ``virt.init`` vs the raw libvirt-python floor vs
saltext-virt 0.1.0's ``virt.init``, same domain shape, same hypervisor, one run.

Shape: 1 vCPU, 256 MiB, the test guest's disk as a qcow2 overlay (or a full copy of the 64 MiB raw
disk), one virtio NIC on bridge br0, direct kernel boot, type qemu (TCG). Timed: from the call to
"defined and started" (libvirt's create() returned), in a process where the loader is already set up.
The floor does the least any tool must: ``qemu-img create`` (or a file copy), defineXML, create().

Each variant runs in ``procs`` fresh processes of ``reps`` calls each: one process per variant set up at
once, then the calls interleaved (floor, ours, ..., floor, ours, ...; a new order each round), so
that load from elsewhere on the machine hits all of them alike. Every VM is destroyed, undefined and its
files removed after its call (untimed). The loader processes share one Salt cachedir, as a minion's jobs
(each a process of its own) share the minion's: what salt-virt keeps there (the detected domain type) is
worked out by the first call of the first process and found by the others.

    bench/run --only init             # or: $VENV/bin/python bench/bench_init.py [--quick]
"""

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

sys.path.insert(0, str(common.ROOT))  # the lab the way the tests import it
from tests.support import lab

# (label, impl, extra spec). vtype/hypervisor=qemu everywhere: the apples-to-apples rows.
# The loader processes have a minion event bus (event_bus), as inside a running salt-minion.
VARIANTS = [
    ("raw libvirt-python (floor)", "raw", {}),
    ("salt-virt virt.init seed=False", "salt-virt", {"seed": False, "vtype": "qemu", "event_bus": True}),
    ("saltext-virt 0.1.0 virt.init seed=False", "saltext-virt", {"event_bus": True}),
    ("salt-virt virt.init seed=True", "salt-virt", {"seed": True, "vtype": "qemu", "event_bus": True}),
    ("salt-virt virt.init seed=False, type auto-detected", "salt-virt", {"seed": False, "event_bus": True}),
    ("salt-virt virt.init seed=False, no minion event bus", "salt-virt", {"seed": False, "vtype": "qemu"}),
    (
        "salt-virt virt.init seed=False, bus in its own process",
        "salt-virt",
        {"seed": False, "vtype": "qemu", "event_bus": "process"},
    ),
]


def guest_files():
    g = common.GUEST
    return {
        "kernel": str(g / "vmlinuz"),
        "initrd": str(g / "initrd.img"),
        "raw": str(g / "disk.raw"),
        "qcow2": str(g / "disk.qcow2"),
        "cmdline": "console=ttyS0 quiet",
    }


# disk mode -> (overlay?, start?, variants to run). "define" isolates the tools' own overhead from
# QEMU's start-up, whose time varies by +-100 ms here.
MODES = {
    "overlay": (True, True, None),
    "copy": (False, True, None),
    "define": (
        False,
        False,
        {
            "raw libvirt-python (floor)",
            "salt-virt virt.init seed=False",
            "saltext-virt 0.1.0 virt.init seed=False",
            "salt-virt virt.init seed=True",  # seeding's own cost, without QEMU's start-up around it
            "salt-virt virt.init seed=False, type auto-detected",
            "salt-virt virt.init seed=False, no minion event bus",
            "salt-virt virt.init seed=False, bus in its own process",
        },
    ),
}
TITLES = {
    "overlay": "qcow2 overlay on the guest's qcow2 disk, define + start",
    "copy": "full copy of the 64 MiB raw disk, define + start",
    "define": "full copy of the 64 MiB raw disk, define only (start=False)",
}


QUICK_SKIP = {
    "salt-virt virt.init seed=False, type auto-detected",
    "salt-virt virt.init seed=False, no minion event bus",
    "salt-virt virt.init seed=False, bus in its own process",
}


def run(procs, reps, workdir, log, disk_modes=("overlay", "copy", "define"), skip=(), warm=True):
    impls = common.impls()
    fabric = lab.Fabric(lab.new_tag()).start()
    hv = None
    answers = {}
    try:
        hv = lab.Hypervisor(os.path.join(workdir, "lab"), 1, fabric).start()
        # a fresh lab libvirtd has no /var/log/libvirt/qemu yet; every variant logs the serial console there
        os.makedirs(hv.path("log", "qemu"), exist_ok=True)
        images_dir = os.path.join(workdir, "images")
        os.makedirs(images_dir, mode=0o755)
        cachedir = os.path.join(workdir, "minion-cache")  # one minion: its jobs' processes share it
        # warm-up, untimed: a fresh libvirtd probes QEMU's capabilities at its first domain start (seconds)
        log("init: warm-up (libvirtd probes QEMU once)" if warm else "init: no warm-up (--quick)")
        if warm:
            warm = common.run_worker(
                impls["salt-virt"]["python"],
                {
                    "mode": "init",
                    "impl": "raw",
                    "uri": hv.uri,
                    "images_dir": images_dir,
                    "guest": guest_files(),
                    "overlay": True,
                    "image_format": "raw",
                    "reps": 2,
                    "prefix": "warm",
                },
                timeout=600,
            )
            if not warm.get("ok") or warm.get("errors"):
                raise RuntimeError(f"warm-up VM failed: {warm.get('error') or warm.get('errors')}")
            import libvirt  # and libvirtd builds its host capabilities once (~4 s here), on the first ask

            conn = libvirt.open(hv.uri)
            conn.getCapabilities()
            conn.close()
        for mode in disk_modes:
            overlay, start, only = MODES[mode]
            chosen = [v for v in VARIANTS if not (only and v[0] not in only) and v[0] not in skip]
            for p in range(procs):
                specs = {}
                for n, (label, impl_name, extra) in enumerate(chosen):
                    specs[label] = dict(
                        {
                            "mode": "init",
                            "impl": impl_name,
                            "uri": hv.uri,
                            "images_dir": images_dir,
                            "guest": guest_files(),
                            "overlay": overlay,
                            "start": start,
                            "image_format": "raw",
                            "serve": True,
                            "prefix": f"b{mode[0]}{p}v{n}i",
                            "virt": {
                                "connection": {"uri": hv.uri},
                                "images": images_dir,
                                "allowed_paths": [str(common.GUEST)],  # the guest's kernel/initrd (direct boot)
                            },
                            "module_dirs": impls[impl_name]["module_dirs"] if impl_name != "raw" else [],
                            "cachedir": cachedir,
                        },
                        **extra,
                    )
                log(f"init {mode}: process set {p + 1}/{procs}, {len(chosen)} variants x {reps} calls, interleaved")
                for label, got in interleaved(impls, chosen, specs, reps, workdir).items():
                    answers.setdefault((mode, label), []).append(got)
    finally:
        if hv:
            hv.stop()
        fabric.stop()
    return answers


def interleaved(impls, chosen, specs, reps, workdir):
    """One process per variant, set up first (untimed), then call by call in turn (a new order each
    round), so that load from elsewhere on the machine falls on every variant alike: per variant
    ``{ok, times, errors, results}`` (or ``{ok: False, error}`` when its process did not come up)."""
    procs, out = {}, {}
    try:
        for label, impl_name, _extra in chosen:
            python = impls["salt-virt" if impl_name == "raw" else impl_name]["python"]
            err = open(os.path.join(workdir, f"worker-{len(procs)}.err"), "w+")  # noqa: SIM115 - closed below
            proc = subprocess.Popen(
                [python, str(common.WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
            procs[label] = (proc, err)
            proc.stdin.write(json.dumps(specs[label]) + "\n")
            proc.stdin.flush()
        for label, (proc, err) in procs.items():
            ready = _answer(proc)
            out[label] = {"ok": True, "times": [], "errors": [], "results": []}
            if not ready.get("ready"):
                err.seek(0)
                out[label] = {"ok": False, "error": err.read()[-3000:] or "the worker did not come up"}
        shuffle = random.Random(len(chosen) * 1000 + reps).shuffle  # the same orders in every run
        for i in range(reps):
            turn = list(chosen)
            shuffle(turn)  # no variant always right after another (a seeding's key refill, a VM's start)
            for label, _impl, _extra in turn:
                got = out[label]
                if not got["ok"]:
                    continue
                one = _call(procs[label][0], f"{specs[label]['prefix']}{i}")
                if "error" in one:
                    got["errors"].append(one["error"])
                else:
                    got["times"].append(one["time"])
                    if len(got["results"]) < 2:
                        got["results"].append(one["result"])
    finally:
        for proc, err in procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            err.close()
    return out


def _answer(proc):
    """The worker's next JSON line ({} when it ended)."""
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    return {}


def _call(proc, name):
    proc.stdin.write(json.dumps({"name": name}) + "\n")
    proc.stdin.flush()
    return _answer(proc) or {"error": f"the worker ended (exit {proc.poll()})"}


def render(answers):
    tables, errors, rows_json, notes = [], [], [], []
    for mode in MODES:
        floor = None
        body = []
        for label, _impl, _extra in VARIANTS:
            procs = answers.get((mode, label))
            if procs is None:
                continue
            ok = [a for a in procs if a.get("ok")]
            times = [t for a in ok for t in a["times"]]
            firsts = [a["times"][0] for a in ok if a["times"]]
            errs = [e for a in ok for e in a.get("errors", [])] + [a["error"] for a in procs if not a.get("ok")]
            st = common.summary(times)
            if label.startswith("raw"):
                floor = st and st["median"]
            med = st and st["median"]
            body.append(
                [
                    label,
                    common.fmt_stat(st),
                    f"**{common.ratio(med, floor)}**" if med else "—",
                    common.fmt_s(common.summary(firsts)["median"]) if firsts else "—",
                    f"{len(errs)} failed" if errs else "ok",
                ]
            )
            sample = next((a["results"][0] for a in ok if a.get("results")), None)
            rows_json.append(
                {
                    "mode": mode,
                    "variant": label,
                    "times": st,
                    "first_call": common.summary(firsts),
                    "errors": errs[:3],
                    "sample": sample,
                }
            )
            shown = label
            if isinstance(sample, dict) and sample.get("seed"):
                shown = f"{label} ({sample['seed'].get('backend')})"
                body[-1][0] = shown
            if errs:
                errors.append(f"{mode} / {shown}: {len(errs)} call(s) failed; first: {errs[0][-600:]}")
        if not body:
            continue
        seeded = {r["variant"]: r["times"] for r in rows_json if r["mode"] == mode and r["times"]}
        on, off = seeded.get("salt-virt virt.init seed=True"), seeded.get("salt-virt virt.init seed=False")
        if on and off:  # seeding's own cost: the same init with and without it, in this run
            extra = (on["median"] - off["median"]) * 1000
            both = f"{common.fmt_s(on['median'])} vs {common.fmt_s(off['median'])}"
            notes.append(f"{mode}: seeding adds {extra:+.0f} ms ({both}, medians)")
        tables.append(
            f"**{TITLES[mode]}** — median (min–max, n)\n\n"
            + common.table(["variant", "time", "vs floor", "first call in a process", "status"], body)
        )
    return tables, errors, rows_json, notes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one process, one call per variant, overlay only")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", help=f"comma-separated subset of {','.join(MODES)} (default: all)")
    args = ap.parse_args(argv)
    procs, reps = (1, 1) if args.quick else (args.procs, args.reps)
    workdir = tempfile.mkdtemp(prefix="svbench-i", dir="/var/tmp")
    os.chmod(workdir, 0o755)
    load0 = common.loadavg()
    try:
        answers = run(
            procs,
            reps,
            workdir,
            lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True),
            disk_modes=("overlay",) if args.quick else tuple(args.modes.split(",") if args.modes else MODES),
            skip=QUICK_SKIP if args.quick else (),
            warm=not args.quick,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    tables, errors, rows, seeding = render(answers)
    result = {
        "title": "1. virt.init vs raw libvirt vs saltext-virt (real libvirtd, TCG)",
        "rows": rows,
        "tables": tables,
        "notes": [f"load average before/after: {load0} / {common.loadavg()}", *seeding]
        + [f"FAILED {e}" for e in errors],
    }
    common.emit("init", result)
    # the competitor's failures are results, not a failure of this script; ours are
    return 1 if any("salt-virt" in e.split(" / ")[1][:10] or "raw" in e.split(" / ")[1][:4] for e in errors) else 0


if __name__ == "__main__":
    sys.exit(main())
