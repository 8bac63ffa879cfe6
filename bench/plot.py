#!/usr/bin/env python3
"""Time against size for the query and fleet-scale benches: one PNG from their JSON results.

    BENCH_JSON_DIR=bench/data $VENV/bin/python bench/bench_query.py --backend real ...   # writes query.json
    BENCH_JSON_DIR=bench/data $VENV/bin/python bench/bench_scale.py ...                  # writes scale.json
    bench/plot.py [bench/data] [bench/scale.png]
    BENCH_JSON_DIR=bench/data $VENV/bin/python bench/bench_fleetwire.py ...              # writes fleetwire.json
    bench/plot.py fleetwire [bench/data] [bench/fleetwire.png]

matplotlib comes from its own venv (bench/setup-plot.sh), never from the test requirements: this script
re-executes itself there when the running Python has no matplotlib.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(folder, name):
    path = os.path.join(folder, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def _series(rows, key, pick):
    out = {}
    for r in rows:
        if pick(r) and r.get("wall"):
            out.setdefault(key(r), []).append((r["size"], r["wall"]["median"], r["wall"]["min"], r["wall"]["max"]))
    return {k: sorted(v) for k, v in out.items()}


def _draw(ax, series, xlabel, title):
    for label, pts in series.items():
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("seconds (median, min–max)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot(folder, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    query, scale = _load(folder, "query"), _load(folder, "scale")
    panels = []
    if query:
        rows = [r for r in query["rows"] if r["backend"] == "real"]
        panels.append(
            (_series(rows, lambda r: r["impl"], lambda r: True), "domains on one libvirtd", "virt.full_info, one host")
        )
    if scale:
        syn = _series(scale["rows"], lambda r: f"salt-run {r['func']}", lambda r: r["part"] == "synthetic")
        panels.append((syn, "hypervisors (synthetic answers, 20 VMs each)", "runner aggregation + placement"))
    if not panels:
        raise SystemExit(f"no query.json / scale.json in {folder}")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    for ax, (series, xlabel, title) in zip(axes if len(panels) > 1 else [axes], panels, strict=True):
        _draw(ax, series, xlabel, title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


def plot_fleetwire(folder, out):
    """bench_fleetwire: time and memory against the fleet's VMs, linear axes (straight lines: linear growth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wire = _load(folder, "fleetwire")
    if not wire:
        raise SystemExit(f"no fleetwire.json in {folder}")
    rows = [dict(r, size=r["vms"]) for r in wire["rows"] if r["func"] != "master"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, pts in _series(rows, lambda r: r["func"], lambda r: True).items():
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        left.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label, linestyle="--" if "floor" in label else "-")
    left.axhline(2.0, color="grey", linewidth=0.8, linestyle=":", label="goal: 2 s")
    left.set_xlabel("VMs (100 per simulated hypervisor)")
    left.set_ylabel("seconds, whole command (median, min–max)")
    left.set_title("real salt-master and wire, simulated hypervisors", fontsize=10)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    master = sorted((r["hosts"] * 100, r["rss_peak_kib"] / 1024) for r in wire["rows"] if r["func"] == "master")
    right.plot([m[0] for m in master], [m[1] for m in master], marker="o", label="salt-master, sum of VmRSS (peak)")
    for label in ("salt-run virt.query", "salt-run virt.list"):
        pts = sorted(
            (r["vms"], r["cli_rss_kib"]["max"] / 1024) for r in rows if r["func"] == label and r["cli_rss_kib"]
        )
        right.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{label}: CLI peak RSS")
    right.set_xlabel("VMs (100 per simulated hypervisor)")
    right.set_ylabel("MiB")
    right.set_title("memory", fontsize=10)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


def main(argv):
    if argv and argv[0] == "fleetwire":  # bench/plot.py fleetwire [bench/data] [bench/fleetwire.png]
        folder = argv[1] if len(argv) > 1 else os.path.join(HERE, "data")
        out = argv[2] if len(argv) > 2 else os.path.join(HERE, "fleetwire.png")
        _ensure_matplotlib([*argv[:1], folder, out])
        return plot_fleetwire(folder, out)
    folder = argv[0] if argv else os.path.join(HERE, "data")
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "scale.png")
    _ensure_matplotlib([folder, out])
    plot(folder, out)


def _ensure_matplotlib(argv):
    """Re-execute this script with ``argv`` in the plotting venv when this Python has no matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        venv = (
            subprocess.run([os.path.join(HERE, "setup-plot.sh")], capture_output=True, text=True, check=True)
            .stdout.split("venv: ")[-1]
            .strip()
        )
        os.execv(os.path.join(venv, "bin", "python"), [os.path.join(venv, "bin", "python"), __file__, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
