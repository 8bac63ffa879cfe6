"""How ./run-tests spreads the suite over pytest-xdist workers (``-n N --dist loadgroup``).

- Every integration module is one work unit: its module-scoped labs, masters and guests are built once, in
  one worker.
- The integration modules that use the session's salt-master (fixtures ``salt_master``, ``hyper1``,
  ``salt_cli``, ``salt_run_cli``) form one unit together, so that master and its minion start once per run.
- Unit tests are units of their own: xdist hands them out one by one to whichever worker is free.

xdist's own ``loadgroup`` (``xdist_group`` marks) cannot be used: pytest-xdist 3.8 tags grouped tests by
setting ``item._nodeid``, which pytest 9 no longer reads (node ids live in ``item._id``), so the groups are
silently ignored and a module's tests are split across workers. The grouping therefore happens in the
controller, from the node ids alone (the controller does not collect): tests/conftest.py returns this
scheduler from ``pytest_xdist_make_scheduler`` when ``--dist loadgroup`` is asked for.
"""

import ast
import functools

from tests.support.paths import ROOT

SESSION_MASTER_FIXTURES = {"salt_master", "hyper1", "salt_cli", "salt_run_cli"}
SESSION_MASTER_UNIT = "tests/integration[session-master]"


@functools.cache
def uses_session_master(path):
    """True when a function or fixture in the module at ``path`` (relative to the repo) takes one of the
    session-master fixtures as an argument."""
    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError):
        return False
    return any(
        {a.arg for a in node.args.args + node.args.kwonlyargs} & SESSION_MASTER_FIXTURES
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def work_unit(nodeid):
    """The work unit (xdist "scope") of a test: see the module docstring."""
    path = nodeid.split("::", 1)[0]
    if not path.startswith("tests/integration/"):
        return nodeid
    return SESSION_MASTER_UNIT if uses_session_master(path) else path


def make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    return ModuleGroupScheduling(config, log)
