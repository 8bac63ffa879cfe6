"""Grain ``virt_hypervisor``: True on a minion that can act as a libvirt hypervisor for salt-virt
(libvirt python bindings import, and a libvirt daemon is installed or ``virt:connection:uri`` is set).
The ``libvirt`` ext_pillar hands TLS certificates to these minions by default.

Set ``virt_hypervisor: False`` (or True) in the minion config to decide it yourself.

On a hypervisor it also imports the library's hypervisor side into the minion's main process (see
:func:`_load_library`)."""

import importlib
import logging
import os
import pkgutil
import shutil
import sys
import types
from typing import TYPE_CHECKING

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{grains,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts

log = logging.getLogger(__name__)
DAEMONS = ("libvirtd", "virtqemud")
MASTER_SIDE = ("fleet",)  # layers only the master's runner uses
SEEN = "_imported_from_disk"  # on the saltvirt package: {module file: fsutil.identity} as this process imported it


def virt_hypervisor():
    forced = __opts__.get("virt_hypervisor")
    if forced is not None:
        ours = bool(forced)
    else:
        try:
            import libvirt  # noqa: F401
        except ImportError:
            return {"virt_hypervisor": False}
        configured = bool(((__opts__.get("virt") or {}).get("connection") or {}).get("uri"))
        ours = configured or any(shutil.which(d) or shutil.which(d, path="/usr/sbin:/sbin") for d in DAEMONS)
    if ours and __opts__.get("__cli") == "salt-minion":  # the daemon that forks jobs; not salt-call, salt-run
        _load_library()
    return {"virt_hypervisor": ours}


def _load_library():
    """Import the library's hypervisor side once, in the salt-minion's main process (it computes the grains).
    Salt runs each job in a fork of it (``multiprocessing``, the default) and loads the ``virt``
    execution modules only when a job asks, so without this every job imported ~85 library modules again
    (bench/bench_jobstart.py: +56 ms a job over ``test.ping``; +1 ms with them here). Nothing in them starts a
    thread or opens a connection at import. A module that fails here is left to the job, which reports it.

    The minion computes its grains again on ``saltutil.refresh_modules`` (and so after ``saltutil.sync_all``):
    when a module imported here changed on disk since, the library is dropped from this process and imported
    anew, so the next jobs run the upgraded library, as they did when each job imported it. (What is the
    process's and not a module's, libvirt's event loop, lives on the libvirt module: saltvirt.host.conn.)"""
    if saltvirt is None:
        return
    pkg = sys.modules.get("saltvirt") or saltvirt
    if _changed_on_disk(getattr(pkg, SEEN, {})):
        for name in [m for m in sys.modules if m.partition(".")[0] == "saltvirt"]:
            del sys.modules[name]
        importlib.invalidate_caches()
        pkg = importlib.import_module("saltvirt")
    for layer in pkgutil.iter_modules(pkg.__path__, "saltvirt."):
        if not layer.ispkg or layer.name.removeprefix("saltvirt.") in MASTER_SIDE:
            continue
        try:
            for mod in pkgutil.walk_packages(importlib.import_module(layer.name).__path__, layer.name + "."):
                if not mod.name.endswith(".__main__"):
                    importlib.import_module(mod.name)
        except Exception as exc:  # noqa: BLE001 - a job imports it again and reports what fails
            log.debug("virt_hypervisor: could not import %s ahead of the jobs: %s", layer.name, exc)
    seen = pkg.__dict__.setdefault(SEEN, {})
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path not in seen and getattr(module, "__name__", "").partition(".")[0] == "saltvirt":
            seen[path] = _identity(path)


def _changed_on_disk(seen):
    return any(_identity(path) != was for path, was in seen.items())


def _identity(path):
    from saltvirt.base import fsutil  # here, not at the top: a guest's minion imports no layer of the library

    return fsutil.identity(path)
