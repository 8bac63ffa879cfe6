"""Shared helpers of the benchmarks: venvs, child-process runs, statistics, machine facts, tables.

Stdlib only: bench/worker.py imports it inside the competitor's venv too.
"""

import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
CACHE = pathlib.Path(os.environ.get("SALT_VIRT_CACHE", "/var/cache/salt-virt"))
OUR_VENV = pathlib.Path(os.environ.get("SALT_VIRT_VENV", CACHE / "venv"))
SALTEXT_VENV = pathlib.Path(os.environ.get("SALT_VIRT_BENCH_SALTEXT_VENV", CACHE / "bench-saltext-venv"))
GUEST = pathlib.Path(os.environ.get("SALT_VIRT_GUEST", CACHE / "guest"))
WORKER = BENCH / "worker.py"


def py(venv):
    return str(pathlib.Path(venv) / "bin" / "python")


def saltext_module_dir(kind="modules"):
    """Where saltext-virt installed its loader modules (``saltext/virt/<kind>``) in its own venv."""
    out = subprocess.run(
        [py(SALTEXT_VENV), "-c", "import saltext.virt, os; print(os.path.dirname(saltext.virt.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return os.path.join(out.stdout.strip(), kind)


def impls():
    """The two implementations: python interpreter + module_dirs for the Salt loader."""
    return {
        "salt-virt": {"python": py(OUR_VENV), "module_dirs": [str(ROOT / "_modules")]},
        "saltext-virt": {"python": py(SALTEXT_VENV), "module_dirs": [saltext_module_dir()]},
    }


def run_worker(python, spec, timeout=1800):
    """Run bench/worker.py in a fresh process of ``python`` with ``spec`` (JSON); return its JSON answer.

    Adds ``child_maxrss_kib`` (getrusage(RUSAGE_CHILDREN) delta: the peak RSS of that child)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(
        [python, str(WORKER)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,  # a failed worker is reported below
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        noise = ("DeprecationWarning", "import crypt")
        err = "\n".join(ln for ln in (proc.stderr or proc.stdout).splitlines() if not any(n in ln for n in noise))
        return {"ok": False, "error": err.strip()[-3000:], "process_s": wall}
    answer = json.loads(lines[-1])
    answer["process_s"] = wall
    # ru_maxrss of children is the max over all children so far: only meaningful when it grew.
    answer["child_maxrss_kib"] = after if after > before else None
    return answer


def stop_groups(procs, wait):
    """Stop daemons started in process groups of their own: SIGTERM to each group (the last started first), then
    SIGKILL to a group whose leader is not gone within ``wait`` seconds."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def summary(values):
    """{'median', 'min', 'max', 'n'} of a list of numbers (None when empty)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt_s(value):
    if value is None:
        return "—"
    if value < 1e-6:
        return f"{value * 1e9:.0f} ns"
    if value < 0.001:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def fmt_stat(st):
    """'12.3 ms (11.9–13.0, n=7)': median, spread, count."""
    if not st:
        return "—"
    return f"{fmt_s(st['median'])} ({fmt_s(st['min'])}–{fmt_s(st['max'])}, n={st['n']})"


def fmt_mib(kib):
    return "—" if kib is None else f"{kib / 1024:.0f} MiB"


def ratio(a, b):
    if not a or not b:
        return "—"
    return f"{a / b:.2f}x"


def table(headers, rows):
    """A GitHub markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def loadavg():
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def machine_facts():
    """What RESULTS.md must say about the machine a run was made on."""
    model = ""
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as fh:
        mem_kib = int(fh.readline().split()[1])

    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.splitlines()[0].strip()
        except (OSError, IndexError):
            return "?"

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem_kib / 1048576, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "libvirtd": version(["libvirtd", "--version"]),
        "qemu": version(["qemu-system-x86_64", "--version"]),
        "loadavg_start": loadavg(),
    }


def emit(name, result):
    """A bench script's result: JSON to ``$BENCH_JSON_DIR/<name>.json`` (for bench/run) + markdown on stdout."""
    out_dir = os.environ.get("BENCH_JSON_DIR")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)  # a run's results are never lost to a missing directory
        with open(os.path.join(out_dir, f"{name}.json"), "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    print(f"\n### {result.get('title', name)}\n")
    for note in result.get("notes", []):
        print(f"- {note}")
    for tbl in result.get("tables", []):
        print()
        print(tbl)
    sys.stdout.flush()
