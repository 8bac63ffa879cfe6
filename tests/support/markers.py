"""The ``libvirtd`` / ``salt`` markers of a test, derived from the fixtures it uses (tests/conftest.py adds
them at collection), so ``-m "not salt"`` never starts salt daemons and ``-m "not libvirtd"`` no libvirtd.

A test is marked when its fixture closure (what pytest computed) holds one of the shared fixtures that start
them, or when its own code or one of its fixtures' builds a lab by hand (``lab.Fabric``/``lab.Hypervisor``,
``start_minion``, a salt-factories daemon)."""

import types

# fixtures (tests/conftest.py, pytest-salt-factories) that start a real namespaced libvirtd / salt daemons
LIBVIRTD_FIXTURES = frozenset({"fabric", "hv1", "virt_hv"})
SALT_FIXTURES = frozenset({"salt_factories", "salt_master", "hyper1", "salt_cli", "salt_run_cli"})
# names whose use in a fixture or test starts them by hand (tests/support/lab.py, saltd.py, salt-factories)
LIBVIRTD_CALLS = frozenset({"Fabric", "Hypervisor"})
SALT_CALLS = frozenset({"start_minion", "started_minions", "salt_master_daemon", "salt_minion_daemon"})


def _names(code):
    """Every global/attribute name a code object (and the functions defined in it) refers to."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def daemon_markers(fixturenames, functions=()):
    """``["libvirtd", "salt"]`` or a part of it, for a test using ``fixturenames`` (their closure) whose own
    function and fixture functions are ``functions``."""
    used = set(fixturenames)
    for func in functions:
        code = getattr(func, "__code__", None)
        used |= {"hv1"} if code and _names(code) & LIBVIRTD_CALLS else set()
        used |= {"salt_master"} if code and _names(code) & SALT_CALLS else set()
    return [m for m, fixtures in (("libvirtd", LIBVIRTD_FIXTURES), ("salt", SALT_FIXTURES)) if used & fixtures]


def item_markers(item):
    """:func:`daemon_markers` of a collected pytest item."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    functions = [getattr(item, "function", None), *(d[-1].func for d in defs if d)]
    return daemon_markers(getattr(item, "fixturenames", ()), [f for f in functions if f is not None])
