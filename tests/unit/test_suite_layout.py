"""The test suite's own conventions (HACKING.md "Tests"), checked statically so a new file cannot drift:
unit tests mirror the library and need no real libvirtd or salt daemons, helpers come from tests/support."""

import ast
import re

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
LIBRARY = ROOT / "_utils" / "saltvirt"
# fixtures (tests/conftest.py) that start a real libvirtd or salt daemons: integration tests only
INTEGRATION_FIXTURES = {
    "fabric",
    "hv1",
    "virt_hv",
    "lab_dir",
    "salt_factories",
    "salt_master",
    "hyper1",
    "salt_cli",
    "salt_run_cli",
    "state_tree",
}
INTEGRATION_HELPERS = {"tests.support.lab", "tests.support.saltd"}
# library modules without their tests/unit/test_<module>.py yet: this list may only shrink
WITHOUT_UNIT_FILE = {
    "caps",
    "conn",
    "crl",
    "fleet_cleanup",
    "fsutil",
    "lifecycle",
    "loader",
    "relocate",
    "storage",
}


def modules():
    return {p.stem for p in LIBRARY.glob("*.py") if p.stem != "__init__"}


def unit_files():
    return sorted((TESTS / "unit").rglob("test_*.py"))


def test_no_helper_is_imported_from_conftest():
    offenders = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("*.py")
        if re.search(r"^\s*(from conftest import|import conftest)", p.read_text(), re.M)
    ]
    assert not offenders, f"helpers belong in tests/support (from tests.support import ...): {offenders}"


def test_unit_tests_use_no_real_daemons():
    offenders = []
    for path in unit_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                used = {a.arg for a in node.args.args + node.args.kwonlyargs} & INTEGRATION_FIXTURES
                offenders += [f"{path.relative_to(ROOT)}::{node.name} uses {sorted(used)}"] if used else []
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
                if names & INTEGRATION_HELPERS:
                    offenders.append(f"{path.relative_to(ROOT)} imports {sorted(names & INTEGRATION_HELPERS)}")
    assert not offenders, f"real libvirtd / salt daemons belong in tests/integration: {offenders}"


def test_unit_files_are_named_after_a_library_module():
    mods = modules()
    strays = [
        str(p.relative_to(ROOT))
        for p in (TESTS / "unit").glob("test_*.py")
        if p.stem != "test_suite_layout"
        and not any(p.stem == f"test_{m}" or p.stem.startswith(f"test_{m}_") for m in mods)
    ]
    assert not strays, f"tests/unit/test_<module>[_<aspect>].py for a saltvirt module (HACKING.md): {strays}"


def test_every_library_module_has_a_unit_file():
    without = {m for m in modules() if not (TESTS / "unit" / f"test_{m}.py").exists()}
    assert without <= WITHOUT_UNIT_FILE, (
        f"new library modules need tests/unit/test_<module>.py: {without - WITHOUT_UNIT_FILE}"
    )


def test_the_exception_list_only_shrinks():
    """A module that got its unit file leaves WITHOUT_UNIT_FILE, so the list stays true (an entry for a removed
    module is harmless: delete it when you see it)."""
    stale = {m for m in WITHOUT_UNIT_FILE if (TESTS / "unit" / f"test_{m}.py").exists()}
    assert not stale, f"remove from WITHOUT_UNIT_FILE in {__file__}: {sorted(stale)}"


def test_loader_tests_mirror_a_loader_module():
    strays = []
    for path in (TESTS / "unit" / "loaders").glob("test_*.py"):
        kind, _, name = path.stem.removeprefix("test_").partition("_")
        if not (ROOT / f"_{kind}" / f"{name}.py").exists():
            strays.append(str(path.relative_to(ROOT)))
    assert not strays, f"tests/unit/loaders/test_<dir>_<name>.py for _<dir>/<name>.py: {strays}"


def test_xdist_work_units():
    """./run-tests' scheduler (tests/support/xdist_groups.py): a module's tests stay together, the modules on
    the session master share one unit, unit tests are units of their own."""
    from tests.support.xdist_groups import SESSION_MASTER_UNIT, work_unit

    assert work_unit("tests/integration/test_states.py::test_x") == SESSION_MASTER_UNIT  # uses hyper1
    assert work_unit("tests/integration/test_migration.py::test_a[p]") == "tests/integration/test_migration.py"
    assert work_unit("tests/integration/test_migration.py::test_b") == "tests/integration/test_migration.py"
    assert work_unit("tests/unit/test_spec.py::test_a") == "tests/unit/test_spec.py::test_a"
