"""
Execution module ``virt`` (continued): the hypervisor side of host-failure recovery
(``saltvirt.host.hostrecord``). ``salt-run virt.record`` / ``virt.recover`` (``saltvirt.fleet.recovery``) call these,
and ``salt-run virt.remediate`` (``saltvirt.fleet.remediate``) ``virt.vm_condition``.
Salt's loader merges every file whose ``__virtualname__`` is ``virt`` into one ``virt`` module.
"""

import os
import sys
import types
from typing import TYPE_CHECKING

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
    from saltvirt.base import validate
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.host import hostrecord as _hr
    from saltvirt.host import query as _query
    from saltvirt.vm import migrate as _migrate
    from saltvirt.vm import migrate_tls as _migrate_tls

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions

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


def _allowed_paths():
    return validate.configured_allowed_paths(__opts__)  # minion config only


def recovery_record(connection=None):
    """
    What the master keeps about this hypervisor for ``salt-run virt.recover``: every VM's inactive
    definition (no passwords), state and disks, and the storage marker of each directory holding them
    (``<root>/.salt-virt-storage``, written once).

    CLI Example:: salt 'hyper1' virt.recovery_record
    """
    with _c.salt_connect(__salt__, connection) as conn:
        return _hr.record(conn, _c.salt_images_dir(__salt__), _allowed_paths())


def recovery_probe(host, uri=None, wait=10):
    """
    Can this hypervisor reach the libvirtd of peer ``host``? ``uri``: the URI to try (the master's
    ``virt:recovery:probe_uri``: ``qemu+tls``/``qemu+tcp`` to ``/system`` only; a ``qemu+tls`` one gets this
    host's ``virt:migration:pkipath``); default this minion's own
    ``virt:recovery:probe_uri`` (minion config, ``{host}`` replaced: any URI, e.g. with ``?socket=``),
    else the URI a migration to ``host`` would use (TLS with this host's client certificate,
    ``virt:migration`` settings). Returns ``{uri, reachable, down, error}``.

    CLI Example:: salt 'hyper2' virt.recovery_probe hyper1
    """
    template = _c.salt_config(__salt__)("virt:recovery:probe_uri", None)  # this minion's operator config
    mig = _migrate.settings(_c.salt_config(__salt__))
    if uri:
        _c.peer_uri(uri, "virt.recovery_probe uri")
        uri = _migrate_tls.operator_uri(uri, mig["pkipath"])  # a qemu+tls probe with this host's client files
    elif template:
        validate.host_name(host, "host (a hypervisor's minion id)")
        uri = str(template).replace("{host}", host)
    else:
        target = mig["hosts"].get(host, host)
        transport = mig["transport"] or "tls"
        uri = _migrate.destination_uri(target, False, transport, mig["pkipath"], mig["uri_template"])
    return _hr.probe(uri, float(wait))


def recovery_check(vms, storage):
    """
    For ``salt-run virt.recover``: why this hypervisor could not run each of ``vms`` (``{name: xml}``,
    a down host's recorded definitions; ``storage``: its storage markers): ``{name: [reasons]}``,
    an empty list where it could. Reads files only, changes nothing.

    CLI Example:: salt 'hyper2' virt.recovery_check '{web1: "<domain...>"}' '{...}'
    """
    return _hr.check_all(vms, storage, _c.salt_images_dir(__salt__), _allowed_paths())


def recovery_restart(name, xml, storage, start=True, connection=None):
    """
    Define VM ``name`` from a down hypervisor's recorded ``xml`` here and start it: only when every
    disk lies inside this host's ``virt:images``/``virt:allowed_paths`` and on storage shared with
    the down host (``storage``: its recorded markers). On failure the definition is removed again.

    CLI Example:: salt 'hyper2' virt.recovery_restart web1 '<domain...>' '{...}'
    """
    with _c.salt_connect(__salt__, connection) as conn:
        return _hr.restart(conn, name, xml, storage, _c.salt_images_dir(__salt__), _allowed_paths(), start=_bool(start))


def recovery_where(name, uuid=None, connection=None):
    """
    For ``salt-run virt.recover``'s last look before it starts a VM anywhere: the domains on this
    hypervisor named ``name`` or with UUID ``uuid``, defined or running: ``[{name, uuid, state, autostart}]``.

    CLI Example:: salt '*' virt.recovery_where web1 uuid=3f6ba1d4-1111-4c1b-9a40-0123456789ab
    """
    with _c.salt_connect(__salt__, connection) as conn:
        return _hr.where(conn, name, uuid or None)


def recovery_disarm(names, connection=None):
    """
    Turn autostart off for those of ``names`` (VM names) defined on this hypervisor: ``salt-run
    virt.reconcile`` runs it first on a host back from fencing, whose VMs run elsewhere now. Returns
    ``{name: whether autostart was on}``.

    CLI Example:: salt 'hyper1' virt.recovery_disarm '[web1, db1]'
    """
    if isinstance(names, str):
        names = [names]
    with _c.salt_connect(__salt__, connection) as conn:
        return _hr.disarm(conn, list(names))


def vm_condition(name, connection=None):
    """
    One VM's condition as libvirt reports it here, for the master's remediation (``salt-run virt.remediate``,
    which believes this signed answer and never the event that made it ask): ``{name, uuid, state, reason,
    guest_agent, disk_errors}``; ``reason`` is libvirt's reason for the state (``crashed``, ``failed``,
    ``ioerror``, ...).

    CLI Example:: salt 'hyper1' virt.vm_condition web1
    """
    with _c.salt_connect(__salt__, connection) as conn:
        return _query.condition(conn, validate.vm_name(name))


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
