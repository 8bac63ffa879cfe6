"""saltvirt.base.install: the one pip hint every message uses, and saltext-virt found beside salt-virt (a real
dist-info directory on sys.path, as pip writes one)."""

import ast
import logging
import sys

import pytest

from saltvirt import loader
from saltvirt.base import install
from tests.support.paths import ROOT, master_engines

MINION_SIDE = ("_modules", "_states", "_engines", "_grains")
MASTER_SIDE = ("_runners", "_pillar", "_output")


def fake_dist(where, dirname, name="saltext.virt", version="1.0.0"):
    info = where / f"{dirname}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return where


def test_the_hint_names_pip_and_salt_pip():
    assert install.HYPERVISOR_HINT == (
        "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
    )
    assert install.MASTER_HINT == "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"


def strings(path):
    """String constants of a module, docstrings left out (they describe, they do not tell what to run)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


@pytest.mark.parametrize("side", [MINION_SIDE, MASTER_SIDE])
def test_every_message_that_says_pip_install_has_the_one_wording(side):
    """A loader module whose saltvirt is missing cannot import the hint: its literal must be the hint's words
    (the minion side's with the [hypervisor] extra, the master's without)."""
    hint = install.HYPERVISOR_HINT if side is MINION_SIDE else install.MASTER_HINT
    paths = [p for d in side for p in sorted((ROOT / d).glob("*.py")) if p not in master_engines()]
    library = [p for p in sorted((ROOT / "_utils" / "saltvirt").rglob("*.py")) if p.name != "install.py"]
    paths += library if side is MINION_SIDE else master_engines()
    off = [f"{p.relative_to(ROOT)}: {s!r}" for p in paths for s in strings(p) if "pip install" in s and hint not in s]
    assert not off, "say it with saltvirt.base.install's words (pip_hint):\n" + "\n".join(off)


@pytest.mark.parametrize("dirname", ["saltext.virt", "saltext_virt"])  # as old and new pip name the directory
def test_saltext_virt_is_found_in_either_spelling(tmp_path, monkeypatch, dirname):
    monkeypatch.setattr(sys, "path", [str(fake_dist(tmp_path, dirname))])
    assert install.saltext_virt() == "saltext.virt 1.0.0"


def test_without_saltext_virt_nothing_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(fake_dist(tmp_path, "salt_virt", name="salt-virt"))])
    assert install.saltext_virt() is None


def test_the_loader_entry_point_warns_once_per_process(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys, "path", [str(fake_dist(tmp_path, "saltext_virt")), *sys.path])
    monkeypatch.setattr(install, "_checked", False)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # Salt calls it for every loader it builds
            loader.get_dirs()
    warned = [r.getMessage() for r in caplog.records if "saltext" in r.getMessage()]
    assert warned == [
        "saltext.virt 1.0.0 is installed beside salt-virt: both provide Salt's `virt` execution module, states and "
        "runner, and Salt's loader picks one `virt` of the two unpredictably. Uninstall one of them (pip uninstall "
        "saltext.virt, or salt-virt; salt-pip with Salt's onedir packages), then restart the salt daemons "
        "(docs/install.md)"
    ]
