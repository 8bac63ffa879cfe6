"""
States ``virt`` (continued): ``virt.backed_up``, a recent enough backup of a VM exists
(``saltvirt.vm.backup``; where backups go and how: docs/topics/backups.md).
"""

import datetime
import os
import re
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

    from saltvirt.base.validate import to_bool as _bool

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions

__virtualname__ = "virt"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt states: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    return __virtualname__


def _seconds(max_age):
    """``24h``, ``30m``, ``2d``, ``1w``, ``90s`` or a number of seconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw]?)\s*", str(max_age))
    if not match or int(match.group(1)) <= 0:
        raise SaltInvocationError(f"max_age must be a positive duration like 24h, 30m, 2d, 1w, not {max_age!r}")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


def _age(finished, now):
    when = datetime.datetime.strptime(finished, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    return (now - when).total_seconds()


def backed_up(name, max_age="24h", incremental=True, disks=None, target=None):
    """
    Ensure VM ``name`` has a valid backup younger than ``max_age`` (``24h``, ``30m``, ``2d``, ``1w``, or
    seconds); otherwise make one (incremental from the last one when possible). ``test=True`` says
    whether a backup would be made, and which kind.

    .. code-block:: yaml

        web1-backed-up:
          virt.backed_up:
            - name: web1
            - max_age: 24h
    """
    ret = {"name": name, "changes": {}, "result": True, "comment": ""}
    try:
        limit = _seconds(max_age)
        listed = __salt__["virt.backup_list"](name, target=target)
        now = datetime.datetime.now(datetime.timezone.utc)
        newest = listed["backups"][-1] if listed["backups"] else None
        if newest and _age(newest["finished"], now) <= limit:
            ret["comment"] = f"VM {name} has backup {newest['id']} from {newest['finished']} (within {max_age})"
            return ret
        why = f"the newest backup is {newest['id']} from {newest['finished']}" if newest else "there is no backup"
        kind = "an incremental" if _bool(incremental) and newest else "a full"
        if __opts__["test"]:
            ret.update(result=None, comment=f"VM {name}: {why}; {kind} backup would be made (if possible)")
            ret["changes"] = {"backup": {"would_make": "incremental" if kind == "an incremental" else "full"}}
            return ret
        made = __salt__["virt.backup"](name, disks=disks, incremental=_bool(incremental), target=target)
    except (CommandExecutionError, SaltInvocationError) as exc:
        return dict(ret, result=False, comment=str(exc))
    keep = ("id", "type", "parent", "size", "duration", "consistency", "fs_freeze", "note", "checkpoint_redefined")
    ret["changes"] = {"backup": {k: made.get(k) for k in keep if made.get(k) is not None}}
    ret["comment"] = f"VM {name}: {why}; made {made['type']} backup {made['id']}"
    return ret
