"""
Execution module ``virt`` (continued): moving VMs between hypervisors (``saltvirt.vm.migrate``).

``salt-run virt.migrate`` / ``virt.evacuate`` (``saltvirt.fleet.relocate``) drive these functions on the
source and the target hypervisor. Salt's loader merges every file whose ``__virtualname__`` is
``virt`` into one ``virt`` module.
"""

import logging
import os
import sys
import types
from typing import TYPE_CHECKING, Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

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
    from saltvirt.base.validate import configured_allowed_paths
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.model import compat
    from saltvirt.vm import migrate as _migrate

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions

__virtualname__ = "virt"
log = logging.getLogger(__name__)


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _conn(connection=None):
    return _c.salt_connect(__salt__, connection)


def _images_dir():
    return _c.salt_images_dir(__salt__)


# migrate ------------------------------------------------------------------------------------------
# Moving VMs between hypervisors (saltvirt.vm.migrate). ``salt-run virt.migrate`` / ``virt.evacuate``
# (saltvirt.fleet.relocate) drive the helpers below on the source and the target hypervisor.


def migrate(
    name,
    target,
    live=True,
    tunnel=None,
    copy_storage=None,
    offline=False,
    max_downtime=None,
    max_bandwidth=None,
    target_uri=None,
    transport=None,
    unsafe=False,
    disk_map=None,
    migrate_disks=None,
    verify_backing=None,
    report=False,
    connection=None,
):
    """
    Move a VM from this hypervisor to ``target``: live while it runs (its guest keeps running), offline
    (definition only) when it is stopped. Peer to peer: this hypervisor's libvirtd connects to the
    target's itself (for TLS with its own client certificate). Afterwards the VM is defined on the
    target and undefined here. On failure the error says where the VM is (still here).

    target
        the target hypervisor's host name or address (or a name from ``virt:migration:hosts``), or
        a libvirt URI as in Salt >= 3002 (``qemu+tls://hv2/system``, no query: a ``qemu+tls`` URI gets
        ``virt:migration:pkipath`` as ``?pkipath=``, as ``transport=tls`` with a host name does).
        The libvirtd connection is ``qemu+tls://<target>/system`` (port 16514, this host's client
        certificate from ``virt.keys``): refused up front when those files are missing.
        ``transport=tcp`` (or ``virt:migration:transport: tcp``) asks for plaintext
        ``qemu+tcp://<target>/system`` by name: refused unless this minion's config has
        ``virt:migration:allow_cleartext: True``; the result then carries a warning.
        ``target_uri`` gives the whole URI (the same rules as a URI ``target``).
    tunnel
        memory through the TLS libvirtd connection (port 16514) instead of a direct QEMU stream to
        ``tcp://<target>``; default ``virt:tunnel``. libvirt cannot tunnel a disk copy: with
        ``copy_storage`` a configured tunnel gives way to a direct stream (reported). The direct stream
        (memory, and disks over NBD) uses QEMU's own TLS when its certificates are there
        (``virt.keys`` with ``qemu: True``; ``virt:migration:qemu_tls_dir``); without them a live
        migration is refused unless ``virt:migration:allow_cleartext: True`` (then reported).
    copy_storage
        ``all`` / ``inc``: also copy the disks (storage not shared). The target needs disk files of
        the right size and format (``inc``: overlays onto the same backing image) at the paths
        ``disk_map`` names: ``salt-run virt.migrate`` prepares them.
    unsafe
        the target sees the same disk files although libvirt does not recognise the filesystem as
        shared (the runner proves it with a probe file first).
    max_downtime / max_bandwidth
        milliseconds the guest may pause at the switch-over (at most ``virt:migration:max_downtime``,
        which is also the default; neither set: adaptive, 50 ms raised to QEMU's 300 ms once the first
        memory pass did not converge) / MiB/s for the migration stream.
    report
        return the migration's report (source, target, URI, transport, seconds, warnings, ...) instead
        of Salt's ``True`` (``salt-run virt.migrate`` asks for it). Without it, warnings go to the log.

    Settings (minion config only): ``virt:tunnel``, ``virt:migration: {transport, pkipath,
    uri_template, qemu_tls, qemu_tls_dir, allow_cleartext, hosts, stall_timeout, converge,
    converge_timeout, max_downtime}`` (see ``saltvirt.vm.migrate``, ``saltvirt.vm.migrate_tls`` and
    ``saltvirt.vm.migrate_watch``). ``stall_timeout`` (default 60 s): a migration that moves no data for
    that long (the target unreachable) is aborted and reported; the VM keeps running here.
    ``converge`` (``auto``: QEMU's auto-converge, the default; ``postcopy``; ``none``) and
    ``converge_timeout`` (default 300 s): a guest whose memory has not converged after that long of
    copying it is switched to post-copy (``postcopy``) or the migration is aborted (reported either way).

    CLI Example:

    .. code-block:: bash

        salt 'hyper1' virt.migrate web1 hv2
        salt 'hyper1' virt.migrate web1 qemu+tls://hv2/system
        salt 'hyper1' virt.migrate web1 hv2 tunnel=True max_downtime=500
        salt 'hyper1' virt.migrate db1 hv2.example.com copy_storage=all
    """
    target, target_uri = compat.migration_target(target, target_uri)
    if target_uri:
        _c.peer_uri(target_uri, "virt.migrate target URI")
    opts = _migrate.settings(_c.salt_config(__salt__))
    note = None
    if tunnel is None:
        tunnel = opts["tunnel"]
        if tunnel and copy_storage:
            tunnel = False
            note = "virt:tunnel ignored: libvirt cannot tunnel a disk copy, the data went over a direct stream"
    with _conn(connection) as conn:
        ret = _migrate.migrate(
            conn,
            name,
            opts["hosts"].get(target, target),
            live=_bool(live),
            tunnel=_bool(tunnel),
            copy_storage=copy_storage or None,
            offline=_bool(offline),
            max_downtime=max_downtime,
            max_bandwidth=max_bandwidth,
            target_uri=target_uri,
            transport=transport or opts["transport"],
            pkipath=opts["pkipath"],
            uri_template=opts["uri_template"],
            qemu_tls=opts["qemu_tls"],
            qemu_tls_dir=opts["qemu_tls_dir"],
            allow_cleartext=opts["allow_cleartext"],
            unsafe=_bool(unsafe),
            disk_map=disk_map,
            migrate_disks=migrate_disks,
            verify_backing=verify_backing,
            stall_timeout=opts["stall_timeout"],
            converge=opts["converge"],
            converge_timeout=opts["converge_timeout"],
            max_downtime_cap=opts["max_downtime"],
        )
    if note:
        ret["note"] = note
    if _bool(report):
        return ret
    for warning in [*ret.get("warnings", []), *([note] if note else [])]:
        log.warning("virt.migrate %s: %s", name, warning)
    return True  # Salt's return


def migrate_source_info(name, probe=True, connection=None):
    """
    For ``salt-run virt.migrate``, on the source: the VM's disks (size, format, backing image) and,
    with ``probe``, probe files in its disk directories that only a target sharing that storage sees
    (``virt.migrate_abort_cleanup`` removes them).

    CLI Example:: salt 'hyper1' virt.migrate_source_info web1
    """
    with _conn(connection) as conn:
        return _migrate.source_info(conn, name, _images_dir(), probe=_bool(probe))


def migrate_prepare(name, source, copy_storage=None, connection=None):
    """
    For ``salt-run virt.migrate``, on the target: create disk files for the VM described by ``source``
    (``virt.migrate_source_info`` on the source) where it does not share the source's storage, below
    this hypervisor's ``virt:images``: blank images of the same size and format, or qcow2 overlays onto
    this host's copy of the same backing image. Checks room first and never overwrites a file.

    CLI Example:: salt 'hyper2' virt.migrate_prepare web1 '{...}'
    """
    if not isinstance(source, dict) or source.get("name") != name:
        raise SaltInvocationError(f"source must be virt.migrate_source_info's answer for {name!r}")
    with _conn(connection) as conn:
        ret = _migrate.prepare(
            conn,
            source,
            _images_dir(),
            copy_storage=copy_storage or None,
            allowed_paths=configured_allowed_paths(__opts__),  # minion config only
        )
    ret["address"] = (
        _migrate.settings(_c.salt_config(__salt__))["address"] or ret["host"]
    )  # what the source's libvirtd dials
    return ret


def migrate_finish(name, connection=None):
    """
    For ``salt-run virt.migrate``, on the target after the move: the VM as defined here (state,
    disks); the files ``virt.migrate_prepare`` created now belong to it.

    CLI Example:: salt 'hyper2' virt.migrate_finish web1
    """
    with _conn(connection) as conn:
        return _migrate.finish(conn, name, _images_dir())


def migrate_abort_cleanup(name, paths, connection=None):
    """
    After a failed migration: remove the files ``virt.migrate_prepare`` created for ``name`` on this
    host (as its record here lists them) or the probe files ``virt.migrate_source_info`` left. Files
    it did not create, or that a VM here uses, are kept and listed with the reason.

    CLI Example:: salt 'hyper2' virt.migrate_abort_cleanup web1 '[/srv/salt-images/web1/system.qcow2]'
    """
    with _conn(connection) as conn:
        return _migrate.abort_cleanup(conn, name, paths, _images_dir())


def migrate_start_postcopy(vm_, connection=None):
    """
    Switch a running live migration of ``vm_`` to post-copy (Salt's ``virt.migrate_start_postcopy``):
    the VM runs on the target from now on and fetches the remaining memory from here.

    CLI Example:: salt 'hyper1' virt.migrate_start_postcopy web1
    """
    with _conn(connection) as conn:
        dom = _c.get_domain(conn, vm_)
        with _c.lv_errors(f"switch the migration of VM {vm_!r} to post-copy"):
            dom.migrateStartPostCopy(0)
    return True


def _salt_disk(target, data):
    """One entry of Salt's ``virt.get_disks`` (or ours) -> a disk of ``virt.migrate_source_info``."""
    if not isinstance(data, dict) or not data.get("file"):
        raise SaltInvocationError(
            f"seed_non_shared_migrate: disk {target!r} needs its 'file' (as virt.get_disks gives)"
        )
    fmt = data.get("file format") or data.get("format")
    size: Any = data.get("virtual size", data.get("virtual_size"))  # as the caller gave it: int() judges it
    if isinstance(size, str) and "(" in size:  # Salt: "8.0G (8589934592 bytes)"
        size = size.split("(", 1)[1].split()[0]
    try:
        size = int(size)
    except (TypeError, ValueError):
        raise SaltInvocationError(f"seed_non_shared_migrate: disk {target!r} has no virtual size") from None
    return {
        "target": target,
        "path": data["file"],
        "type": "file",
        "readonly": False,
        "format": fmt,
        "virtual_size": size,
        "allocation": 0,
        "chain_allocation": 0,
        "backing": None,
    }


def seed_non_shared_migrate(disks, force=False, name=None, connection=None):
    """
    Salt's ``virt.seed_non_shared_migrate`` on the migration target: create blank disk files of the
    size and format the source's ``virt.get_disks`` lists, so a migration with ``copy_storage=all``
    can fill them. A compatible face over ``virt.migrate_prepare``: the files must lie inside this
    host's ``virt:images`` (or ``virt:allowed_paths``), room is checked first and an existing file is
    never overwritten (``force=True`` cannot change that: remove it yourself). ``name`` defaults to the
    VM directory the files are in (``virt:images/<name>/``). Returns True.

    CLI Example:: salt 'hyper2' virt.seed_non_shared_migrate "$(salt hyper1 virt.get_disks web1 --out json)"
    """
    if not isinstance(disks, dict) or not disks:
        raise SaltInvocationError("seed_non_shared_migrate: disks must be virt.get_disks' answer {target: {...}}")
    entries = [_salt_disk(t, d) for t, d in sorted(disks.items())]
    existing = [d["path"] for d in entries if os.path.exists(d["path"])]
    if existing:
        forced = " (force=True does not change that)" if _bool(force) else ""
        raise CommandExecutionError(
            f"seed_non_shared_migrate: {', '.join(existing)} exist(s) already; salt-virt never overwrites a disk "
            f"file{forced}: remove it or migrate onto shared storage"
        )
    if not name:
        dirs = {os.path.basename(os.path.dirname(d["path"])) for d in entries}
        if len(dirs) != 1:
            raise SaltInvocationError("seed_non_shared_migrate: give name= (the disks are not in one VM directory)")
        name = dirs.pop()
    source = {"name": name, "uuid": "", "disks": entries}
    with _conn(connection) as conn:
        _migrate.prepare(
            conn,
            source,
            _images_dir(),
            copy_storage="all",
            allowed_paths=configured_allowed_paths(__opts__),
        )
    return True


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
