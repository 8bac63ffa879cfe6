"""
Execution module ``virt`` (continued): backups of one VM into the operator's backup directory
(``saltvirt.vm.backup``, ``saltvirt.vm.restore``): ``backup``, ``backup_list``, ``backup_usage``,
``backup_delete``, ``backup_prune``, ``restore``.

Minion config only (an operator setting: never read from pillar or grains; callers never pass a path)::

    virt:
      backup:
        dir: /srv/salt-backups      # must exist; per-VM subdirectories are made below it
        timeout: 21600              # seconds one backup job may run (default 6 h)
        key_file: /etc/salt/pki/minion/salt-virt-backups.key   # signs the manifests (made there on first use
                                                               # if unset; the same file on every hypervisor
                                                               # sharing the directory)
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
    from saltvirt.base import config as _config
    from saltvirt.base import install as _install
    from saltvirt.base import operators as _operators
    from saltvirt.base import switches
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.vm import backup as _backup
    from saltvirt.vm import backupstore as _store
    from saltvirt.vm import restore as _restore

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


def _conn(connection=None, kwargs=None):
    return _c.salt_connect_compat(__salt__, connection, kwargs)


def _settings():
    """``virt:backup`` from the minion config only: pillar and grains are written by callers and tenants."""
    conf = _config.virt_conf(__opts__).get("backup") or {}
    return conf if isinstance(conf, dict) else {}


def _root():
    return _store.root_dir(_settings().get("dir"))


def _key():
    """The key backup manifests are signed with (``virt:backup:key_file``, or made in the minion's pki_dir)."""
    return _store.manifest_key(_settings().get("key_file"), __opts__["pki_dir"])


def backup(name, disks=None, incremental=False, target=None, connection=None, **kwargs):
    """
    Back up VM ``name`` into ``<virt:backup:dir>/[<target>/]<name>/<uuid>/``: live (libvirt's backup API) when it
    runs, an offline copy when it is stopped. The first backup is full; ``incremental=True`` copies only
    what changed since the last backup (a full one is made, and ``note`` says why, when it cannot).
    ``disks``: target devs (``vda,vdb``), default every writable file disk. ``target``: a subdirectory
    name under the backup directory (a name, never a path). The result holds the backup's id, type,
    chain, size, duration, checksums, ``consistency`` (guest agent freeze, or crash-consistent) and
    ``fs_freeze`` (how many filesystems the guest agent froze and thawed; None without a freeze). A running
    VM is read in pull mode (fleecing into a scratch file beside the backup; ``virt:backup:mode: push``: QEMU
    writes the file).

    CLI Example::

        salt 'hyper1' virt.backup web1
        salt 'hyper1' virt.backup web1 incremental=True
    """
    root, timeout, key = _backup.configured(__opts__)
    with _conn(connection, kwargs) as conn:
        mode, depth = _backup.configured_mode(__opts__), _backup.configured_depth(__opts__)
        return _backup.backup(
            conn, root, name, disks, _bool(incremental), target, timeout=timeout, key=key, mode=mode, depth=depth
        )


def backup_list(name, target=None):
    """
    The backups of every VM named ``name``: ``{vm, dir, backups: [{id, uuid, type, parent, chain, finished,
    size, ...}], broken: {id: why}, incomplete: [ids of interrupted backups]}``, oldest first. Works without
    the VM (a purged VM's backups, a backup directory another hypervisor wrote).

    CLI Example:: salt 'hyper1' virt.backup_list web1
    """
    return _backup.listing(_root(), name, target, key=_key())


def backup_usage():
    """
    What every valid backup in the backup directory takes: ``{"<uuid>/<id>": {vm, tenant, size}}`` (the
    tenant recorded in the backup's domain XML; size in bytes). ``salt-run virt.backup`` counts it against
    a tenant's ``backup_mib`` quota.

    CLI Example:: salt 'hyper1' virt.backup_usage
    """
    return _backup.usage(_root(), key=_key())


def backup_delete(name, id, target=None, test=False):
    """
    Delete backup ``id`` of VM ``name``; refused while another backup builds on it (delete those first).

    CLI Example:: salt 'hyper1' virt.backup_delete web1 20260101T020000Z
    """
    return _backup.delete(_root(), name, id, target, test=_bool(test), key=_key())


def backup_prune(name, keep=None, keep_daily=None, keep_weekly=None, target=None, test=False):
    """
    Apply a retention policy to the backups of VM ``name``: keep the ``keep`` newest, the newest of each
    of the last ``keep_daily`` days and ``keep_weekly`` weeks, and every backup one of those builds on.
    Returns ``{kept, pruned, refused}``; ``test=True`` only says what would go.

    CLI Example:: salt 'hyper1' virt.backup_prune web1 keep_daily=7 keep_weekly=4
    """
    return _backup.prune(_root(), name, target, keep, keep_daily, keep_weekly, test=_bool(test), key=_key())


def restore(name, id, as_name=None, target=None, force=False, start=False, connection=None, **kwargs):
    """
    Restore backup ``id`` of VM ``name``: verify every file of its chain, rebuild each disk into a new
    qcow2 file under ``virt:images``, define the VM from the XML recorded at backup time. In place
    only when the VM is stopped or gone (``force=True`` powers a running one off); a disk the backup does
    not have is left in place, detached (``detached`` in the result). ``as_name=NEW`` restores beside it
    (new name, uuid and MAC addresses). ``as=NEW`` is accepted too. ``start=True`` starts it.

    CLI Example::

        salt 'hyper1' virt.restore web1 20260101T020000Z
        salt 'hyper1' virt.restore web1 20260101T020000Z as_name=web1-copy start=True
    """
    as_name = as_name or kwargs.pop("as", None)
    images_dir = _c.salt_images_dir(__salt__)
    root = _root()
    with _conn(connection, kwargs) as conn:
        return _restore.restore(
            conn,
            root,
            images_dir,
            name,
            id,
            as_name,
            target,
            force=_bool(force),
            start=_bool(start),
            key=_key(),
            settings=switches.operator_settings(__opts__),
        )


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
