"""saltvirt.base.salttypes: the dunder aliases catch a wrong argument when the library is type-checked."""

import subprocess
import sys

from tests.support.paths import ROOT


def mypy(tmp_path, source):
    (tmp_path / "use.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental"]
        + ["--cache-dir", str(tmp_path / "c"), str(tmp_path / "use.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_aliases_accept_salts_shapes_and_refuse_others(tmp_path):
    ok = (
        "from saltvirt.base.salttypes import ConfigGet, SaltFunctions, SaltOpts\n"
        "def images(opts: SaltOpts, salt: SaltFunctions, get: ConfigGet) -> str:\n"
        "    return str(opts.get('virt')) + str(salt['config.get']('virt:images')) + str(get('virt:images', None))\n"
        "images({'id': 'hyper1'}, {'config.get': lambda key, default=None: default}, lambda key, default: default)\n"
    )
    rc, out = mypy(tmp_path, ok)
    assert rc == 0, out
    rc, out = mypy(tmp_path, ok + "images('hyper1', {}, len)\n")
    assert rc == 1, out
    assert 'incompatible type "str"; expected "dict[str, Any]"' in out, out
