"""
States ``virt`` (continued): storage pools and volumes (``pool_defined``, ``pool_running``,
``pool_deleted``, ``volume_defined``). The logic lives in ``saltvirt.storage.poolcalls`` / ``saltvirt.xml.poolxml``.
"""

import os
import sys
import types
from typing import TYPE_CHECKING

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{states,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from salt.exceptions import CommandExecutionError, SaltInvocationError

    from saltvirt.base import switches, validate
    from saltvirt.host import conn as _c
    from saltvirt.model import poolargs as _pa
    from saltvirt.storage import poolcalls as _pc
    from saltvirt.xml import poolxml as _px

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt states: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    return __virtualname__


def _ret(name, **kw):
    return dict({"name": name, "result": True, "changes": {}, "comment": ""}, **kw)


def _limits():
    """The operator's limits on what a state may define (minion config only): ``saltvirt.storage.poollimits``."""
    return {"settings": switches.operator_settings(__opts__), "images_dir": _c.salt_images_dir(__salt__)}


def _no_password_login(username, password):
    validate.no_credentials(username, password)


def _pool_spec(name, ptype, target, permissions, source):
    """The one pool spec from the states' arguments (Salt's ``source`` mapping: saltvirt.model.poolargs)."""
    return _px.pool_spec(
        name,
        ptype,
        target,
        permissions=permissions,
        require=False,  # an existing pool keeps what is not declared: checked in storage.poolcalls.ensure_pool
        **_pa.from_source(source),
    )


def _pool_state(name, ptype, target, permissions, source, transient, autostart, run, connection, username, password):
    ret = _ret(name)
    try:
        _no_password_login(username, password)
        spec = _pool_spec(name, ptype, target, permissions, source)
        with _c.salt_connect(__salt__, connection) as conn:
            done = _pc.ensure_pool(
                conn, spec, autostart=autostart, run=run, transient=transient, test=__opts__["test"], **_limits()
            )
    except (CommandExecutionError, SaltInvocationError) as exc:
        return dict(ret, result=False, comment=str(exc))
    return dict(
        ret,
        changes=done["changes"],
        comment=done["comment"],
        result=None if __opts__["test"] and done["changes"] else True,
    )


def pool_defined(
    name,
    ptype="dir",
    target=None,
    permissions=None,
    source=None,
    transient=False,
    autostart=True,
    connection=None,
    username=None,
    password=None,
):
    """
    A storage pool with this definition exists (Salt's arguments: ``ptype`` dir, fs, netfs, logical,
    disk, iscsi, iscsi-direct, scsi, mpath, rbd, gluster or zfs; ``source``: {devices, dir, hosts, name,
    format, initiator, adapter, auth} as the ``source_*`` arguments of virt.pool_define; ``permissions``
    of the target; ``transient``: a running pool that is gone once stopped). Only what is declared is
    compared; a changed definition of a running pool is used after its restart (the comment says so).
    A source_auth password goes into a libvirt secret, never into the state's return. What it defines or
    changes stays within the minion config's ``virt:pool_paths`` and ``virt:pool_sources`` (see
    virt.pool_define; this example needs ``pool_sources: {devices: [/dev/sdb], names: [vg0]}``).

    .. code-block:: yaml

        vg0:
          virt.pool_defined:
            - ptype: logical
            - source:
                devices:
                  - path: /dev/sdb
    """
    return _pool_state(
        name, ptype, target, permissions, source, transient, autostart, False, connection, username, password
    )


def pool_running(
    name,
    ptype="dir",
    target=None,
    permissions=None,
    source=None,
    transient=False,
    autostart=True,
    connection=None,
    username=None,
    password=None,
):
    """
    Like ``virt.pool_defined``, and the pool is started: built first where it needs it (its directory;
    a volume group or partition table on empty devices only: devices holding data are never overwritten).

    .. code-block:: yaml

        images:
          virt.pool_running:
            - target: /srv/salt-images
    """
    return _pool_state(
        name, ptype, target, permissions, source, transient, autostart, True, connection, username, password
    )


def pool_deleted(name, purge=False, connection=None, username=None, password=None):
    """
    The pool is gone: stopped and undefined; with ``purge`` its volumes are deleted first and what
    building it made (directory, volume group) is removed: lost for ever. Changes in Salt's shape:
    {stopped, deleted, undefined, deleted_volumes}; what a pool type cannot do is named in the comment.
    Only a pool within the minion config's ``virt:pool_paths`` and ``virt:pool_sources``; ``purge`` only
    while no domain uses, no image outside the pool backs onto and no VM owns any of its volumes. A volume
    of a VM that no longer exists on this host (undefined outside salt-virt) and that no domain uses is an
    orphan: it goes with a running pool, named in ``deleted_orphans`` ({volume: the VM it belonged to}).

    .. code-block:: yaml

        scratch:
          virt.pool_deleted:
            - purge: True
    """
    ret = _ret(name)
    try:
        _no_password_login(username, password)
        with _c.salt_connect(__salt__, connection) as conn:
            changes, unsupported = _pc.delete_all(
                conn, name, purge=bool(purge), test=__opts__["test"], host_id=__opts__.get("id"), **_limits()
            )
    except (CommandExecutionError, SaltInvocationError) as exc:
        return dict(ret, result=False, comment=f"Failed deleting pool: {exc}")
    if changes is None:
        return dict(ret, comment=f"Storage pool could not be found: {name}")
    comment = f"pool {name} {'would be ' if __opts__['test'] else ''}" + ("purged" if purge else "undefined")
    orphans = changes.get("deleted_orphans") or {}
    if orphans:
        comment += "; orphans deleted with it: " + ", ".join(f"{v} ({why})" for v, why in sorted(orphans.items()))
    if unsupported:
        comment += f"; unsupported for this pool type: {', '.join(unsupported)}"
    return dict(ret, changes=changes, comment=comment, result=None if __opts__["test"] else True)


def volume_defined(
    pool,
    name,
    size,
    allocation=0,
    format=None,  # pylint: disable=redefined-builtin
    type=None,  # pylint: disable=redefined-builtin
    permissions=None,
    backing_store=None,
    nocow=False,
    connection=None,
    username=None,
    password=None,
):
    """
    A volume ``name`` of ``size`` MiB exists in the running ``pool`` (an existing volume with another
    format or backing store is an error; a different size is reported, never resized). A new volume's
    ``backing_store`` is checked as in virt.volume_define.

    .. code-block:: yaml

        web1-data:
          virt.volume_defined:
            - pool: images
            - size: 8192
            - format: qcow2
    """
    ret = _ret(name)
    try:
        _no_password_login(username, password)
        spec = _px.volume_spec(name, size, allocation, format, type, permissions, backing_store, nocow)
        with _c.salt_connect(__salt__, connection) as conn:
            done = _pc.ensure_volume(conn, pool, spec, test=__opts__["test"], **_limits())
    except (CommandExecutionError, SaltInvocationError) as exc:
        return dict(ret, result=False, comment=str(exc))
    return dict(ret, **done)
