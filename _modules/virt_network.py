"""
Execution module ``virt`` (continued): virtual networks (``saltvirt.netpool``).
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


def network_define(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    autostart=False,
    start=False,
    connection=None,
):
    """
    Define a virtual network (``forward``: nat, route, open, bridge (onto an existing ``bridge``) or
    none; ``ip`` as ADDRESS/PREFIX or ADDRESS with ``netmask``, with an optional DHCP range).

    CLI Example::

        salt 'hyper1' virt.network_define lab forward=none ip=10.50.0.1/24 dhcp_start=10.50.0.10 dhcp_end=10.50.0.99
    """
    np = _np
    spec = np.network_spec(name, bridge, forward, ip, dhcp_start, dhcp_end, netmask=netmask)
    with _conn(connection) as conn:
        np.define(conn, "network", spec)
        if _bool(autostart):
            np.set_autostart(conn, "network", name, True)
        if _bool(start):
            np.start(conn, "network", name)
        return np.info(conn, "network", name)[name]


def network_start(name, connection=None):
    """Start a defined network.

    CLI Example:: salt 'hyper1' virt.network_start isolated
    """
    with _conn(connection) as conn:
        return {"name": name, "started": _np.start(conn, "network", name)}


def network_stop(name, connection=None):
    """Stop a running network.

    CLI Example:: salt 'hyper1' virt.network_stop isolated
    """
    with _conn(connection) as conn:
        return {"name": name, "stopped": _np.stop(conn, "network", name)}


def network_undefine(name, connection=None):
    """Stop and remove a network definition.

    CLI Example:: salt 'hyper1' virt.network_undefine isolated
    """
    with _conn(connection) as conn:
        return {"name": name, "undefined": _np.undefine(conn, "network", name)}


def network_info(name=None, connection=None):
    """``{name: {bridge, forward, ip, dhcp, active, autostart}}`` of one network or all.

    CLI Example:: salt 'hyper1' virt.network_info
    """
    with _conn(connection) as conn:
        return _np.info(conn, "network", name)


def list_networks(connection=None):
    """Names of all virtual networks.

    CLI Example:: salt 'hyper1' virt.list_networks
    """
    return sorted(network_info(connection=connection))
