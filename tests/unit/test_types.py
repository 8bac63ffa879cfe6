"""The library type-checks (mypy, configured in pyproject.toml). That every public function of the typed layers is
annotated is checked statically in test_suite_layout.py (run at every merge)."""

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
