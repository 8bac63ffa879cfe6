"""Query at scale on one hypervisor: ``virt.full_info`` of salt-virt vs saltext-virt 0.1.0, against the
raw libvirt-python floor (bulk APIs: bench/worker.py ``raw_full_info``).

Backends:
  test   libvirt's test driver with a node XML of N domains (``test:///abs/node.xml``). The driver runs
         inside the calling process and re-reads the node file on every connection open, so an open
         costs O(N) there (on a real libvirtd it costs a few ms whatever N).
  real   a real libvirtd (tests/support/lab.py) with N defined (inactive) domains of the same shape:
         the fair check of the test driver's figures.

Each measurement is one call in a fresh process (loader set-up untimed); the processes of both
implementations alternate. Peak memory: VmHWM of that process, and its growth over the RSS before the call.

    bench/run --only query            # or: $VENV/bin/python bench/bench_query.py [--quick] [--backend test]
"""

import argparse
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import nodexml

# fresh processes per (implementation, size): saltext-virt's cost grows with N^2 on the test driver
# (4 new connections per domain), so it gets fewer repetitions at the large sizes.
FULL = {"sizes": [100, 300, 1000], "reps": {"salt-virt": 5, "saltext-virt": {100: 3, 300: 2, 1000: 1}}}
QUICK = {"sizes": [5], "reps": {"salt-virt": 1, "saltext-virt": {5: 1}}}


def reps_for(cfg, impl, size):
    r = cfg["reps"][impl]
    return r if isinstance(r, int) else r.get(size, 1)


FLOOR = "raw libvirt-python (floor)"
FLOOR_KA = "raw libvirt-python + keepalive"
CAP_COLD = "salt-virt virt.capacity, cold cache"
CAP_WARM = "salt-virt virt.capacity, warm cache"


def measure(impl, uri, reps, images_dir, timeout):
    """``reps`` fresh processes, one full_info call each (the floor: its raw libvirt equivalent)."""
    if impl.get("floor"):
        spec = {"mode": "rawquery", "uri": uri, "reps": 1, "keepalive": impl.get("keepalive", False)}
    else:
        spec = {
            "mode": "call",
            "module_dirs": impl["module_dirs"],
            "func": impl.get("func", "virt.full_info"),
            "warmup": impl.get("warmup", 0),  # virt.capacity warm: its cache written by a first call
            "reps": 1,
            "virt": {"connection": {"uri": uri}, "images": images_dir},
        }
    out = []
    for _ in range(reps):
        out.append(common.run_worker(impl["python"], spec, timeout=timeout))
    return out


def collect(rows, backend, size, impl_name, answers):
    ok = [a for a in answers if a.get("ok")]
    rows.append(
        {
            "backend": backend,
            "size": size,
            "impl": impl_name,
            "wall": common.summary([a["times"][0] for a in ok]),
            "cpu": common.summary([a["cpu"][0] for a in ok if a.get("cpu")]),
            "hwm_kib": common.summary([a["hwm_after_kib"] for a in ok]),
            "growth_kib": common.summary([a["hwm_after_kib"] - a["rss_before_kib"] for a in ok]),
            "vms": ok[0]["result"].get("vms") if ok else None,
            "errors": [a["error"] for a in answers if not a.get("ok")],
        }
    )


def run_backend(backend, cfg, impls, workdir, timeout, log):
    rows = []
    hv = fabric = None
    conn = None
    try:
        if backend == "real":
            import libvirt

            sys.path.insert(0, str(common.ROOT))  # the lab the way the tests import it
            from tests.support import lab

            fabric = lab.Fabric(lab.new_tag()).start()
            hv = lab.Hypervisor(os.path.join(workdir, "lab"), 1, fabric).start()
            conn = libvirt.open(hv.uri)
        defined = 0
        for size in cfg["sizes"]:
            if backend == "test":
                uri = nodexml.write_node(workdir, size)
            else:
                template = nodexml._disk_template(os.path.join(workdir, "disks"))
                for i in range(defined, size):
                    path = os.path.join(workdir, "disks", f"vm{i:05d}.qcow2")
                    if not os.path.exists(path):
                        os.link(template, path)
                    dom = nodexml.domain(i, path, dtype="qemu")
                    conn.defineXML(ET.tostring(dom, encoding="unicode"))
                defined = size
                uri = hv.uri
            # alternate the implementations so that a burst of load from elsewhere hits both
            answers = {name: [] for name in impls}
            rounds = max(reps_for(cfg, name, size) for name in impls)
            for r in range(rounds):
                for name, impl in impls.items():
                    if r < reps_for(cfg, name, size):
                        log(f"query {backend} N={size} {name} run {r + 1}")
                        answers[name] += measure(impl, uri, 1, os.path.join(workdir, "images"), timeout)
            for name in impls:
                collect(rows, backend, size, name, answers[name])
    finally:
        if conn is not None:
            conn.close()
        if hv:
            hv.stop()
        if fabric:
            fabric.stop()
    return rows


def render(rows):
    tables = []
    for backend in sorted({r["backend"] for r in rows}, reverse=True):
        sub = [r for r in rows if r["backend"] == backend]
        body = []
        for size in sorted({r["size"] for r in sub}):
            floor = next((r for r in sub if r["size"] == size and r["impl"] == FLOOR), None)
            f_w = floor["wall"]["median"] if floor and floor["wall"] else None
            ours = next((r for r in sub if r["size"] == size and r["impl"] == "salt-virt"), None)
            theirs = next((r for r in sub if r["size"] == size and r["impl"] == "saltext-virt"), None)
            o_w = ours["wall"]["median"] if ours and ours["wall"] else None
            t_w = theirs["wall"]["median"] if theirs and theirs["wall"] else None
            o_m = ours["hwm_kib"]["median"] if ours and ours["hwm_kib"] else None
            t_m = theirs["hwm_kib"]["median"] if theirs and theirs["hwm_kib"] else None
            o_c = ours["cpu"]["median"] if ours and ours.get("cpu") else None
            t_c = theirs["cpu"]["median"] if theirs and theirs.get("cpu") else None
            o_g = common.fmt_mib(ours["growth_kib"]["median"]) if ours and ours["growth_kib"] else "—"
            t_g = common.fmt_mib(theirs["growth_kib"]["median"]) if theirs and theirs["growth_kib"] else "—"
            body.append(
                [
                    size,
                    common.fmt_stat(floor and floor["wall"]),
                    common.fmt_stat(ours and ours["wall"]),
                    f"**{common.ratio(o_w, f_w)}**",
                    common.fmt_stat(theirs and theirs["wall"]),
                    f"**{common.ratio(t_w, o_w)}**",
                    f"{common.fmt_s(o_c)} / {common.fmt_s(t_c)} ({common.ratio(t_c, o_c)})",
                    f"{common.fmt_mib(o_m)} (+{o_g})",
                    f"{common.fmt_mib(t_m)} (+{t_g})",
                    f"{floor and floor['vms']} / {ours and ours['vms']} / {theirs and theirs['vms']}",
                ]
            )
        label = "libvirt test driver (node XML)" if backend == "test" else "real libvirtd, defined domains"
        tables.append(
            f"**{label}** — `virt.full_info`, one call per fresh process, median (min–max, n)\n\n"
            + common.table(
                [
                    "domains",
                    "raw libvirt floor (bulk APIs)",
                    "salt-virt",
                    "salt-virt / floor",
                    "saltext-virt 0.1.0",
                    "saltext / salt-virt",
                    "client CPU ours / theirs",
                    "peak RSS salt-virt (+growth)",
                    "peak RSS saltext (+growth)",
                    "VMs seen (floor / ours / saltext)",
                ],
                body,
            )
        )
        cap = []
        for size in sorted({r["size"] for r in sub}):
            by = {r["impl"]: r for r in sub if r["size"] == size}
            if CAP_COLD not in by:
                continue
            full = by.get("salt-virt") or {}
            f_w = full["wall"]["median"] if full.get("wall") else None
            cells = [size, common.fmt_stat(full.get("wall"))]
            for which in (CAP_COLD, CAP_WARM):
                row = by.get(which) or {}
                w = row["wall"]["median"] if row.get("wall") else None
                cells += [common.fmt_stat(row.get("wall")), f"**{common.ratio(w, f_w)}**"]
            cap.append(cells)
        if cap:
            tables.append(
                f"**{label}** — `virt.capacity` (what placement asks) vs `virt.full_info`, same runs\n\n"
                + common.table(
                    ["domains", "full_info", "capacity, cold cache", "/ full_info", "capacity, warm", "/ full_info"],
                    cap,
                )
            )
        ka = []
        for size in sorted({r["size"] for r in sub}):
            by = {r["impl"]: r for r in sub if r["size"] == size}
            if FLOOR_KA not in by:
                continue
            medians = [by.get(i, {}).get("wall") and by[i]["wall"]["median"] for i in (FLOOR, FLOOR_KA, "salt-virt")]
            ka.append(
                [size]
                + [common.fmt_stat(by.get(i, {}).get("wall")) for i in (FLOOR, FLOOR_KA, "salt-virt")]
                + [f"**{common.ratio(medians[2], medians[0])}**", f"**{common.ratio(medians[2], medians[1])}**"]
            )
        if ka:
            tables.append(
                f"**{label}** — the floor with libvirt's keepalive, as salt-virt connects (default event loop "
                "thread, 5 s x 5), same runs\n\n"
                + common.table(
                    ["domains", "floor", "floor + keepalive", "salt-virt", "/ floor", "/ floor + keepalive"], ka
                )
            )
        # linearity: time per domain
        per = []
        for impl in (FLOOR, "salt-virt", "saltext-virt"):
            pts = [(r["size"], r["wall"]["median"]) for r in sub if r["impl"] == impl and r["wall"]]
            if pts:
                per.append([impl] + [f"N={n}: {common.fmt_s(t / n)}" for n, t in pts])
        if per:
            width = max(len(p) for p in per)
            tables.append(
                "Time per domain (flat = linear):\n\n"
                + common.table(["impl"] + [""] * (width - 1), [p + [""] * (width - len(p)) for p in per])
            )
    errors = [f"{r['impl']} {r['backend']} N={r['size']}: {e[-400:]}" for r in rows for e in r["errors"]]
    return tables, errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run each (smoke test)")
    ap.add_argument("--backend", choices=["test", "real", "both"], default="both")
    ap.add_argument("--sizes", help="comma-separated domain counts (default 100,300,1000)")
    ap.add_argument("--no-saltext", action="store_true", help="salt-virt and the floor only")
    ap.add_argument("--timeout", type=int, default=3600, help="per-process timeout (s)")
    ap.add_argument(
        "--capacity", action="store_true", help="also virt.capacity (placement's question), cold and warm cache"
    )
    ap.add_argument(
        "--keepalive-floor",
        action="store_true",
        help="also the floor with libvirt's keepalive on (salt-virt's connections have it: what it costs)",
    )
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg["reps"] = dict(cfg["reps"], **{FLOOR: cfg["reps"]["salt-virt"]})
    if args.sizes:
        cfg["sizes"] = [int(s) for s in args.sizes.split(",")]
    backends = ["test", "real"] if args.backend == "both" else [args.backend]
    impls = dict(common.impls())
    if args.no_saltext:
        del impls["saltext-virt"]
    impls = {FLOOR: {"python": impls["salt-virt"]["python"], "floor": True}, **impls}
    if args.keepalive_floor:
        impls = {FLOOR_KA: dict(impls[FLOOR], keepalive=True), **impls}
        cfg["reps"][FLOOR_KA] = cfg["reps"]["salt-virt"]
    if args.capacity:
        ours = impls["salt-virt"]
        for label, warmup in ((CAP_COLD, 0), (CAP_WARM, 1)):
            impls[label] = dict(ours, func="virt.capacity", warmup=warmup)
            cfg["reps"][label] = cfg["reps"]["salt-virt"]
    workdir = tempfile.mkdtemp(prefix="svbench-q", dir="/var/tmp")
    os.chmod(workdir, 0o755)
    load0 = common.loadavg()
    rows = []
    try:
        for backend in backends:
            rows += run_backend(
                backend,
                cfg,
                impls,
                os.path.join(workdir, backend),
                args.timeout,
                lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True),
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    tables, errors = render(rows)
    result = {
        "title": "3. query at scale (one hypervisor)",
        "rows": rows,
        "tables": tables,
        "notes": [f"load average before/after: {load0} / {common.loadavg()}"] + [f"ERROR {e}" for e in errors],
    }
    common.emit("query", result)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
