"""The library and the loader modules type-check (mypy, configured in pyproject.toml). That every public function
of the typed layers is annotated is checked statically in test_suite_layout.py (run at every merge)."""

import re
import subprocess
import sys

from tests.support.paths import ROOT


def test_library_type_checks(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"mypy (pyproject.toml [tool.mypy]) found errors:\n{proc.stdout}{proc.stderr}"


def test_every_loader_folder_is_type_checked():
    """A new loader folder (``_<kind>/`` beside ``_modules``) joins mypy's files, or its dunders go unchecked."""
    files = re.findall(r'"([^"]+)"', re.search(r"^files = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)[1])
    folders = {p.parent.name for p in ROOT.glob("_*/*.py")}
    assert folders and folders <= set(files), f"add to [tool.mypy] files in pyproject.toml: {folders - set(files)}"
