"""Configuration of real Salt daemons (pytest-salt-factories) for the integration tests."""

import atexit
import compileall
import contextlib
import functools
import os
import shutil
import tempfile

from tests.support.paths import GUEST_DIR, ROOT, SMALL_REGISTRY


def master_config(state_tree, **extra):
    """Master overrides: this repo as a file_roots entry, so saltutil.sync_all serves _modules & co."""
    config = {
        "file_roots": {"base": [str(ROOT), str(state_tree)]},
        "log_level_logfile": "info",
        "open_mode": False,
        "auto_accept": True,
        # Salt's 5 request workers are 5 processes to start and keep per master; a test master serves few
        # minions, and several masters run at once on 2 cores
        "worker_threads": 3,
        # Salt's own default, which salt-factories lowers to 8 KiB: the master answers a salt:// fetch one
        # chunk of this size per request, so 8 KiB made the 197 MB tutorial image ~24,000 requests (~3 MB/s)
        "file_buffer_size": 1048576,
        # salt-factories forwards each daemon's (and each salt CLI's) log records to the test process from DEBUG
        # on, which pytest (log_level = WARNING) then drops: py-spy saw its log server in ~20% of a worker's CPU
        "pytest-master": {"log": {"level": "warning"}},
        "on_demand_ext_pillar": [],  # minions must not run the libvirt ext_pillar with their own config
        # who the hypervisors are: minion ids in the master config (never grains, see docs/topics/trust.md)
        "virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob"}},
        **SMALL_REGISTRY,
    }
    if (ROOT / "_pillar" / "libvirt.py").exists():
        # 2048-bit keys keep the tests quick; hyper1 manages hv1 (10.252.0.11 in its fabric)
        config["ext_pillar"] = [{"libvirt": {"key_size": 2048, "extra_sans": {"hyper1": ["hv1", "10.252.0.11"]}}}]
    config["virt"]["pool_paths"] = ["/var/tmp"]
    # image URLs a runner caller may give: the tests' own web servers, on loopback (any port)
    config["virt"]["image_sources"] = ["127.0.0.1"]
    config.update(extra)
    return config


# repo folder -> the extension_modules folder saltutil.sync_all writes it to
SYNCED = {
    "_modules": "modules",
    "_states": "states",
    "_grains": "grains",
    "_utils": "utils",
    "_engines": "engines",
    "_output": "output",
    "_runners": "runners",
    "_pillar": "pillar",
    "_resources": "resources",  # Salt 3008 resource types (saltutil.sync_resources)
}


@functools.cache
def _bundle():
    """The bundle laid out as ``saltutil.sync_all`` lays it out, byte-compiled once per test process (removed at
    its exit). Compiling it for every daemon was most of a worker's own CPU (py-spy: 294 of 387 samples while
    test_runner.py started its minions); a copy keeps the .py files' times, so the copied .pyc stay valid, and
    Python names the copy's files in its code objects when it loads them."""
    stage = tempfile.mkdtemp(prefix="svbundle", dir="/tmp")
    atexit.register(shutil.rmtree, stage, ignore_errors=True)
    for src, kind in SYNCED.items():
        if (ROOT / src).is_dir():
            shutil.copytree(ROOT / src, os.path.join(stage, kind), ignore=shutil.ignore_patterns("__pycache__"))
    # every job and CLI loads them, and the daemons write no .pyc (PYTHONDONTWRITEBYTECODE, salt-factories sets
    # it), so each would compile the bundle again
    compileall.compile_dir(stage, quiet=2)
    return stage


def _extension_modules(factory):
    return factory.config.get("extension_modules") or os.path.join(factory.config["cachedir"], "extmods")


def presync(factory):
    """Put the bundle where ``saltutil.sync_all`` puts it (the daemon's extension_modules), before the daemon
    starts: a real sync costs some 4 CPU-seconds per minion on the master and the minion (a request per
    file), and the suite starts dozens. The sync route itself is tested with hyper1 (conftest.py,
    test_deploy.py); every other daemon loads the same files from the same place."""
    shutil.copytree(_bundle(), _extension_modules(factory), dirs_exist_ok=True)
    return factory


def compiled(factory):
    """After a ``saltutil.sync_all`` into ``factory``'s extension_modules: its modules byte-compiled, as a daemon
    that may write bytecode does on their first import. salt-factories' daemons may not
    (PYTHONDONTWRITEBYTECODE), and the sync removes every file it did not write (``clean_dynamic_modules``), so
    each job and salt-run compiled what it imported from source again (py-spy: most of hyper1's job CPU)."""
    compileall.compile_dir(_extension_modules(factory), quiet=2)
    return factory


def start_minion(master, minion_id, overrides, sync=False):
    """A minion factory of ``master`` (start it with ``.started()``) with the bundle in place (:func:`presync`);
    ``sync=True``: none, the test syncs it from the master with ``saltutil.sync_all``."""
    quiet = {"log_level_logfile": "info", "pytest-minion": {"log": {"level": "warning"}}}  # see master_config
    factory = master.salt_minion_daemon(minion_id, overrides=dict(quiet, **overrides))
    return factory if sync else presync(factory)


@contextlib.contextmanager
def started_minions(master, configs):
    """Minions of ``master`` running for the ``with`` block: ``configs`` maps minion id -> overrides (as
    :func:`start_minion`); yields ``{id: factory}`` (a test may stop and start one again). All are stopped
    at the end, also when starting one failed."""
    factories = {mid: start_minion(master, mid, overrides) for mid, overrides in configs.items()}
    with contextlib.ExitStack() as stack:
        for factory in factories.values():
            stack.enter_context(factory.started())
        yield factories


SOURCES = "sources"  # <parent of virt:images>/sources is in virt:allowed_paths: the tests' local source images


def hypervisor_minion_config(hv, images_dir, **extra):
    # virt:allowed_paths: the test guest's kernel/initrd (boot_args) and images live outside virt:images;
    # a test's own source images go to <parent of virt:images>/sources (local images must be inside one)
    allowed = [str(GUEST_DIR), os.path.join(os.path.dirname(os.path.abspath(images_dir)), SOURCES)]
    config = {
        # pool_paths: the tests' pools are made in qemu_tmp (/var/tmp/svt-*)
        "virt": {
            "connection": {"uri": hv.uri},
            "images": str(images_dir),
            "allowed_paths": allowed,
            "pool_paths": ["/var/tmp"],
        },
        "grains": {"virt_hypervisor": True},
    }
    config.update(extra)
    return config
