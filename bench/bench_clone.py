"""Clone time vs image size: ``saltvirt.storage.images.clone`` full copy vs qcow2 overlay (256 MiB, 1 GiB, 4 GiB).

Base images hold real data: in every 4 MiB, 3 MiB of random bytes and a 1 MiB hole (sparse), so a
copy has 3/4 of the virtual size to move and an overlay has nothing to move. The qcow2 base is
converted from the raw one. Each clone is checked: an overlay must be flat (one backing file: the base,
which has none) and record its backing format.

Timed: ``images.clone`` itself, as ``virt.init`` calls it (no fsync: the copy sits in the page cache;
the base images were just written, so their data is in the page cache too). The ``+ fsync`` column
is the time to then flush the new file to disk, measured separately.

    bench/run --only clone            # or: $VENV/bin/python bench/bench_clone.py [--quick]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

MIB = 1 << 20
FULL = {"sizes_mib": [256, 1024, 4096], "copy_reps": 3, "overlay_reps": 10}
QUICK = {"sizes_mib": [8, 32], "copy_reps": 1, "overlay_reps": 2}


def make_base(path, size_mib):
    """Raw image: 3 MiB random + 1 MiB hole per 4 MiB (the last 4 MiB block may be partial)."""
    with open(path, "wb") as fh:
        fh.truncate(size_mib * MIB)
        for mib in range(size_mib):
            if mib % 4 != 3:
                fh.seek(mib * MIB)
                fh.write(os.urandom(MIB))
        fh.flush()
        os.fsync(fh.fileno())


def clone_once(src, dst, overlay, fmt):
    """One clone in a fresh process of our venv (bench/worker.py, mode clone) + its fsync time."""
    spec = {
        "mode": "clone",
        "utils_path": str(common.ROOT / "_utils"),
        "src": src,
        "dest_dir": os.path.dirname(dst),
        "overlay": overlay,
        "fmt": fmt,
        "reps": 1,
        "fsync": True,
    }
    return common.run_worker(common.py(common.OUR_VENV), spec, timeout=1800)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", help="comma-separated sizes in MiB (default 256,1024,4096)")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.sizes:
        cfg["sizes_mib"] = [int(s) for s in args.sizes.split(",")]
    sys.path.insert(0, str(common.ROOT / "_utils"))
    try:
        from saltvirt.storage import images  # noqa: F401 - only to fail early and clearly
    except ImportError as exc:
        common.emit(
            "clone",
            {
                "title": "2. clone time vs image size",
                "tables": [],
                "notes": [f"PENDING: saltvirt.storage.images is not importable yet ({exc})"],
            },
        )
        return 1
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svbench-c", dir="/var/tmp")
    results, errors = {}, []
    try:
        for size in cfg["sizes_mib"]:
            base_raw, base_qcow2 = (
                os.path.join(workdir, f"base-{size}.raw"),
                os.path.join(workdir, f"base-{size}.qcow2"),
            )
            log(f"clone: writing a {size} MiB base image")
            t0 = time.perf_counter()
            make_base(base_raw, size)
            subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", base_raw, base_qcow2], check=True)
            prep = time.perf_counter() - t0
            cases = [
                ("full copy raw -> raw (cp)", base_raw, False, "raw", cfg["copy_reps"]),
                ("full copy qcow2 -> qcow2 (qemu-img convert)", base_qcow2, False, "qcow2", cfg["copy_reps"]),
                ("overlay on qcow2 base", base_qcow2, True, "qcow2", cfg["overlay_reps"]),
                ("overlay on raw base", base_raw, True, "qcow2", cfg["overlay_reps"]),
            ]
            dest_dir = os.path.join(workdir, "dest")
            os.makedirs(dest_dir, exist_ok=True)
            for label, src, overlay, fmt, reps in cases:
                times, fsyncs, chain = [], [], None
                for r in range(reps):
                    log(f"clone {size} MiB: {label} {r + 1}/{reps}")
                    ans = clone_once(src, os.path.join(dest_dir, "x"), overlay, fmt)
                    if not ans.get("ok"):
                        errors.append(f"{size} MiB {label}: {ans['error'][-500:]}")
                        break
                    times += ans["times"]
                    fsyncs += ans.get("fsync_times", [])
                    chain = ans["chain"]
                if overlay and chain and (chain["depth"] != 1 or chain["backing"] != src):
                    errors.append(f"{size} MiB {label}: overlay not flat: {json.dumps(chain)}")
                results[(size, label)] = {
                    "time": common.summary(times),
                    "fsync": common.summary(fsyncs),
                    "chain": chain,
                    "actual": chain and chain["actual_size"],
                }
            st = os.stat(base_raw)
            results[(size, "_base")] = {"prep_s": prep, "raw_allocated_mib": st.st_blocks * 512 / MIB}
            os.unlink(base_raw)
            os.unlink(base_qcow2)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    labels = [k[1] for k in results if k[0] == cfg["sizes_mib"][0] and k[1] != "_base"]
    rows = []
    for label in labels:
        row = [label]
        for size in cfg["sizes_mib"]:
            r = results.get((size, label))
            if not r or not r["time"]:
                row.append("—")
                continue
            cell = common.fmt_stat(r["time"])
            if r["fsync"]:
                cell += f"; + fsync {common.fmt_s(r['fsync']['median'])}"
            if r["chain"]:
                cell += f"; file {r['chain']['actual_size'] / MIB:.1f} MiB"
                if r["chain"]["depth"]:
                    cell += f", chain depth {r['chain']['depth']}"
            row.append(cell)
        rows.append(row)
    growth = []
    for label in labels:
        pts = [results.get((s, label)) for s in cfg["sizes_mib"]]
        meds = [p["time"]["median"] for p in pts if p and p["time"]]
        if len(meds) == len(cfg["sizes_mib"]) and meds[0]:
            growth.append([label] + [f"{m / meds[0]:.2f}x" for m in meds])
    sizes_hdr = [f"{s} MiB" if s < 1024 else f"{s // 1024} GiB" for s in cfg["sizes_mib"]]
    tables = [
        "Clone time, median (min–max, n); the new file's allocated size; chain depth 1 = flat overlay\n\n"
        + common.table(["clone"] + sizes_hdr, rows),
        f"Time relative to the {sizes_hdr[0]} image (size grows {cfg['sizes_mib'][-1] // cfg['sizes_mib'][0]}x):\n\n"
        + common.table(["clone"] + sizes_hdr, growth),
    ]
    bases = [
        f"{s} MiB base: {results[(s, '_base')]['raw_allocated_mib']:.0f} MiB allocated (raw), made in "
        f"{results[(s, '_base')]['prep_s']:.1f} s"
        for s in cfg["sizes_mib"]
        if (s, "_base") in results
    ]
    result = {
        "title": "2. clone time vs image size",
        "tables": tables,
        "rows": {f"{k[0]}/{k[1]}": v for k, v in results.items()},
        "notes": [f"load average before/after: {load0} / {common.loadavg()}"] + bases + [f"ERROR {e}" for e in errors],
    }
    common.emit("clone", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
