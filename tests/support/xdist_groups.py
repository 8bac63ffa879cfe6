"""How ./run-tests spreads the suite over pytest-xdist workers (``-n N --dist loadgroup``).

- Every integration module is one work unit: its module-scoped labs, masters and guests are built once, in
  one worker.
- The integration modules that use the session's salt-master (fixtures ``salt_master``, ``hyper1``,
  ``salt_cli``, ``salt_run_cli``) form one unit together, so that master and its minion start once per run.
- Unit tests are units of their own, in the same session: xdist hands them out one by one to whichever worker
  is free once every integration unit has started (:func:`pick`).
- A free worker takes the costliest unit left (:data:`COST`, seconds measured on a quiet 2-core machine):
  the long labs start first and the short ones fill the gaps, so the run ends when the longest chain
  does. xdist's own order (most tests first) started the one-test tutorial last.
- Units that boot TCG guests declare how many run at once (:data:`GUESTS`); a free worker prefers the units
  that keep the running ones within :func:`guest_budget` guests together (2.5 a core: an emulated guest keeps
  a core busy while it boots), so the labs that boot and migrate several do not all stack while lighter work is
  left. When only guest-heavy units are left it takes the lightest: a worker never waits (a version that let
  workers wait for a budget ended with every worker idle and units left, in a real run).

xdist's own ``loadgroup`` (``xdist_group`` marks) cannot be used: pytest-xdist 3.8 tags grouped tests by
setting ``item._nodeid``, which pytest 9 no longer reads (node ids live in ``item._id``), so the groups are
silently ignored and a module's tests are split across workers. The grouping therefore happens in the
controller, from the node ids alone (the controller does not collect): tests/conftest.py returns this
scheduler from ``pytest_xdist_make_scheduler`` when ``--dist loadgroup`` is asked for.
"""

import ast
import functools
import os

from tests.support.paths import ROOT

SESSION_MASTER_FIXTURES = {"salt_master", "hyper1", "salt_cli", "salt_run_cli"}
SESSION_MASTER_UNIT = "tests/integration[session-master]"
# seconds per work unit (setup + calls + teardown); a unit not listed costs one second per test. Rough is enough:
# only the order matters. Update after a big change of a module. Measured: runs S and T (2026-11-30, quiet 2-core
# machine, 5 workers), the mean of each unit's wall.
COST = {
    "tests/integration/test_multimaster.py": 270,  # mostly waits: mmgone's job checks (209 s alone, was 293)
    SESSION_MASTER_UNIT: 345,
    "tests/integration/test_tenants.py": 340,  # headless Chromium, the VM consoles, the browser flow's guest
    "tests/integration/test_runner.py": 300,
    "tests/integration/test_migration.py": 300,
    "tests/integration/test_recovery.py": 315,  # +40: its virt.roll test (alone, quiet: 244 s vs 205 s without)
    "tests/integration/test_ha_real.py": 230,  # alone, quiet: 232 s; 3 hosts lost, a TCG boot after each
    "tests/integration/test_faults.py": 230,
    "tests/integration/test_backup_real.py": 185,
    "tests/integration/test_resources_real.py": 110,  # alone, quiet: 70 s (137 s when its probes waited 60 s)
    "tests/integration/test_balance_real.py": 140,  # a master restart: the engine
    "tests/integration/test_events.py": 105,
    "tests/integration/test_backup_runner.py": 90,
    "tests/integration/test_rebalance_real.py": 90,
    "tests/integration/test_delegation.py": 80,
    # the 197 MB image fetched in Salt's 1 MiB chunks
    "tests/integration/test_tutorial.py": 80,
    # two fresh venvs, the sdist and wheel, a master and a minion from them (cold pip cache: minutes more)
    "tests/integration/test_wheel.py": 70,
    "tests/integration/test_authority.py": 65,
    "tests/integration/test_seed.py": 60,
    "tests/integration/test_bench_smoke.py": 60,
    "tests/integration/test_snapshot_real.py": 40,
    "tests/integration/test_resources.py": 35,  # its own master and three minions
    "tests/integration/test_lockspace.py": 35,
    "tests/integration/test_domain_features.py": 30,
    "tests/integration/test_storage_real.py": 20,
    "tests/integration/test_hosttype.py": 20,
    "tests/integration/test_init_real.py": 20,
    "tests/integration/test_console_tls.py": 15,  # one libvirtd, one guest at SeaBIOS
    "tests/integration/test_guestexec_real.py": 12,  # one qemu-ga guest booted
}


# TCG guests a unit boots at once (most at any moment, not in all); a unit not listed boots none or one
# briefly. The budget is :func:`guest_budget`.
GUESTS = {
    "tests/integration/test_migration.py": 2,
    "tests/integration/test_recovery.py": 2,
    "tests/integration/test_ha_real.py": 2,  # ha1 and plain1 boot together; each recovery boots one
    "tests/integration/test_rebalance_real.py": 2,
    "tests/integration/test_balance_real.py": 2,
    "tests/integration/test_tutorial.py": 1,  # the Debian guest with its own salt-minion
    "tests/integration/test_tenants.py": 2,  # a1, a2 at SeaBIOS for the ticket tests, then a9 booted alone
    "tests/integration/test_console_tls.py": 1,
    "tests/integration/test_backup_real.py": 1,
    "tests/integration/test_faults.py": 1,
    "tests/integration/test_init_real.py": 1,
    "tests/integration/test_guest_ips.py": 1,
    "tests/integration/test_events.py": 1,
    "tests/integration/test_cloudinit.py": 1,
    "tests/integration/test_domain_features.py": 1,
    "tests/integration/test_snapshot_real.py": 1,
    "tests/integration/test_guestexec_real.py": 1,
    "tests/integration/test_storage_real.py": 1,
    "tests/integration/test_resources_real.py": 1,
}


def guest_budget():
    """TCG guests the running units may boot together: five on two cores (``RUN_TESTS_GUEST_BUDGET`` overrides). A
    guest keeps a core busy while it boots (some 3 CPU-s), then beats at ~0.5% of one; with one a core the
    four labs that boot two (recovery, rebalance, migration, balancing) could only run one after another."""
    return int(os.environ.get("RUN_TESTS_GUEST_BUDGET") or int(2.5 * max(1, os.cpu_count() or 2)))


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


def cost(unit, nodeids):
    """Expected seconds of a work unit (see :data:`COST`)."""
    return COST.get(unit, len(nodeids))


def pick(queue, running_guests, budget):
    """The unit a free worker takes from ``queue`` (``{unit: nodeids}``) while units booting
    ``running_guests`` TCG guests run: the costliest that fits the guest budget, else the one booting fewest.
    Unit tests only once no integration unit is left: they fill the workers the last labs leave idle (a run
    that did them first waited 60-80 s on them), and a worker never builds a lab after them."""
    labs = [u for u in queue if u.startswith("tests/integration")]
    if not labs:
        return next(iter(queue))
    fits = [u for u in labs if not GUESTS.get(u) or not running_guests or running_guests + GUESTS[u] <= budget]
    if not fits:
        return min(labs, key=lambda u: (GUESTS.get(u, 0), -cost(u, queue[u])))
    return max(fits, key=lambda u: cost(u, queue[u]))


def make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

        def _running_guests(self):
            return sum(
                GUESTS.get(unit, 0)
                for units in self.assigned_work.values()
                for unit, done in units.items()
                if not all(done.values())
            )

        def _assign_work_unit(self, node):
            """xdist's, but the unit :func:`pick` chooses instead of the first one."""
            unit = pick(self.workqueue, self._running_guests(), guest_budget())
            nodeids = self.workqueue.pop(unit)
            self.assigned_work.setdefault(node, {})[unit] = nodeids
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(n) for n, done in nodeids.items() if not done])

    return ModuleGroupScheduling(config, log)
