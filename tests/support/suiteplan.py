"""What ./run-tests runs and how wide (not a test module: ``python -m tests.support.suiteplan ...``).

``workers unit|integration``: pytest-xdist workers for a stage, sized to this machine now (cores, memory
available, the cores others keep busy when ./run-tests starts: ``RUN_TESTS_LOAD``) instead of a fixed number:
integration workers mostly wait on guests, daemons and timeouts, so a quiet 2-core machine takes 6, a busy one
fewer (never under 2); every worker keeps ~3 GiB (its master, minions, libvirtds and guests).
``RUN_TESTS_WORKERS`` overrides both.

``changed [BASE]``: the test files a change touches (``./run-tests --changed``): the files changed since
BASE (default: the merge base with origin/main, else HEAD) and the untracked ones, mapped to tests:
a test file runs itself; a library module ``_utils/saltvirt/<layer>/<mod>.py`` runs
``tests/unit/<layer>/test_<mod>*.py`` and every test file that imports it; a loader file runs its loader
tests and the integration modules that call its functions' module; docs run the docs build; tests/support
and conftest changes run every test file that imports them. Prints one path a line (nothing: nothing to run).
"""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = 1024**3


def _mem_available():
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * GIB


def workers(stage, cores=None, load=None, mem=None):
    """xdist workers for ``stage`` on a machine with ``cores``, 1-minute ``load`` and ``mem`` bytes available."""
    cores = cores or os.cpu_count() or 2
    if load is None:  # ./run-tests measures it once (busy cores), before its own stages load the machine
        load = float(os.environ.get("RUN_TESTS_LOAD") or os.getloadavg()[0])
    mem = _mem_available() if mem is None else mem
    idle = max(0.0, cores - load)  # cores nobody else uses now
    if stage == "unit":  # many wait on short timers: 5 workers took 61 s on a quiet 2-core machine, 3 took 85-93
        return max(2, min(2 * cores + 1, round(2.5 * idle)))
    # 6 on a quiet 2-core machine (less than a quarter core busy): with 5 the run was bound by its workers, all of
    # them waiting on guests and timeouts while the machine was 79-87% busy (runs V, X: 824 and 787 s); 6 kept it
    # 94% busy (run U: 791 s where 5 took 824). Run B (5 workers, beside helpers' test runs at load 13-15) was green
    by_cpu = round(2.5 * idle) if idle < cores - 0.25 else 3 * cores
    return max(2, min(by_cpu, int(mem // (3 * GIB)), 6))


def _git(*args):
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.split("\n") if out.returncode == 0 else []


def changed_files(base=None):
    if base is None:
        base = next(iter(_git("merge-base", "HEAD", "origin/main")), "") or "HEAD"
    names = _git("diff", "--name-only", base) + _git("ls-files", "--others", "--exclude-standard")
    return sorted({n for n in names if n})


def _test_files():
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))


def _importers(module, tests):
    """Test files that import dotted ``module`` (``saltvirt.fleet.publish``, ``tests.support.lab``)."""
    package, _, name = module.rpartition(".")
    pattern = re.compile(
        rf"(\bimport {re.escape(module)}\b|\bfrom {re.escape(module)} import\b"
        rf"|\bfrom {re.escape(package)} import [^\n]*\b{re.escape(name)}\b)"
    )
    return [t for t in tests if pattern.search((ROOT / t).read_text())]


def selection(files):
    tests = _test_files()
    picked = set()
    for name in files:
        path = pathlib.PurePosixPath(name)
        if name.startswith("tests/") and path.name.startswith("test_") and name.endswith(".py"):
            picked.add(name)
        elif name.startswith("_utils/saltvirt/") and name.endswith(".py") and path.stem != "__init__":
            layer, mod = "/".join(path.parts[2:-1]), path.stem  # a layer, or a package in one (xml/domain)
            picked.update(t for t in tests if t.startswith(f"tests/unit/{layer}/test_{mod}"))
            picked.update(_importers(f"saltvirt.{layer.replace('/', '.')}.{mod}", tests))
        elif re.match(r"^_(modules|states|runners|engines|pillar|grains|output)/", name):
            kind, stem = path.parts[0].strip("_"), path.stem
            loader = "virt" if stem.startswith("virt") else stem
            picked.update(t for t in tests if t.startswith(f"tests/unit/loaders/test_{kind}_{loader}"))
            picked.update(
                t for t in tests if t.startswith("tests/integration/") and f"{loader}." in (ROOT / t).read_text()
            )
        elif name.startswith("tests/support/") or name == "tests/conftest.py":
            picked.update(_importers(f"tests.support.{path.stem}", tests) if path.stem != "conftest" else tests)
        elif name in ("setup.py", "MANIFEST.in", "pyproject.toml"):
            picked.add("tests/unit/test_packaging.py")
        elif name.startswith("docs/") or name in ("README.md", "HACKING.md"):
            picked.add("tests/unit/test_docs.py")
            picked.add("tests/unit/test_suite_layout.py")
    return sorted(p for p in picked if (ROOT / p).is_file())


def main(argv):
    if argv[:1] == ["workers"]:
        override = os.environ.get("RUN_TESTS_WORKERS")
        print(override or workers(argv[1]))
    elif argv[:1] == ["changed"]:
        print("\n".join(selection(changed_files(argv[1] if len(argv) > 1 else None))))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
