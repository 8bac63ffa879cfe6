"""The package as pip sees it: setup.py's metadata (read by setuptools, nothing built), and the master's code
importing where libvirt-python is not installed. Building the sdist and the wheel, installing them into fresh
venvs and running salt daemons from them: tests/integration/test_wheel.py."""

import ast
import json
import subprocess
import sys
import textwrap

import saltvirt
from saltvirt.base import install
from tests.support.paths import ROOT

# setup.py's arguments as setuptools parsed them (distutils' stop_after="init": no command runs, nothing is
# written), in a fresh interpreter: setuptools must install its distutils before distutils.core is imported
METADATA = """
import json, sys
import setuptools  # noqa: F401
from distutils.core import run_setup
d = run_setup(sys.argv[1], stop_after="init")
print(json.dumps({"name": d.get_name(), "version": d.get_version(), "requires": d.install_requires,
                  "extras": d.extras_require}))
"""

# libvirt-python not installed (a master): its modules cannot be imported. Then the master's library layers and
# loader modules are imported and asked __virtual__, and the minion's virt module says why it does not load.
NO_LIBVIRT = """
import importlib, importlib.util, json, pathlib, pkgutil, sys

class NoLibvirt:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("libvirt", "libvirtmod", "libvirt_qemu", "libvirt_lxc", "libvirtaio"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoLibvirt())
root = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(root / "_utils"))
out = {"library": [], "virtual": {}}
for layer in ("base", "pki", "model", "fleet"):
    for mod in pkgutil.iter_modules(importlib.import_module(f"saltvirt.{layer}").__path__):
        if mod.name != "__main__":  # python3 -m saltvirt.pki: runs its CLI
            importlib.import_module(f"saltvirt.{layer}.{mod.name}")
            out["library"].append(f"{layer}/{mod.name}")
for path in [*sorted(root.glob("_runners/*.py")), *root.glob("_pillar/*.py"), *root.glob("_output/*.py"),
             root / "_modules" / "virt.py"]:
    name = f"{path.parent.name}/{path.name}"
    spec = importlib.util.spec_from_file_location(name.replace("/", "_").removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out["virtual"][name] = module.__virtual__() if hasattr(module, "__virtual__") else module.__name__
out["libvirt"] = sorted(m for m in sys.modules if m.startswith("libvirt"))
print(json.dumps(out))
"""


def run(probe, arg):
    """``probe``'s last line of output (JSON), run by this venv's Python in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", probe, str(arg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]  # the probe's traceback
    return json.loads(out.stdout.splitlines()[-1])


def test_setup_takes_the_version_from_the_library():
    """_utils/saltvirt/__init__.py's __version__ is the one place the version is written."""
    assert run(METADATA, ROOT / "setup.py")["version"] == saltvirt.__version__
    assert "version=version()" in (ROOT / "setup.py").read_text()


def test_the_master_install_pulls_no_libvirt_python_and_the_hypervisor_extra_does():
    meta = run(METADATA, ROOT / "setup.py")
    assert not [r for r in meta["requires"] if r.lower().startswith("libvirt")], meta["requires"]
    assert meta["extras"] == {"hypervisor": ["libvirt-python"]}
    # what the messages tell users to install is what setup.py declares
    assert (meta["name"], f"{meta['name']}[hypervisor]") == (install.MASTER, install.HYPERVISOR)


def test_the_sdist_carries_every_example_the_wheel_ships():
    tree = ast.parse((ROOT / "setup.py").read_text())
    examples = next(
        ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "EXAMPLES"
    )
    # the SLS files at the top and the salt-virt formula (its folder, whole)
    formula = [p.relative_to(ROOT).as_posix() for p in (ROOT / "salt-virt").rglob("*") if p.is_file()]
    assert sorted(examples) == sorted([p.name for p in ROOT.glob("*.sls")] + formula)
    assert {"salt-virt/init.sls", "salt-virt/map.jinja", "salt-virt/pillar.example"} <= set(formula)
    manifest = (ROOT / "MANIFEST.in").read_text().split()
    assert [e for e in examples if e not in manifest] == []


def test_the_wheel_and_sdist_carry_the_whole_console():
    """Every file of console/ is in setup.py's CONSOLE or under one of its CONSOLE_TREES (copied into
    saltvirt/data/console/) and in MANIFEST.in (a file by name, a tree by graft)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    names = {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and n.targets[0].id in ("CONSOLE", "CONSOLE_TREES")
    }
    console, trees = names["CONSOLE"], names["CONSOLE_TREES"]
    files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "console").rglob("*") if p.is_file()]
    loose = [f for f in files if not any(f.startswith(t + "/") for t in trees)]
    assert sorted(console) == sorted(loose) and "console/index.html" in files
    assert "console/vendor/novnc/core/rfb.js" in files and "console/vendor/novnc/LICENSE.MPL-2.0" in files
    manifest = (ROOT / "MANIFEST.in").read_text().split()
    assert [f for f in console if f not in manifest] == []
    assert [t for t in trees if f"graft {t}" not in " ".join(manifest)] == []


def test_the_master_side_imports_without_libvirt():
    out = run(textwrap.dedent(NO_LIBVIRT), ROOT)
    assert {"base/install", "pki/ca", "model/vmspec", "fleet/publish", "fleet/vmcreate"} <= set(out["library"])
    minion = out["virtual"].pop("_modules/virt.py")
    assert minion == [False, f"virt: the libvirt python bindings are not installed: {install.HYPERVISOR_HINT}"]
    expected = {"_pillar/libvirt.py": "libvirt", "_output/virt_query.py": "virt_query"}
    assert out["virtual"] == {name: expected.get(name, "virt") for name in out["virtual"]}
    assert len([n for n in out["virtual"] if n.startswith("_runners/")]) == len(list(ROOT.glob("_runners/*.py")))
    assert out["libvirt"] == []


DOCSTRINGS_STRIPPED = """
import importlib.util, pathlib, sys

root = pathlib.Path(sys.argv[1])
assert sys.flags.optimize == 2 and importlib.util.__doc__ is None, "not run with -OO"
for path in sorted(root.glob("_*/*.py")):
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    print(path.relative_to(root))
"""


def test_every_loader_module_imports_with_docstrings_stripped():
    """Under ``python -OO`` (PYTHONOPTIMIZE=2) every ``__doc__`` is None: a module that appends to a function's
    docstring at import must not fail there (_modules/virt_storage.py's pool_define did: TypeError)."""
    proc = subprocess.run(
        [sys.executable, "-B", "-OO", "-c", DOCSTRINGS_STRIPPED, str(ROOT)],  # -B: no .opt-2.pyc in the tree
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    imported = proc.stdout.split()
    assert "_modules/virt_storage.py" in imported and len(imported) == len(list(ROOT.glob("_*/*.py")))
