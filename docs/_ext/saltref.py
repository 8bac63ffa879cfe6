"""``.. saltref:: _modules virt``: the reference of one Salt loader face, read from the source files' docstrings.

The loader modules need Salt's loader (``__salt__``, ``__opts__``, the ``sys.path`` bootstrap) to import, and several
files share one virtualname (``_modules/virt*.py`` are all ``virt``), so they are read with ``ast`` instead of
imported: the build works offline, without libvirt, and never runs loader code. A public function is a top-level
``def`` not starting with ``_`` (``__func_alias__`` renames it, as Salt's loader does).
"""

import ast
import inspect
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles

ROOT = Path(__file__).resolve().parents[2]


def _literal(tree, name):
    """The value of a top-level ``name = <literal>`` assignment, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def _indent(text, by="   "):
    return [by + line if line.strip() else "" for line in text.splitlines()]


def loader_files(kind, virtualname):
    """The files of ``_<kind>`` whose ``__virtualname__`` (or file name) is ``virtualname``, main file first."""
    found = []
    for path in sorted((ROOT / kind).glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if (_literal(tree, "__virtualname__") or path.stem) == virtualname:
            found.append((path, tree))
    return sorted(found, key=lambda item: item[0].stem != virtualname)


def functions(tree):
    """(Salt's name, signature, docstring) of each public function of a loader module."""
    aliases = _literal(tree, "__func_alias__") or {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            args = ast.unparse(node.args)
            yield aliases.get(node.name, node.name), args, inspect.cleandoc(ast.get_docstring(node, clean=False) or "")


def render(kind, virtualname, prefix):
    """reStructuredText for one loader face: per file its docstring, then its functions."""
    lines = []
    for path, tree in loader_files(kind, virtualname):
        rel = path.relative_to(ROOT)
        title = f"``{rel}``"
        lines += [title, "-" * len(title), ""]
        doc = ast.get_docstring(tree, clean=True)
        lines += [*(doc.splitlines() if doc else ["(no module docstring)"]), ""]
        for name, args, doc in functions(tree):
            lines += [f".. py:function:: {prefix}.{name}({args})", ""]
            lines += [*_indent(doc or "(no docstring)"), ""]
    if not lines:
        raise ValueError(f"saltref: no file in {kind}/ has __virtualname__ {virtualname!r}")
    return lines


class SaltRef(Directive):
    """``.. saltref:: <loader dir> <virtualname> <prefix shown before each function>``"""

    required_arguments = 3

    def run(self):
        kind, virtualname, prefix = self.arguments
        source = self.state.document.current_source
        content = StringList(render(kind, virtualname, prefix), source=source)
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, content, node)
        env = self.state.document.settings.env
        for path, _ in loader_files(kind, virtualname):
            env.note_dependency(str(path))
        return node.children


def setup(app):
    app.add_directive("saltref", SaltRef)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
