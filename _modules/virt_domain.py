"""
Execution module ``virt`` (continued): Salt's remaining per-VM functions — ``create_xml_str`` /
``create_xml_path`` (transient VMs), ``ctrl_alt_del``, ``get_loader`` — and the statistics
``vm_cputime``, ``vm_netstats``, ``vm_diskstats`` (``saltvirt.host.stats``), and ``console``: a one-time
ticket to a running VM's VNC websocket for the web console (``saltvirt.host.vncticket``).
"""

import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import CommandExecutionError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
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
    from saltvirt.base import install as _install
    from saltvirt.base import operators as _operators
    from saltvirt.host import conn as _c
    from saltvirt.host import lifecycle as _lifecycle
    from saltvirt.host import stats as _stats
    from saltvirt.host import vncticket as _vncticket
    from saltvirt.xml.domain import boot as _boot

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltGrains, SaltOpts

    __salt__: SaltFunctions
    __opts__: SaltOpts
    __grains__: SaltGrains

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _conn(connection=None, kwargs=None, fun="virt"):
    return _c.salt_connect_compat(__salt__, connection, kwargs, fun)


def create_xml_str(xml, connection=None, **kwargs):
    """
    Start a transient VM (gone when it stops) from a libvirt domain XML string. Returns True.

    CLI Example:: salt 'hyper1' virt.create_xml_str '<domain type="kvm">...</domain>'
    """
    with _conn(connection, kwargs, "virt.create_xml_str") as conn:
        return bool(_lifecycle.create_xml_str(conn, xml))


def create_xml_path(path, connection=None, **kwargs):
    """
    Start a transient VM from a domain XML file on the minion. Returns True.

    CLI Example:: salt 'hyper1' virt.create_xml_path /tmp/scratch.xml
    """
    try:
        with open(path, encoding="utf-8") as fh:
            xml = fh.read()
    except OSError as exc:
        raise CommandExecutionError(f"virt.create_xml_path: cannot read {path}: {exc.strerror}") from None
    return create_xml_str(xml, connection, **kwargs)


def ctrl_alt_del(vm_, connection=None, **kwargs):
    """
    Send Ctrl+Alt+Del to a running VM (a guest that listens reboots). Returns True.

    CLI Example:: salt 'hyper1' virt.ctrl_alt_del web1
    """
    with _conn(connection, kwargs, "virt.ctrl_alt_del") as conn:
        return bool(_lifecycle.ctrl_alt_del(conn, vm_))


def get_loader(vm_, connection=None, **kwargs):
    """
    The VM's firmware loader: ``{path, readonly, type, secure}`` of ``<os><loader>``, ``{path: "None"}``
    for the default BIOS (Salt's shape).

    CLI Example:: salt 'hyper1' virt.get_loader web1
    """
    with _conn(connection, kwargs, "virt.get_loader") as conn:
        dom = _c.get_domain(conn, vm_)
        with _c.lv_errors(f"read VM {vm_!r}"):
            return _boot.loader(dom.XMLDesc(0))


def vm_cputime(vm_=None, connection=None, **kwargs):
    """
    CPU time of one VM or all: ``{vm: {cputime: ns, cputime_percent, vcpus}}``.

    CLI Example:: salt 'hyper1' virt.vm_cputime
    """
    with _conn(connection, kwargs, "virt.vm_cputime") as conn:
        return _stats.cputime(conn, vm_)


def vm_netstats(vm_=None, connection=None, **kwargs):
    """
    Network counters of one VM or all, summed over its NICs (``rx_bytes``, ``rx_packets``,
    ``rx_errs``, ``rx_drop``, ``tx_*``), plus ``devices`` per NIC.

    CLI Example:: salt 'hyper1' virt.vm_netstats web1
    """
    with _conn(connection, kwargs, "virt.vm_netstats") as conn:
        return _stats.netstats(conn, vm_)


def vm_diskstats(vm_=None, connection=None, **kwargs):
    """
    Disk counters of one running VM or all running ones, summed over its disks (``rd_req``,
    ``rd_bytes``, ``wr_req``, ``wr_bytes``, ``errs``), plus ``devices`` per disk.

    CLI Example:: salt 'hyper1' virt.vm_diskstats
    """
    with _conn(connection, kwargs, "virt.vm_diskstats") as conn:
        return _stats.diskstats(conn, vm_)


def vm_stats_sample(connection=None):
    """
    One sample of every running VM's counters (what ``salt-run virt.query rates=True`` takes twice).

    CLI Example:: salt 'hyper1' virt.vm_stats_sample
    """
    with _conn(connection) as conn:
        return _stats.sample(conn)


def console(name, pubkey, connection=None, **kwargs):
    """
    A one-time ticket to running VM ``name``'s VNC console over websocket, for the holder of ``pubkey`` (the
    browser's ephemeral RSA-OAEP public key, SPKI base64): ``{vm, host, port, tls, valid_until, password}``,
    the password (fresh, random, set on the live console until ``valid_until``) encrypted to ``pubkey``. The
    ``virt_console`` engine spends it at its first use. Where the websocket is reached and whether it is TLS:
    ``virt:console`` in the minion config (docs/topics/console.md). Tenants ask through ``salt-run
    virt.console``.

    CLI Example:: salt 'hyper1' virt.console web1 pubkey=MIIBIjANBgkqh...
    """
    conf = _vncticket.settings(_c.salt_config(__salt__), __grains__)
    alive = _vncticket.heartbeat_path(__opts__["cachedir"])
    with _conn(connection, kwargs, "virt.console") as conn:
        return _vncticket.issue(conn, name, pubkey, conf, alive)


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
