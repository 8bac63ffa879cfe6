"""
Execution module ``virt`` (continued): storage pools and volumes (``saltvirt.netpool``).
"""

import os
import sys


try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{modules,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt import conn as _c
    from saltvirt import netpool as _np
    from saltvirt.validate import to_bool as _bool

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, "virt: the saltvirt library is missing (run saltutil.sync_all, or pip install salt-virt)"
    if _c.libvirt is None:
        return False, "virt: the libvirt python bindings are not installed (pip install libvirt-python)"
    return __virtualname__


def _conn(connection=None):
    return _c.salt_connect(__salt__, connection)


def pool_define(name, ptype="dir", target=None, autostart=False, start=False, build=True, connection=None):
    """Define a storage pool (``ptype=dir`` with ``target`` directory; ``build`` creates it on start).

    CLI Example:: salt 'hyper1' virt.pool_define images target=/srv/salt-images start=True autostart=True
    """
    np = _np
    spec = np.pool_spec(name, ptype, target)
    with _conn(connection) as conn:
        np.define(conn, "pool", spec)
        if _bool(autostart):
            np.set_autostart(conn, "pool", name, True)
        if _bool(start):
            np.start(conn, "pool", name, build=_bool(build))
        return np.info(conn, "pool", name)[name]


def pool_start(name, build=True, connection=None):
    """Start a defined pool (``build``: create its directory first).

    CLI Example:: salt 'hyper1' virt.pool_start images
    """
    with _conn(connection) as conn:
        return {"name": name, "started": _np.start(conn, "pool", name, build=_bool(build))}


def pool_stop(name, connection=None):
    """Stop a running pool (its files stay).

    CLI Example:: salt 'hyper1' virt.pool_stop images
    """
    with _conn(connection) as conn:
        return {"name": name, "stopped": _np.stop(conn, "pool", name)}


def pool_undefine(name, connection=None):
    """Stop and remove a pool definition (its directory and files stay).

    CLI Example:: salt 'hyper1' virt.pool_undefine images
    """
    with _conn(connection) as conn:
        return {"name": name, "undefined": _np.undefine(conn, "pool", name)}


def pool_info(name=None, connection=None):
    """``{name: {type, target, active, autostart, capacity, allocation, available}}``.

    CLI Example:: salt 'hyper1' virt.pool_info
    """
    with _conn(connection) as conn:
        return _np.info(conn, "pool", name)


def list_pools(connection=None):
    """Names of all storage pools.

    CLI Example:: salt 'hyper1' virt.list_pools
    """
    return sorted(pool_info(connection=connection))


def pool_list_volumes(name, connection=None):
    """Volume names in a running pool.

    CLI Example:: salt 'hyper1' virt.pool_list_volumes images
    """
    with _conn(connection) as conn:
        return _np.list_volumes(conn, name)
