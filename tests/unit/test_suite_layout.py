"""The test suite's own conventions (HACKING.md "Tests"), checked statically so a new file cannot drift:
unit tests mirror the library and need no real libvirtd or salt daemons, helpers come from tests/support."""

import ast
import re

import pytest
import tomllib

from tests.support.markers import LIBVIRTD_FIXTURES, SALT_FIXTURES, daemon_markers
from tests.support.paths import ROOT, master_engines

TESTS = ROOT / "tests"
LIBRARY = ROOT / "_utils" / "saltvirt"
# fixtures (tests/conftest.py) that start a real libvirtd or salt daemons: integration tests only
INTEGRATION_FIXTURES = LIBVIRTD_FIXTURES | SALT_FIXTURES | {"lab_dir", "state_tree"}
INTEGRATION_HELPERS = {"tests.support.lab", "tests.support.saltd", "tests.support.saltapi"}
# tests/unit/test_<x>.py of the project as a whole (not of one library module)
PROJECT_CHECKS = {
    "test_suite_layout.py",
    "test_docs.py",
    "test_types.py",
    "test_packaging.py",
    "test_console.py",
    "test_image_recipe.py",
}
# library modules without their tests/unit/test_<module>.py yet: this list may only shrink
WITHOUT_UNIT_FILE = {
    "host/caps",
    "host/lifecycle",
    "loader",
    "storage/pools",
}


def modules():
    """Library modules as ``<layer>/<module>`` (``loader`` alone: it is the package's face)."""
    return {
        str(p.relative_to(LIBRARY).with_suffix(""))
        for p in LIBRARY.rglob("*.py")
        if p.stem not in ("__init__", "__main__")
    }


def unit_file(module):
    """tests/unit/<layer>/test_<module>.py mirrors _utils/saltvirt/<layer>/<module>.py."""
    layer, _, name = module.rpartition("/")
    return TESTS / "unit" / layer / f"test_{name}.py"


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


def test_hacking_map_names_every_library_module():
    """HACKING.md's layer table is where a newcomer looks for a module: each one is named in its layer's row."""
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)/` \|.*$", (ROOT / "HACKING.md").read_text(), re.M)}
    missing = [
        m for m in sorted(modules()) if "/" in m and f"`{m.partition('/')[2]}`" not in rows.get(m.partition("/")[0], "")
    ]
    assert not missing, f"name these modules in their layer's row of HACKING.md 'Layout': {missing}"


def test_unit_files_are_named_after_a_library_module():
    mods = modules()
    strays = []
    for p in (TESTS / "unit").rglob("test_*.py"):
        layer = str(p.parent.relative_to(TESTS / "unit"))
        if layer == "loaders" or p.name in PROJECT_CHECKS:
            continue
        names = {m.rpartition("/")[2] for m in mods if m.rpartition("/")[0] == layer}
        if not any(p.stem == f"test_{m}" or p.stem.startswith(f"test_{m}_") for m in names):
            strays.append(str(p.relative_to(ROOT)))
    assert not strays, f"tests/unit/<layer>/test_<module>[_<aspect>].py for a saltvirt module (HACKING.md): {strays}"


def test_every_library_module_has_a_unit_file():
    without = {m for m in modules() if not unit_file(m).exists()}
    assert without <= WITHOUT_UNIT_FILE, (
        f"new library modules need tests/unit/test_<module>.py: {without - WITHOUT_UNIT_FILE}"
    )


def test_the_exception_list_only_shrinks():
    """A module that got its unit file leaves WITHOUT_UNIT_FILE, so the list stays true (an entry for a removed
    module is harmless: delete it when you see it)."""
    stale = {m for m in WITHOUT_UNIT_FILE if unit_file(m).exists()}
    assert not stale, f"remove from WITHOUT_UNIT_FILE in {__file__}: {sorted(stale)}"


def test_loader_tests_mirror_a_loader_module():
    strays = []
    for path in (TESTS / "unit" / "loaders").glob("test_*.py"):
        kind, _, name = path.stem.removeprefix("test_").partition("_")
        folder = ROOT / f"_{kind}"  # a module, or a package (a resource type: _resources/<type>/__init__.py)
        if not ((folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()):
            strays.append(str(path.relative_to(ROOT)))
    assert not strays, f"tests/unit/loaders/test_<dir>_<name>.py for _<dir>/<name>.py: {strays}"


def test_xdist_work_units():
    """./run-tests' scheduler (tests/support/xdist_groups.py): a module's tests stay together, the modules on
    the session master share one unit, unit tests are units of their own."""
    from tests.support.xdist_groups import SESSION_MASTER_UNIT, work_unit

    assert work_unit("tests/integration/test_states.py::test_x") == SESSION_MASTER_UNIT  # uses hyper1
    assert work_unit("tests/integration/test_migration.py::test_a[p]") == "tests/integration/test_migration.py"
    assert work_unit("tests/integration/test_migration.py::test_b") == "tests/integration/test_migration.py"
    assert work_unit("tests/unit/model/test_vmspec.py::test_a") == "tests/unit/model/test_vmspec.py::test_a"


def test_xdist_costs_name_real_units():
    """Every unit in xdist_groups.COST exists (a renamed module would silently lose its place in the order),
    and the costliest unit left goes first."""
    from tests.support.xdist_groups import COST, SESSION_MASTER_UNIT, cost, work_unit

    for unit in COST:
        if unit != SESSION_MASTER_UNIT:
            assert (ROOT / unit).is_file(), unit
            assert work_unit(f"{unit}::test_x") == unit, f"{unit} runs on the session master: cost it there"
    assert cost("tests/integration/test_tutorial.py", {"t": False}) > cost("tests/integration/test_compat_real.py", {})
    assert "tests/integration/test_compat_real.py" not in COST
    assert cost("tests/integration/test_compat_real.py", dict.fromkeys("abc", False)) == 3


def test_guest_heavy_units_never_stack_beyond_the_budget():
    """Issue 33: two migration labs (2 TCG guests each) do not run together on 2 cores while a light unit can
    fill the gap; with only heavy units left a worker takes the lightest (it never waits: xdist would leave it
    idle for ever)."""
    from tests.support.xdist_groups import GUESTS, cost, pick

    mig, rec, seed = (
        "tests/integration/test_migration.py",
        "tests/integration/test_recovery.py",
        "tests/integration/test_seed.py",
    )
    unit_test = "tests/unit/x::t"
    queue = {unit_test: {"u": False}, mig: {"a": False}, rec: {"b": False}, seed: {"c": False}}
    costliest = max((mig, rec), key=lambda unit: cost(unit, queue[unit]))
    assert pick(queue, running_guests=0, budget=2) == costliest
    assert pick(queue, running_guests=GUESTS[costliest], budget=2) == seed  # the other lab would make 4
    # unit tests fill the tail: never taken while a lab is left, whatever the budget
    assert pick({unit_test: {"u": False}, mig: {"a": False}}, running_guests=2, budget=2) == mig
    assert pick({unit_test: {"u": False}}, running_guests=4, budget=2) == unit_test
    assert pick({mig: {"a": False}}, running_guests=2, budget=2) == mig  # never wait
    backup = "tests/integration/test_backup_real.py"
    assert pick({mig: {"a": False}, backup: {"b": False}}, running_guests=2, budget=2) == backup  # the lightest
    assert pick({mig: {"a": False}}, running_guests=0, budget=1) == mig  # alone, it runs whatever its size
    for unit in GUESTS:
        assert (ROOT / unit).is_file(), unit


@pytest.mark.parametrize(
    "stage, cores, load, mem_gib, expected",
    [
        ("integration", 2, 0.1, 24, 6),  # a quiet 2-core machine
        ("integration", 2, 0.5, 24, 4),  # a quarter core or more busy: 2.5 a free core
        ("integration", 2, 1.0, 24, 2),  # half of it busy before the run
        ("integration", 2, 4.0, 24, 2),  # a CPU hog beside it: fewer workers, never none
        ("integration", 8, 0.0, 9, 3),  # memory bounds it: ~3 GiB a worker
        ("unit", 2, 0.0, 24, 5),
        ("unit", 2, 5.0, 24, 2),
    ],
)
def test_workers_are_sized_to_the_machine(stage, cores, load, mem_gib, expected):
    from tests.support import suiteplan

    assert suiteplan.workers(stage, cores=cores, load=load, mem=mem_gib * suiteplan.GIB) == expected


def test_changed_runs_the_tests_of_what_a_change_touches():
    from tests.support import suiteplan

    picked = suiteplan.selection(
        ["_utils/saltvirt/fleet/replies.py", "docs/index.md", "tests/unit/model/test_cpumem.py"]
    )
    assert {"tests/unit/fleet/test_replies.py", "tests/unit/test_docs.py", "tests/unit/model/test_cpumem.py"} <= set(
        picked
    )
    assert suiteplan.selection(["README.md"]) == ["tests/unit/test_docs.py", "tests/unit/test_suite_layout.py"]
    assert suiteplan.selection(["LICENSE"]) == []
    assert suiteplan.selection(["setup.py"]) == ["tests/unit/test_packaging.py"]


# the library's layers, bottom up (HACKING.md "Layout"): a module imports only from its own layer or below
LAYERS = ["base", "pki", "model", "xml", "host", "storage", "guest", "vm", "fleet"]
# modules still on an import cycle: this set may only shrink
KNOWN_CYCLES = set()


def library_imports():
    """(module, imported saltvirt module) for every import in the library, as ``<layer>/<module>`` names."""
    edges = []
    for path in LIBRARY.rglob("*.py"):
        me = str(path.relative_to(LIBRARY).with_suffix(""))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "saltvirt":
                parts = node.module.split(".")[1:]
                targets = [
                    "/".join([*parts, a.name])
                    if len(parts) == 1 or saltvirt_module(f"{node.module}.{a.name}")  # or a package's module
                    else "/".join(parts)
                    for a in node.names
                ]
                edges += [(me, t) for t in (targets if parts else [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                edges += [(me, "/".join(a.name.split(".")[1:])) for a in node.names if a.name.startswith("saltvirt.")]
    return edges


def test_library_imports_only_lower_layers():
    mods = modules()
    bad = []
    for me, target in library_imports():
        layer, target_layer = me.partition("/")[0], target.partition("/")[0]
        if target_layer not in LAYERS:
            continue  # the package face (saltvirt.__version__)
        if target not in mods and target_layer != target:
            bad.append(f"{me} imports {target}, which is not a library module")
        elif layer in LAYERS and LAYERS.index(target_layer) > LAYERS.index(layer):
            bad.append(f"{me} ({layer}) imports {target} from the higher layer {target_layer}")
    assert not bad, "move the shared piece down a layer (HACKING.md 'Layout'):\n" + "\n".join(bad)


def test_library_has_no_import_cycle():
    graph = {}
    for me, target in library_imports():
        graph.setdefault(me, set()).add(target)

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cyclic = sorted(m for m in graph if m in reach(m) and m not in KNOWN_CYCLES)
    assert not cyclic, f"modules on an import cycle (move what both need into a module below them): {cyclic}"


def test_every_layer_says_what_it_may_import():
    missing = [
        layer
        for layer in LAYERS
        if "May import" not in ((LIBRARY / layer / "__init__.py").read_text() if (LIBRARY / layer).is_dir() else "")
    ]
    assert not missing, f"each layer's __init__.py docstring says what lives there and what it may import: {missing}"


# layers whose public functions are all typed (HACKING.md "Rules"; mypy runs in test_types.py), bottom up:
# this list may only grow (base .. fleet)
TYPED_LAYERS = ["base", "pki", "model", "xml", "host", "storage", "guest", "vm", "fleet"]


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
        for path in sorted((LIBRARY / layer).rglob("*.py")):
            missing += [f"{path.relative_to(LIBRARY)} {m}" for m in untyped(path)]
    assert not missing, "public functions need type hints (saltvirt.base.salttypes for Salt's dunders):\n" + "\n".join(
        missing
    )


def test_the_annotation_check_sees_a_missing_hint(tmp_path):
    (tmp_path / "m.py").write_text("def f(a: int, b) -> int: ...\nclass C:\n    def g(self, x: int): ...\n")
    assert untyped(tmp_path / "m.py") == ["f: b", "C.g: return"]


def test_configuration_page_lists_every_virt_key():
    """Every top-level ``virt:<key>`` the code names (in a config lookup, an error or a docstring) has a row in
    docs/configuration.md (HACKING.md "Rules")."""
    named = set()
    for folder in (
        "_modules",
        "_states",
        "_runners",
        "_pillar",
        "_engines",
        "_grains",
        "_output",
        "_resources",
        "_utils",
    ):
        for path in (ROOT / folder).rglob("*.py"):
            named |= set(re.findall(r"\bvirt:([a-z][a-z_]+)\b", path.read_text()))
    page = (ROOT / "docs" / "configuration.md").read_text()
    missing = sorted(key for key in named if f"`virt:{key}" not in page)
    assert not missing, f"add these virt: keys to docs/configuration.md (default and meaning): {missing}"


def test_daemon_markers_come_from_fixtures_and_hand_built_labs():
    assert daemon_markers(["tmp_path", "virt_test"]) == []
    assert daemon_markers(["hyper1", "hv1", "salt_master"]) == ["libvirtd", "salt"]

    class lab:  # noqa: N801 - stands for tests.support.lab (a unit test may not import it): names are what count
        Hypervisor = Fabric = staticmethod(lambda *args: None)

    def hand_built(where):
        return lab.Hypervisor(where, 9, lab.Fabric("x"))

    assert daemon_markers(["where"], [hand_built]) == ["libvirtd"]


def test_not_salt_deselects_every_test_that_starts_salt_daemons():
    """The markers tests/conftest.py derives, as ``pytest -m`` sees them (collection only: nothing starts)."""
    import subprocess
    import sys

    def collected(marks, *files):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-n", "0", "-m", marks,
             *(f"tests/integration/{f}" for f in files)],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        return {line.split("::")[0].rpartition("/")[2] for line in proc.stdout.splitlines() if "::" in line}

    files = ("test_runner.py", "test_hosttype.py", "test_cloudinit.py", "test_seed.py")
    assert collected("not salt", *files) == {"test_hosttype.py", "test_cloudinit.py", "test_seed.py"}
    assert collected("not libvirtd", *files) == {"test_seed.py"}  # cloudinit builds its lab by hand


MAX_LINES = 800  # HACKING.md: small files
SOURCE_DIRS = ("_utils", "_modules", "_states", "_runners", "_pillar", "_engines", "_grains", "_output", "_resources")
SOURCE_DIRS += ("tests", "scripts", "bench", "docs")


def python_files():
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def oversized(files):
    """``{file: lines}`` of ``files`` longer than :data:`MAX_LINES`."""
    return {
        str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name): n
        for p in files
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }


def test_every_python_file_is_small():
    """The 800-line cap (issue 35: written down, checked by nothing; vm/migrate.py stood at 799)."""
    files = python_files()
    assert len(files) > 300, "the file list looks wrong: fewer Python files than the tree has"
    assert {"_utils", "_runners", "_modules", "tests"} <= {p.relative_to(ROOT).parts[0] for p in files}
    big = oversized(files)
    assert not big, f"files over {MAX_LINES} lines: split them along a seam (HACKING.md): {big}"


def test_the_line_cap_sees_a_big_file(tmp_path):
    (tmp_path / "at.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "over.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(sorted(tmp_path.glob("*.py"))) == {"over.py": MAX_LINES + 1}


# Salt's loader folders: a module-level name that starts with "_" is hidden from the loader (a convention)
LOADER_DIRS = ("_modules", "_states", "_runners", "_pillar", "_engines", "_grains", "_output", "_resources")
# the master's code (HACKING.md "Layout": side): it runs where libvirt-python is not installed
MASTER_SIDE = ("_utils/saltvirt/fleet", "_runners", "_pillar")
MINION_LAYERS = ("host", "xml", "guest", "vm")


def saltvirt_module(dotted):
    """Whether ``saltvirt.<layer>[.<module>]`` is a library module or layer (not a name inside one)."""
    path = LIBRARY.joinpath(*dotted.split(".")[1:])
    return dotted.split(".")[0] == "saltvirt" and (
        path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    )


def source_files(*folders):
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def saltvirt_imports(tree):
    """``(node, imported saltvirt module or None, name, asname)`` of every import of a saltvirt name in ``tree``:
    the module is ``saltvirt.<layer>.<module>`` when the import binds a module, None for a name inside one."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "saltvirt":
            for a in node.names:
                full = f"{node.module}.{a.name}"
                yield node, full if saltvirt_module(full) else None, a.name, a.asname
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("saltvirt."):
                    yield node, a.name, a.name, a.asname


def test_saltvirt_modules_keep_their_own_names():
    """Issue 35: ``from saltvirt.fleet import publish as fleet`` kept a module's old name alive, and a reader
    looking for ``publish.run`` found nothing. A library module imports each module under its own name; a
    loader module may hide one as ``_name`` (``conn as _c``)."""
    renamed = []
    for path in source_files("_utils", *LOADER_DIRS):
        in_library = path.is_relative_to(LIBRARY)
        for node, module, name, asname in saltvirt_imports(ast.parse(path.read_text())):
            if module and asname and asname != name.rpartition(".")[2] and (in_library or asname[0] != "_"):
                renamed.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module} as {asname}")
    assert not renamed, (
        "import a saltvirt module under its own name and call it by it (publish.run, not fleet.run); where a "
        "local variable has that name, rename the variable (a loader module may use an _alias):\n" + "\n".join(renamed)
    )


def private_reads(path):
    """Where ``path`` reads another saltvirt module's private name: ``module._name`` through an import of that
    module, or ``from saltvirt.<layer>.<module> import _name`` (dunders are not private)."""

    def private(name):
        return name.startswith("_") and not name.startswith("__")

    tree = ast.parse(path.read_text())
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    modules, reads = {}, []
    in_library = path.is_relative_to(LIBRARY) or not path.is_relative_to(ROOT)
    for node, module, name, asname in saltvirt_imports(tree):
        if module:
            modules[asname or name] = module
        elif private(name):
            reads.append(f"{shown}:{node.lineno} imports {name} from {node.module}")
        elif asname and private(asname) and in_library:  # a loader module may hide a name from Salt's loader
            reads.append(f"{shown}:{node.lineno} imports {node.module}.{name} as private {asname}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = ast.unparse(node.value)
            module = modules.get(base) or (base if saltvirt_module(base) else None)
            if module:
                reads.append(f"{shown}:{node.lineno} reads {module}.{node.attr}")
    return reads


def test_no_module_reads_another_modules_private_names():
    """Issue 35: storage/intake used six privates of storage/images, vm/provision imported host/query's
    ``_all_stats``, pki/ca imported castore's public ``locked`` as ``_locked``: a private name is one its module
    may change alone, and one that reads as private at its use hides that another module owns it."""
    reads = [r for path in source_files("_utils", *LOADER_DIRS) for r in private_reads(path)]
    assert not reads, (
        "a name another module uses is public: rename it without the underscore (typed, with a docstring; update "
        "its users and tests), or move it to the module that uses it:\n" + "\n".join(reads)
    )


def test_the_private_read_check_sees_both_forms(tmp_path):
    (tmp_path / "m.py").write_text(
        "from saltvirt.storage import images\nfrom saltvirt.host import query as q\n"
        "from saltvirt.host.query import _all_stats, describe\n"
        "from saltvirt.pki.castore import locked as _locked\n"
        "images._run(images.run_tool, q._listed_flags(), images.__name__)\n"
    )
    found = [r.partition(" ")[2] for r in private_reads(tmp_path / "m.py")]
    assert sorted(found) == [
        "imports _all_stats from saltvirt.host.query",
        "imports saltvirt.pki.castore.locked as private _locked",
        "reads saltvirt.host.query._listed_flags",
        "reads saltvirt.storage.images._run",
    ]


def minion_imports(path):
    """Where the master-side file ``path`` imports a minion layer (:data:`MINION_LAYERS`), in any form: ``from
    saltvirt.host import conn``, ``from saltvirt.vm.migrate import x``, ``import saltvirt.xml.etree``."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    bad = []
    for node, module, _name, _asname in saltvirt_imports(ast.parse(path.read_text())):
        parts = (module or node.module).split(".")  # a name inside a module: that module
        if len(parts) > 1 and parts[1] in MINION_LAYERS:
            bad.append(f"{shown}:{node.lineno} imports {module or node.module}")
    return bad


def test_the_master_side_imports_no_minion_layer():
    """The master's code (fleet, the runners, the ext_pillar, the master engines) runs where libvirt-python may not
    be installed (test_packaging.py): it never imports the minion's layers. Issue 35: the virt runner imported
    saltvirt.host.stats for its rates (now saltvirt.fleet.vmrates). storage is allowed: image intake
    (saltvirt.storage.intake) checks images on the master."""
    paths = source_files(*MASTER_SIDE) + master_engines()
    assert {"fleet", "_runners", "_pillar", "_engines"} <= {p.parent.name for p in paths}, "the master side moved"
    bad = [b for path in paths for b in minion_imports(path)]
    assert not bad, (
        f"the master side never imports saltvirt.{{{','.join(MINION_LAYERS)}}}: move what it needs to base or spec "
        "(pure data, both sides) or into fleet:\n" + "\n".join(bad)
    )


def test_the_master_side_check_sees_every_form_of_import(tmp_path):
    (tmp_path / "m.py").write_text(
        "from saltvirt.host import conn\nfrom saltvirt.vm.migrate import plan\nimport saltvirt.xml.etree\n"
        "from saltvirt.fleet import publish\nfrom saltvirt.storage import intake\nfrom saltvirt.base import validate\n"
        "def f():\n    from saltvirt.guest import seed\n"
    )
    found = [b.partition(" ")[2] for b in minion_imports(tmp_path / "m.py")]
    assert sorted(found) == [
        "imports saltvirt.guest.seed",
        "imports saltvirt.host.conn",
        "imports saltvirt.vm.migrate",
        "imports saltvirt.xml.etree",
    ]


# the one bootstrap of a loader module that imports saltvirt ({kind}: the extension_modules folder Salt syncs
# the loader's folder to): issue 35 found 24 copies of it, written down as one and checked by nothing
BOOTSTRAP = """\
saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{{{kind},utils/saltvirt}}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None
"""


def bootstrap_drift(path, text):
    """Why the loader module at ``path`` (its ``text``) does not carry :data:`BOOTSTRAP` as written, or None."""
    if "import saltvirt" not in text:
        return None
    kind = path.parent.name.removeprefix("_")  # saltutil.sync_all: _modules -> <extension_modules>/modules, ...
    return None if BOOTSTRAP.format(kind=kind) in text else f"{path.relative_to(ROOT)}: not the bootstrap for {kind}"


def test_every_loader_module_bootstraps_saltvirt_the_same_way():
    """One bootstrap, copied verbatim (a loader module cannot import it: it is what finds the library)."""
    paths = [p for d in LOADER_DIRS for p in sorted((ROOT / d).glob("*.py"))]
    checked = [p for p in paths if "import saltvirt" in p.read_text()]
    assert len(checked) > 20, "the loader module list looks wrong"
    assert [why for p in checked if (why := bootstrap_drift(p, p.read_text()))] == []
    drifted = BOOTSTRAP.format(kind="modules").replace('"utils"', '"utils2"')
    assert bootstrap_drift(ROOT / "_modules" / "x.py", "import saltvirt\n" + drifted)  # the check sees a drift
    assert bootstrap_drift(ROOT / "_runners" / "x.py", BOOTSTRAP.format(kind="modules"))  # and the wrong folder


def test_mypy_checks_every_module_alike():
    """Issue 35: check_untyped_defs on every layer and the loaders, no module let off (the XML readers' override
    hid 60 errors: union-attr on ElementTree's Optional find, now etree.need/etree.attr)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert conf["check_untyped_defs"] is True
    assert conf.get("overrides", []) == [], "a mypy override lets modules off: fix their errors instead"


def test_a_daemons_port_scan_survives_a_process_that_exits_during_it(monkeypatch):
    """Run D2: a salt-api's teardown errored with psutil.NoSuchProcess, raised by pytest-shell-utilities' scan for
    processes left on its ports when some other process exited during the scan (tests/support/portscan.py). The
    process here really exited (psutil raises for it as it did then); only the listing is stubbed, because the
    moment a process exits between listing and look cannot be chosen otherwise."""
    import subprocess
    import types

    import psutil
    from pytestshellutils.shell import Daemon

    from tests.support import portscan

    gone = subprocess.Popen(["sleep", "60"])
    listed = psutil.Process(gone.pid)
    gone.kill()
    gone.wait()
    with pytest.raises(psutil.NoSuchProcess):
        listed.net_connections()
    listings = []  # the first scan lists the exited process, the next ones the machine without it

    def process_iter(*_args, **_kwargs):
        listings.append(None)
        return [listed] if len(listings) == 1 else []

    monkeypatch.setattr(psutil, "process_iter", process_iter)
    portscan.install()  # as tests/conftest.py does (once: a second install keeps the first)
    daemon = types.SimpleNamespace(check_ports=[4506], listen_ports=[4506])
    Daemon._terminate_processes_matching_listen_ports(daemon)  # raised NoSuchProcess before the fix
    assert len(listings) == 2  # scanned again after the exit, and no more


def test_the_daemons_ports_are_never_in_the_range_outgoing_connections_take():
    """salt-factories' ports come from tests/support/daemonports.py once tests/conftest.py installed it: below the
    kernel's ephemeral range, so no outgoing connection takes one between its choice and the daemon's bind (run F1:
    tut-master's "Address already in use"); a port something listens on is skipped."""
    import socket

    from pytestshellutils.utils import ports

    from tests.support import daemonports

    low, _high = daemonports.ephemeral_range()
    chosen = [ports.get_unused_localhost_port() for _ in range(3)]
    assert all(port < low for port in chosen) and len(set(chosen)) == 3, chosen
    start = daemonports.FIRST + 8 * daemonports.BLOCK  # a block no worker of a run uses (six workers)
    assert start + 3 < low
    with socket.socket() as held:
        held.bind(("127.0.0.1", start))
        held.listen()
        assert next(daemonports.allocator(start, 3)) == start + 1


def test_a_passing_test_leaves_no_files_behind(pytestconfig):
    """pytest kept every test's tmp_path for three runs: ~7 GB a run here, which filled a CI machine's disk in
    the middle of a run (250 errors, "No space left on device"). A failing test's files stay, to look at."""
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"


def test_a_test_masters_resource_registry_is_small(tmp_path):
    """Salt's resource registry as a test master opens it (paths.SMALL_REGISTRY, in saltd.master_config and
    testfleet.local_store): a file of kilobytes, not Salt's default 256 MiB written in full in every master's and
    every HA test's cachedir."""
    import salt.utils.resource_registry as registry

    from tests.support.testfleet import local_store

    reg = registry.ResourceRegistry(local_store(tmp_path).opts)
    reg.register_minion("hv1", {"virt_vm": ["3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a001"]})
    index = tmp_path / "cache" / registry.PRIMARY_INDEX_SUBDIR / registry.PRIMARY_INDEX_FILENAME
    assert reg.get_resources_for_minion("hv1") == {"virt_vm": ["3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a001"]}
    assert index.stat().st_blocks * 512 <= 1 << 20, index.stat()


@pytest.mark.parametrize(("need", "refused"), [("0", False), ("99999999999", True)])
def test_run_tests_says_when_the_disk_is_too_full_before_it_starts(need, refused):
    """./run-tests' ``enough_disk`` (the function itself, read out of the script): a run that fills the disk
    fails hundreds of tests with "No space left on device" (CI, 11-30); too little free space is one clear error
    that says what to free, before any test starts."""
    import subprocess

    script = (ROOT / "run-tests").read_text()
    func = re.search(r"^enough_disk\(\) \{\n.*?^\}\n", script, re.S | re.M).group(0)
    done = subprocess.run(
        ["bash", "-c", f"{func}\nenough_disk integration"],
        env={"PATH": "/usr/bin:/bin", "RUN_TESTS_DISK_MIB": need},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode != 0) is refused, done
    assert ("MiB free on /tmp" in done.stderr and "free some space" in done.stderr) is refused, done.stderr
