"""saltvirt.base.install: the one pip hint every message uses."""

import ast

import pytest

from saltvirt.base import install
from tests.support.paths import ROOT

MINION_SIDE = ("_modules", "_states", "_engines", "_grains")
MASTER_SIDE = ("_runners", "_pillar", "_output")


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
    paths = [p for d in side for p in sorted((ROOT / d).glob("*.py"))]
    library = [p for p in sorted((ROOT / "_utils" / "saltvirt").rglob("*.py")) if p.name != "install.py"]
    paths += library if side is MINION_SIDE else []
    off = [f"{p.relative_to(ROOT)}: {s!r}" for p in paths for s in strings(p) if "pip install" in s and hint not in s]
    assert not off, "say it with saltvirt.base.install's words (pip_hint):\n" + "\n".join(off)
