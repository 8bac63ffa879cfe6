"""
States ``virt`` (continued): VM snapshots, Salt's ``snapshot``, ``saved`` (its older name) and ``reverted``,
over ``saltvirt.host.snapshot``. ``name`` may be a shell-style pattern over the VM names (as in Salt).

``virt.snapshot`` takes a new snapshot on every run: that is what it is for (periodic snapshots, told
apart by ``suffix``); ``virt.reverted`` reverts on every run. ``test=True`` names exactly which snapshot
would be taken or reverted to and what ``cleanup`` would delete.
"""

import fnmatch
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

    from saltvirt.base import validate
    from saltvirt.host import conn as _c
    from saltvirt.host import snapshot as _snap

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


def _targets(conn, pattern):
    return sorted(fnmatch.filter([d.name() for d in conn.listAllDomains(0)], pattern))


def _over_vms(name, connection, username, password, action, section, done_comment):
    test = __opts__["test"]
    ret = {"name": name, "changes": {}, "result": None if test else True, "comment": ""}
    changed, ignored = [], []
    try:
        validate.no_credentials(username, password)
        with _c.salt_connect(__salt__, connection) as conn:
            vms = _targets(conn, name)
            for vm in vms:
                try:
                    changed.append(dict({"domain": vm}, **action(conn, vm, test)))
                except (CommandExecutionError, SaltInvocationError) as exc:
                    ignored.append({"domain": vm, "issue": str(exc)})
    except (CommandExecutionError, SaltInvocationError) as exc:
        return dict(ret, result=False, comment=str(exc))
    if not vms:
        return dict(ret, result=False, comment=f'No domains found for criteria "{name}"')
    if changed:
        ret["changes"][section] = changed
    if ignored:
        ret["changes"]["ignored"] = ignored
    if not changed:
        ret["result"] = False
    issues = "; ".join(f"{i['domain']}: {i['issue']}" for i in ignored)
    ret["comment"] = (("Would be: " if test else "") + done_comment if changed else "No changes had happened") + (
        f"; failed: {issues}" if issues else ""
    )
    if ignored and changed and not test:
        ret["result"] = False
    return ret


def snapshot(name, suffix=None, connection=None, username=None, password=None):
    """
    Take an internal snapshot of the VM ``name`` (or of every VM matching the pattern).
    Changes: {saved: [{domain, snapshot, memory}]}.

    .. code-block:: yaml

        web*:
          virt.snapshot:
            - suffix: periodic
    """

    def take(conn, vm, test):
        done = _snap.create(conn, vm, suffix=suffix, test=test)
        return {"snapshot": done["name"], "memory": done["memory"]}

    return _over_vms(name, connection, username, password, take, "saved", "Snapshot has been taken")


def saved(name, suffix=None, connection=None):
    """
    Salt's older name of ``virt.snapshot``.

    .. code-block:: yaml

        web1:
          virt.saved:
            - suffix: periodic
    """
    return snapshot(name, suffix=suffix, connection=connection)


def reverted(name, snapshot=None, cleanup=False, connection=None):  # pylint: disable=redefined-outer-name
    """
    Revert the VM ``name`` (or every VM matching the pattern) to ``snapshot``, or to the one before
    its current snapshot; ``cleanup``: delete the snapshots taken after it.
    Changes: {reverted: [{domain, current, deleted}]}.

    .. code-block:: yaml

        web1:
          virt.reverted:
            - snapshot: web1-before-upgrade
            - cleanup: True
    """

    def back(conn, vm, test):
        done = _snap.revert(conn, vm, snapshot, cleanup=bool(cleanup), test=test)
        return {"current": done["reverted"], "deleted": done["deleted"]}

    return _over_vms(name, connection, None, None, back, "reverted", "Domain has been reverted")
