"""
Execution module ``virt`` (continued): ``virt.cleanup``, removing what an interrupted ``virt.init``
left on this hypervisor (``saltvirt.vm.cleanup``).
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
    from saltvirt.base import validate as _validate
    from saltvirt.host import conn as _c
    from saltvirt.host import query as _query
    from saltvirt.vm import cleanup as _cleanup

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


def cleanup(name, force=False, fleet_uuids=None, connection=None):
    """
    Remove what an interrupted ``virt.init`` of ``name`` left on this hypervisor: disks recorded in
    ``virt:images/<name>/.salt-virt.json`` with no domain, a domain whose init never finished (its
    init lock ``virt:images/.locks/init-<name>`` is left), and seeding state attached to those disks
    (mounts, loop devices, qemu-storage-daemon FUSE exports, scratch directories). Only what salt-virt
    created for this VM is touched; a complete VM is left alone (``virt.purge`` removes it).

    Disks are judged by the VM uuid their manifest records, never by the name: they stay while a domain
    here has that uuid, and on a ``virt:images`` other hypervisors may share (created by another host, a
    network or cluster filesystem, exported over NFS) unless the master proved that no hypervisor
    defines it: ``salt-run virt.cleanup NAME`` does, passing ``fleet_uuids`` (what every hypervisor
    defines). ``force=True``: you checked that no hypervisor uses them (a domain here with that uuid
    still keeps them). A manifest without a uuid (an older salt-virt) keeps its files unless forced.

    Returns ``{name, interrupted, domain, removed, kept, released, errors}``, and ``refused`` (why the
    disks stay) when they do.

    CLI Example:: salt 'hyper1' virt.cleanup web1
    """
    with _c.salt_connect(__salt__, connection) as conn:
        return _cleanup.cleanup(
            conn,
            name,
            _c.salt_images_dir(__salt__),
            host_id=__opts__.get("id"),
            fleet_uuids=fleet_uuids,
            force=_validate.to_bool(force),
        )


def defined_uuids(connection=None):
    """
    ``{uuid: name}`` of every VM defined or running on this hypervisor: what ``salt-run virt.cleanup``
    and ``virt.purge`` gather from every hypervisor before any leftover disk is deleted.

    CLI Example:: salt 'hyper1' virt.defined_uuids
    """
    with _c.salt_connect(__salt__, connection) as conn:
        return _query.defined_uuids(conn)


def reap_seeding():
    """
    Release seeding whose job is gone (a job killed, the minion restarted mid-``virt.init``): for each
    scratch directory ``salt-virt-seed-*`` in the temporary directory that salt-virt made (a real
    directory of this user, mode 0700, never a symlink) and whose seeding process no longer runs, the
    guest filesystems mounted in it are unmounted, their loop devices and the one on its FUSE export
    detached, the qemu-storage-daemon serving that export stopped, and the directory removed. The
    ``virt_events`` engine runs it when the minion starts. Returns ``{removed, errors, left}``.

    CLI Example:: salt 'hyper1' virt.reap_seeding
    """
    return _cleanup.reap_seeding()


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
