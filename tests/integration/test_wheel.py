"""The package as users install it (issue #36): an sdist and a wheel built from a clean copy of the checkout
(``python -m build``: the wheel is built from the sdist) pass ``twine check --strict``; the wheel goes into two
fresh venvs with Salt installed as scripts/salt-venv.sh installs it, ``salt-virt`` for the master and
``salt-virt[hypervisor]`` for a hypervisor minion; a salt-master and a salt-minion started from those venvs run
one ``salt-run virt.init`` (and ``virt.purge``) on a lab hypervisor. No file_roots copy of the repository and no
``saltutil.sync_all``: Salt's loader finds ``virt`` in the installed wheel only (the ``salt.loader`` entry point,
setup.py); Salt 3008 has no ``virt`` of its own.

The wheel goes in with ``--no-deps``, then its own requirements for the extra (read from the installed
metadata by the venv itself) without Salt: a plain ``pip install salt-virt.whl`` re-resolves the venv's Salt,
and PyPI has no certifi as new as Salt 3008.5's floor (see salt-venv.sh), so pip backtracks and replaces
Salt 3008.5 with 3008.4. The two steps are salt-venv.sh's own way around that floor; the test checks that the
venvs still hold the suite's Salt.

Cost, once per module, measured on this 2-core machine beside another suite run (load 5-8, 2026-11-29): the
module took 107-183 s (11 runs). The two venvs build side by side while the sdist and wheel build: with pip's cache
and the package mirror as scripts/setup.sh left them (warm) salt-venv.sh takes ~30-40 s a venv, the wheel's
install a few seconds more; cold (no pip cache, everything from PyPI, as on a fresh CI machine) salt-venv.sh
took 2 min 28 s for one venv and libvirt-python's build from its sdist 24 s more. Then ~20 s to start the
daemons, ~10 s for the runner calls, and the teardown (stopping the daemons, deleting ~470 MB of venvs: 10 s on
a quiet disk, 40 s and more beside another suite). No guest boots (``start=False``). pip byte-compiles nothing
here (NO_COMPILE): the daemons and CLIs write the .pyc of what they import; measured alone (2026-11-30, load 7-12):
52 CPU-s with pip's byte-compilation, 40 without.
"""

import ast
import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

import pytest
import salt.version

from tests.support import lab
from tests.support.paths import ROOT
from tests.support.saltd import hypervisor_minion_config

# salt daemons started by hand (from the fresh venvs, not through salt-factories): the marker tests/conftest.py
# derives from fixtures cannot see them. The first venv build on a fresh machine downloads from PyPI.
pytestmark = [pytest.mark.salt, pytest.mark.timeout(1800)]

MINION_ID = "hyperwheel"
VENV_BOUND = 1200  # seconds for one venv: cold, from PyPI, on a loaded 2-core machine (measured 148)
BUILD_BOUND = 600  # python -m build: its isolated build env fetches setuptools
PIP_BOUND = 900  # the wheel and its requirements (libvirt-python: from the wheel pip built and cached)
DAEMON_BOUND = 300  # a daemon's start on a loaded 2-core machine, far above what it needs
RUN_BOUND = 600  # one salt-run call (virt.init fetches the image from the master, seeds the disk)
# pip's --no-compile for every pip salt-venv.sh runs (the script is not changed: scripts/setup.sh hashes it into
# the Debian image's stamp). pip reads PIP_NO_COMPILE as the value of its "compile" flag: false means
# --no-compile, a double negative (pip issue 5735). Byte-compiling the ~1,500 files of Salt and the rest of the
# two venvs is most of pip's CPU; the daemons and CLIs here import a fraction of them and write their .pyc
# as they go (the venvs are ours, writable).
NO_COMPILE = {"PIP_NO_COMPILE": "0"}

# the wheel's own requirements for the extras named in argv (none: the master), Salt left out: the venv's Salt
# must satisfy salt-virt's floor as it is (checked here); printed one a line, markers evaluated, for pip -r
REQUIRES = """
import sys
from importlib.metadata import requires, version
from packaging.requirements import Requirement
for line in requires("salt-virt"):
    req = Requirement(line)
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ["", *sys.argv[1:]]):
        continue
    if req.name.lower() == "salt":
        assert req.specifier.contains(version("salt")), (str(req), version("salt"))
        continue
    req.marker = None
    print(req)
"""


def clean_env(venv=None):
    """This environment without the test venv's traces (PYTHONPATH, VIRTUAL_ENV, its bin on PATH): what runs
    from a fresh venv sees that venv only."""
    # PYTHONDONTWRITEBYTECODE too: pip installs without byte-compiling (NO_COMPILE), so the venvs' first daemons
    # and CLIs write the .pyc of what they import and the later ones read them (with it, every process would
    # compile every module it imports again)
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    ours = os.path.dirname(sys.executable)
    path = [p for p in env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").split(os.pathsep) if p != ours]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path] if venv else path)
    return env


def run(cmd, what, timeout, env=None, **kw):
    """``cmd`` run to its end (bounded); fails the test with its output when it fails."""
    try:
        out = subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or clean_env(),
            check=False,  # judged below, with its output
            **kw,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{what}: no end within {timeout} s; output so far:\n{exc.stdout}\n{exc.stderr}") from exc
    assert out.returncode == 0, f"{what}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def clean_copy(dest):
    """The checkout as a fresh clone plus the uncommitted changes would have it: what git tracks and what it
    does not ignore (no build/, *.egg-info, caches); a tree that is no git checkout is copied without those."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=False,  # no git, or no checkout: the fallback below
    )
    if listed.returncode:
        junk = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
        shutil.copytree(ROOT, dest, symlinks=True, ignore=junk)
        return
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file() or src.is_symlink():  # a tracked file deleted in the work tree is left out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name, follow_symlinks=False)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def work():
    """This module's directory: venvs, the build, the daemons' roots, the minion's images (0755: QEMU, user
    libvirt-qemu, reaches the VM's disk below it). Short: the daemons' unix socket paths must stay < 107 bytes."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="svwheel-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def salt_venvs(work):
    """Two fresh venvs with Salt, built by scripts/salt-venv.sh side by side (the builds start here, the
    ``venvs`` fixture waits for them): {"master": path, "minion": path}."""
    procs = {}
    for role in ("master", "minion"):
        log = open(work / f"venv-{role}.log", "w")  # noqa: SIM115 - closed below, after the build ended
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "salt-venv.sh"), str(work / f"venv-{role}")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(clean_env(), **NO_COMPILE),
            start_new_session=True,
        )
        procs[role] = (proc, log, time.monotonic())
    yield procs
    for proc, log, _ in procs.values():
        if proc.poll() is None:  # a failed test before the wait: the build is this module's own process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def dists(salt_venvs, work):
    """sdist and wheel built by ``python -m build`` (isolated; the wheel from the sdist) from a clean copy."""
    src, out = work / "src", work / "dist"
    clean_copy(src)
    run([sys.executable, "-m", "build", "--outdir", out, src], "python -m build", BUILD_BOUND)
    found = {p.suffix: p for p in out.iterdir()}
    assert sorted(found) == [".gz", ".whl"], sorted(out.iterdir())
    return {"sdist": found[".gz"], "wheel": found[".whl"]}


@pytest.fixture(scope="module")
def venvs(salt_venvs, dists, work):
    """The venvs, Salt in, then ``salt-virt`` (master) and ``salt-virt[hypervisor]`` (minion) from the wheel;
    libvirt-python constrained to the suite's pin (requirements-test.txt), the one pip built and cached."""
    paths = {}
    for role, (proc, log, started) in salt_venvs.items():
        left = VENV_BOUND - (time.monotonic() - started)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(left, 1))
        log.flush()
        text = (work / f"venv-{role}.log").read_text()
        state = "still running" if proc.returncode is None else f"exit {proc.returncode}"
        assert proc.returncode == 0, f"salt-venv.sh {role}: {state} after {VENV_BOUND} s at most; its output:\n{text}"
        paths[role] = work / f"venv-{role}"
    pins = [r for r in (ROOT / "requirements-test.txt").read_text().split() if r.startswith("libvirt-python==")]
    assert len(pins) == 1, "requirements-test.txt pins no libvirt-python==X (the suite's bindings)"
    (work / "constraints.txt").write_text(pins[0] + "\n")
    for role, extras in (("master", []), ("minion", ["hypervisor"])):
        venv = paths[role]
        pip = [venv / "bin" / "pip", "install", "--disable-pip-version-check", "--no-compile"]
        run([*pip, "--no-deps", dists["wheel"]], f"pip install --no-deps {dists['wheel'].name} ({role})", PIP_BOUND)
        reqs = run([venv / "bin" / "python", "-c", REQUIRES, *extras], f"salt-virt's requirements ({role})", 120)
        (work / f"reqs-{role}.txt").write_text(reqs)
        extra = f"[{','.join(extras)}]" if extras else ""
        run([*pip, "-c", work / "constraints.txt", "-r", work / f"reqs-{role}.txt"], f"salt-virt{extra}'s", PIP_BOUND)
    return paths


def probe(venv, code):
    out = run([venv / "bin" / "python", "-c", code], f"probe in {venv.name}", 120, cwd="/")
    return json.loads(out.strip().splitlines()[-1])


INSTALLED = """
import importlib.metadata as md, importlib.util, json, saltvirt
print(json.dumps({"salt": md.version("salt"), "salt-virt": md.version("salt-virt"), "saltvirt": saltvirt.__file__,
                  "libvirt": bool(importlib.util.find_spec("libvirt")),
                  "entry_points": [e.value for e in md.entry_points(group="salt.loader")]}))
"""


class Stack:
    """A salt-master run by the master venv and a salt-minion by the minion venv, each with a config dir and
    root of its own under ``base`` (two machines' worth); the daemons are this module's own processes, stopped
    by their process groups."""

    def __init__(self, base, venvs, minion_extra, file_root):
        self.base, self.venvs = base, venvs
        self.procs = []
        self.conf = {"master": base / "master-etc", "minion": base / "minion-etc"}
        publish, self.ret_port = free_port(), free_port()
        common = {"user": "root", "log_level_logfile": "info"}
        master = dict(
            common,
            root_dir=str(base / "master"),
            interface="127.0.0.1",
            publish_port=publish,
            ret_port=self.ret_port,
            auto_accept=True,
            worker_threads=3,  # one minion: Salt's 5 request workers are processes to start and keep
            file_roots={"base": [str(file_root)]},  # the test guest's images only: no repository, no _modules
            on_demand_ext_pillar=[],
            virt={"hypervisors": [MINION_ID]},
        )
        minion = dict(
            common,
            id=MINION_ID,
            root_dir=str(base / "minion"),
            master="127.0.0.1",
            master_port=self.ret_port,
            publish_port=publish,
            acceptance_wait_time=1,
            **minion_extra,  # virt: (the lab hypervisor, virt:images), grains
        )
        for role, config in (("master", master), ("minion", minion)):
            self.conf[role].mkdir()
            (self.conf[role] / role).write_text(json.dumps(config, indent=1))

    def log(self, role):
        path = self.base / role / "var" / "log" / "salt" / role
        return path.read_text(errors="replace")[-4000:] if path.exists() else f"(no {path})"

    def cli(self, tool, *args, timeout=RUN_BOUND):
        """A CLI of the master venv against this master: the CompletedProcess, judged by the caller."""
        cmd = [str(self.venvs["master"] / "bin" / tool), "-c", str(self.conf["master"]), *map(str, args)]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(self.venvs["master"]), check=False
        )

    def spawn(self, role):
        venv = self.venvs[role]
        proc = subprocess.Popen(
            [str(venv / "bin" / f"salt-{role}"), "-c", str(self.conf[role]), "-l", "quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=clean_env(venv),
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def wait(self, what, seen, bound=DAEMON_BOUND):
        """Until ``seen()`` returns (True, _), at most ``bound`` s; else fail with what it saw last and the logs."""
        deadline = time.monotonic() + bound
        while True:
            done, saw = seen()
            if done:
                return
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not within {bound} s (exited: {dead}); last seen: {saw}\n"
                    f"master log:\n{self.log('master')}\nminion log:\n{self.log('minion')}"
                )
            time.sleep(0.5)

    def start(self):
        self.spawn("master")

        def listening():
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.ret_port)) == 0, f"127.0.0.1:{self.ret_port} refused"

        self.wait("the salt-master's ret port", listening)
        self.spawn("minion")
        accepted = self.base / "master" / "etc" / "salt" / "pki" / "master" / "minions" / MINION_ID
        self.wait(f"{MINION_ID}'s key accepted", lambda: (accepted.exists(), f"no {accepted}"))

        def pinged():
            out = self.cli("salt", MINION_ID, "test.ping", "--out=json", "--static", "-t", "10", timeout=120)
            try:
                return json.loads(out.stdout).get(MINION_ID) is True, out.stdout[-500:]
            except ValueError:
                return False, f"exit {out.returncode}: {out.stdout[-300:]} {out.stderr[-300:]}"

        self.wait(f"{MINION_ID} answering test.ping", pinged)
        return self

    def stop(self):
        """The minion first, then the master (a minion whose master is gone takes seconds more to stop)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def stack(venvs, work, hv1, state_tree):
    minion = hypervisor_minion_config(hv1, work / "images")
    stack = Stack(work, venvs, minion, state_tree)
    try:
        yield stack.start()
    finally:
        stack.stop()


@pytest.fixture
def vm_name(hv1):
    """A VM name of this test; its domain is undefined afterwards if the test left it on hv1."""
    import libvirt

    name = f"wheel{lab.new_tag()}"
    yield name
    conn = libvirt.open(hv1.uri)
    with contextlib.suppress(libvirt.libvirtError):
        conn.lookupByName(name).undefine()
    conn.close()


def test_sdist_and_wheel_pass_twine_check(dists):
    run([sys.executable, "-m", "twine", "check", "--strict", dists["sdist"], dists["wheel"]], "twine check", 120)
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        entry_points = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert {"saltvirt/loader.py", "saltvirt/ext/runners/virt.py", "saltvirt/ext/modules/virt.py"} <= names
    assert "[salt.loader]\nsalt-virt = saltvirt.loader:get_dirs" in entry_points
    # setup.py's EXAMPLES (the example SLS files, the formula) and CONSOLE (the web console): in the sdist, and
    # as package data in the wheel
    tree = ast.parse((ROOT / "setup.py").read_text())
    examples = [
        e
        for n in tree.body
        if isinstance(n, ast.Assign) and n.targets[0].id in ("EXAMPLES", "CONSOLE")
        for e in ast.literal_eval(n.value)
    ]
    assert "console/index.html" in examples
    assert [e for e in examples if f"saltvirt/data/{e}" not in names] == []
    with tarfile.open(dists["sdist"]) as sdist:
        top = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "NOTICE"} <= top
    assert [e for e in examples if e not in top] == []


def test_the_master_venv_has_no_libvirt_and_the_hypervisor_venv_has_it(venvs, work):
    master, minion = probe(venvs["master"], INSTALLED), probe(venvs["minion"], INSTALLED)
    for venv, found in ((venvs["master"], master), (venvs["minion"], minion)):
        assert found["salt"] == salt.version.__version__, found  # the two-step install kept the suite's Salt
        assert found["saltvirt"].startswith(str(venv / "lib")), found  # the wheel's, not this checkout's
        assert found["entry_points"] == ["saltvirt.loader:get_dirs"], found
    assert master["libvirt"] is False and minion["libvirt"] is True, (master, minion)
    assert "libvirt-python" not in (work / "reqs-master.txt").read_text()
    assert "libvirt-python" in (work / "reqs-minion.txt").read_text()


def test_salt_run_virt_init_and_purge_through_the_installed_wheel(stack, hv1, vm_name, work):
    import libvirt

    init = stack.cli("salt-run", "--out=json", "virt.init", vm_name, 1, 128, "salt://images/guest.qcow2", "start=False")
    assert init.returncode == 0, f"{init.stdout[-3000:]}\n{init.stderr[-3000:]}\nminion log:\n{stack.log('minion')}"
    res = json.loads(init.stdout)
    assert res["host"] == MINION_ID and res["init"]["started"] is False, res
    assert res["key"]["minion_id"] == vm_name and res["key"]["state"] == "accepted", res
    disk = res["init"]["disks"][0]["path"]
    assert disk.startswith(str(work / "images")) and os.path.exists(disk), res
    conn = libvirt.open(hv1.uri)
    try:
        dom = conn.lookupByName(vm_name)
        assert dom.isActive() == 0 and dom.isPersistent() == 1
        purge = stack.cli("salt-run", "--out=json", "virt.purge", vm_name)
        assert purge.returncode == 0, f"{purge.stdout[-3000:]}\n{purge.stderr[-3000:]}"
        assert json.loads(purge.stdout)["key_deleted"] == "accepted", purge.stdout
        assert vm_name not in [d.name() for d in conn.listAllDomains(0)]
    finally:
        conn.close()
    assert not os.path.exists(disk)
    # the loader modules came from the wheel: nothing was synced into either daemon's extension_modules
    assert [str(p) for role in ("master", "minion") for p in (work / role).rglob("virt*.py")] == []
