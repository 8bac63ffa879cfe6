"""The package as pip sees it: setup.py's metadata (read by setuptools, nothing built)."""

import json
import subprocess
import sys

import saltvirt
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
