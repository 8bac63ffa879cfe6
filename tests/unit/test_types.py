"""The library type-checks (mypy, configured in pyproject.toml), and every public function of the layers already
typed carries annotations for all its arguments and its return (HACKING.md "Rules")."""

import ast
import subprocess
import sys

from tests.support.paths import ROOT

LIBRARY = ROOT / "_utils" / "saltvirt"
# layers whose public functions are all typed, bottom up: this list may only grow (base .. fleet)
TYPED_LAYERS = []


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


def untyped(path):
    """Public functions and methods of one module lacking an annotation: ``name: what is missing``."""
    out = []

    def visit(body, prefix=""):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                args += [a for a in (node.args.vararg, node.args.kwarg) if a]
                missing = [a.arg for a in args if a.annotation is None and a.arg not in ("self", "cls")]
                missing += ["return"] if node.returns is None else []
                if missing:
                    out.append(f"{prefix}{node.name}: {', '.join(missing)}")

    visit(ast.parse(path.read_text()).body)
    return out


def test_public_functions_of_typed_layers_are_annotated():
    missing = []
    for layer in TYPED_LAYERS:
        for path in sorted((LIBRARY / layer).glob("*.py")):
            missing += [f"{path.relative_to(LIBRARY)} {m}" for m in untyped(path)]
    assert not missing, "public functions need type hints (saltvirt.base.salttypes for Salt's dunders):\n" + "\n".join(
        missing
    )


def test_the_annotation_check_sees_a_missing_hint(tmp_path):
    (tmp_path / "m.py").write_text("def f(a: int, b) -> int: ...\nclass C:\n    def g(self, x: int): ...\n")
    assert untyped(tmp_path / "m.py") == ["f: b", "C.g: return"]
