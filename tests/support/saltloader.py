"""Salt's real loaders over this repo's loader modules, in-process (no daemons)."""

import copy
import os
import sys

from tests.support.paths import GUEST_DIR, ROOT

SOURCES = "sources"  # tmp_path/sources is in virt:allowed_paths: local source images of a test go there
TEST_POOLS = "/srv/test-pools"  # in virt:pool_paths: the test driver's pools (it makes no directory)
TEST_DRIVER_POOL = "/default-pool"  # in virt:pool_paths: the target of test:///default's own pool

# Salt's core grains of this machine, by the options that differ between calls: computing them was a fifth of
# what a make_minion_mods costs, for the same answer each time (every call gets its own copy to change)
_GRAINS = {}


def guess_machine_id_once():
    """Salt's guess of this machine's id, made once per process: ``salt.config.minion_config(None)`` and
    ``master_config(None)``, called by most unit tests and fixtures, guess it whenever no ``id`` is configured (a
    DNS lookup, /etc/hosts and two ``ip`` subprocesses: ~5 ms, a quarter of a :func:`make_minion_mods`) for the
    same answer each time, and the tests then set their own ids. Daemons are separate processes: untouched."""
    import functools

    import salt.utils.network

    if not hasattr(salt.utils.network.generate_minion_id, "cache_info"):
        salt.utils.network.generate_minion_id = functools.cache(salt.utils.network.generate_minion_id)


def make_minion_mods(tmp_path, uri, images_dir=None, opts_extra=None, **config):
    """The real Salt loader with this repo's _modules, as a minion would load them (no daemon).
    ``config``: ``virt:`` settings; ``opts_extra``: other minion options (``sock_dir``, ...)."""
    import salt.config
    import salt.loader

    opts = salt.config.minion_config(None)
    opts.update(
        {
            "id": "hyper-test",
            "master": "salt-master.example",
            "file_client": "local",
            "cachedir": str(tmp_path / "cache"),
            "pki_dir": str(tmp_path / "pki"),
            "module_dirs": [str(ROOT / "_modules")],
            "virt": dict(
                {
                    "connection": {"uri": uri},
                    "images": str(images_dir or tmp_path / "images"),
                    # the test guest's kernel/initrd/images, and tmp_path/sources: the tests' own source images
                    "allowed_paths": [str(GUEST_DIR), str(tmp_path / SOURCES)],
                    # what Salt's pool_define may use: the tests' pools (the test driver makes no directory)
                    "pool_paths": [str(tmp_path), TEST_POOLS, TEST_DRIVER_POOL],
                    "pool_sources": {"devices": ["/dev/sd[x-z]"], "names": ["cvg", "cp2"], "hosts": ["example.com"]},
                },
                **config,
            ),
        }
    )
    opts.update(opts_extra or {})
    key = (opts["id"], repr(sorted((opts_extra or {}).items())))
    if key not in _GRAINS:
        _GRAINS[key] = salt.loader.grains(opts)
    opts["grains"] = copy.deepcopy(_GRAINS[key])
    utils = salt.loader.utils(opts)
    return salt.loader.minion_mods(opts, utils=utils)


def load_states(mods, test=False):
    """This repo's _states through Salt's state loader, over the execution modules ``mods``."""
    import salt.loader

    opts = dict(mods.opts, test=test, states_dirs=[str(ROOT / "_states")])
    return salt.loader.states(opts, mods, salt.loader.utils(opts), {})


def make_runners(tmp_path):
    """This repo's _runners through Salt's runner loader, without a salt-master (hypervisor ``hyper1``
    configured; nothing answers): what a runner refuses before it publishes anything."""
    import salt.config
    import salt.loader

    opts = salt.config.master_config(None)
    opts.update(
        {
            "runner_dirs": [str(ROOT / "_runners")],
            "virt": {"hypervisors": ["hyper1"]},
            "sock_dir": str(tmp_path / "sock"),  # no master: progress events go nowhere
            "pki_dir": str(tmp_path / "pki"),
            "cachedir": str(tmp_path / "cache"),
        }
    )
    return new_job(salt.loader.runner(opts, utils=salt.loader.utils(opts)))


def new_job(runners):
    """``runners`` as a new runner job's process has them: no module holds a ``__user__`` yet. Salt keeps a loaded
    module in ``sys.modules`` across loader instances, so what one test injected would otherwise stay (and a test
    that puts a user into another file of the ``virt`` runner would see two users). Only the runner_dirs' modules
    (this repo's, where the tests put users) are looked at, in ``sys.modules``: iterating the loader loaded every
    runner module Salt has, a fifth of the runner tests' time."""
    dirs = set(runners.opts.get("runner_dirs") or [])  # Salt names a module's __file__ from its runner_dirs entry
    for mod in list(sys.modules.values()):
        if "__user__" in vars(mod) and os.path.dirname(getattr(mod, "__file__", None) or "") in dirs:
            del vars(mod)["__user__"]
    return runners


def refresh_pillar(mods, pillar):
    """Give the minion modules ``mods`` the compiled pillar ``pillar`` as a minion's ``saltutil.refresh_pillar``
    does (salt/minion.py ``pillar_refresh``: its opts and the ``__pillar__`` of its loader and inner loader;
    resource loaders built before keep their copy)."""
    mods.opts["pillar"] = pillar
    mods.pack["__pillar__"] = pillar
    inner = getattr(mods, "_dunder_salt", None)
    if inner is not None and hasattr(inner, "pack"):
        inner.pack["__pillar__"] = pillar


def make_resource_loaders(tmp_path, uri, resource_type="virt_vm", pillar=None, **config):
    """Salt's two resource loaders over this repo's ``_resources`` (what ``salt/minion.py`` ``gen_modules``
    builds for a managed type): the type's connection module (``<type>.discover``, ``.grains``, ``.ping``) and
    its deny-by-default execution modules (``test.ping``, ``grains.items``). ``_resources`` is linked in as
    ``<extension_modules>/resources``, where ``saltutil.sync_resources`` writes it: Salt looks for a type's
    ``modules/`` there, not under a ``module_dirs`` entry's ``_resources``. ``pillar``: the minion's compiled
    pillar (the master's, in a daemon). Returns ``(funcs, modules)``; ``funcs.pack["__salt__"]`` is the
    minion's own modules."""
    import salt.loader

    mods = make_minion_mods(tmp_path, uri, **config)
    if pillar is not None:
        refresh_pillar(mods, pillar)
    opts = dict(mods.opts, extension_modules=str(tmp_path / "extmods"))
    (tmp_path / "extmods").mkdir(parents=True, exist_ok=True)
    (tmp_path / "extmods" / "resources").symlink_to(ROOT / "_resources")
    utils = salt.loader.utils(opts)
    funcs = salt.loader.resource(opts, functions=mods, utils=utils, context={})
    modules = salt.loader.resource_modules(opts, resource_type, resource_funcs=funcs, utils=utils, context={})
    return funcs, modules
