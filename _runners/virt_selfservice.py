"""
Runner ``virt`` (continued): what a tenant's self-service asks besides the lifecycle actions (the web console's
VM page and create form, docs/topics/console.md; ``salt-run`` too): ``virt.catalog`` (the images and lists
``virt.init`` takes from the caller), a VM's snapshots (``virt.snapshots``, ``virt.snapshot``,
``virt.revert_snapshot``, ``virt.delete_snapshot``) and backups (``virt.backups``), and ``virt.job`` (the
state and answer of the caller's own ``runner_async`` job). Salt's loader merges every runner file whose
``__virtualname__`` is ``virt`` into one ``virt`` runner. Tenants: docs/topics/tenants.md.
"""

import contextlib
import os
import re
import sys
import time
import types
from typing import TYPE_CHECKING

import salt.client
import salt.minion
import salt.payload
from salt.exceptions import SaltException, SaltInvocationError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{runners,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import config, validate
    from saltvirt.fleet import callers, publish, tenants
    from saltvirt.fleet import catalog as _catalog

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext

__virtualname__ = "virt"
# snapshots a tenant's VM may hold (internal qcow2 snapshots grow its disks beyond what the disk quota counts)
SNAPSHOTS_DEFAULT = 3
_JID = re.compile(r"^\d{20}$")


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt runner: the saltvirt library is missing: run salt-run saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    return __virtualname__


def _failed(exc):
    """The answer for a failure, as the other ``virt`` runner functions give it (``virt_query`` outputter)."""
    with contextlib.suppress(NameError):  # __context__ is injected by the loader
        __context__["retcode"] = 1
    return {"outputter": "virt_query", "data": publish.failure(exc)}


def _who():
    return callers.job_caller(__opts__, globals(), __salt__)


def _on_vm(who, name, fun, args=(), host=None):
    """``(hypervisor, answer)`` of ``fun`` on VM ``name`` for ``who``: :func:`saltvirt.fleet.tenants.act`."""
    validate.vm_name(name)
    fleet = publish.Fleet.of_master(__opts__)  # checked before a client is opened
    with salt.client.get_local_client(__opts__["conf_file"]) as client:
        return tenants.act(fleet.with_client(client), who, name, fun, list(args), host)


def catalog():
    """
    What the caller may create a VM from with ``virt.init``: the catalog images (a tenant member: its tenant's;
    their ``format`` and ``min_size``, never their source or checksum), its tenant's ``profiles``, ``networks``,
    ``pools`` and ``hypervisors``, and the keyword ``arguments`` a tenant may pass besides name, cpu, mem and image.

    CLI Example:: salt-run virt.catalog
    """
    try:
        who = _who()
        entries = _catalog.config(__opts__)
        if who.operator:
            conf = {"images": sorted(entries), "profiles": ["default"], "networks": [], "pools": []}
            conf["hypervisors"] = ["*"]
        else:
            conf = tenants.config(__opts__)["tenants"][who.tenant]
    except SaltException as exc:
        return _failed(exc)
    shown = [i for i in conf["images"] if i in entries]
    return {
        "tenant": who.tenant,
        "images": {i: {"format": entries[i]["format"], "min_size": entries[i]["min_size"]} for i in shown},
        **{key: list(conf[key]) for key in ("profiles", "networks", "pools", "hypervisors")},
        "arguments": sorted(tenants.INIT_KWARGS),
    }


def snapshots(name, host=None):
    """
    The snapshots of VM ``name`` (a tenant member: of its tenant's VMs only), oldest first:
    ``{name, host, snapshots: [{name, created, running, current, state, ...}]}``.

    CLI Example:: salt-run virt.snapshots web1
    """
    try:
        where, ans = _on_vm(_who(), name, "virt.list_snapshots", (), host)
    except SaltException as exc:
        return _failed(exc)
    found = (ans["ret"] or {}).get(name)
    return {"name": name, "host": where, "snapshots": found if isinstance(found, list) else []}


def snapshot(name, snapshot=None, host=None):
    """
    Take an internal snapshot of VM ``name`` (its memory too while it runs), named ``snapshot`` (default
    ``<name>-<YYYYmmdd-HHMMSS>``). A tenant member's VM may hold ``virt:tenant_snapshots`` snapshots (master
    config, default 3): their space is not counted in its disk quota.

    CLI Example:: salt-run virt.snapshot web1 before-upgrade
    """
    try:
        who = _who()
        if not who.operator:
            limit = int((config.master_virt(__opts__)[0]).get("tenant_snapshots", SNAPSHOTS_DEFAULT))
            where, ans = _on_vm(who, name, "virt.list_snapshots", (), host)
            held = (ans["ret"] or {}).get(name)
            if isinstance(held, list) and len(held) >= limit:
                raise SaltInvocationError(
                    f"VM {name} has {len(held)} of its {limit} snapshots: delete one first (virt.delete_snapshot)"
                )
            host = where
        where, ans = _on_vm(who, name, "virt.snapshot", [snapshot] if snapshot else (), host)
    except SaltException as exc:
        return _failed(exc)
    return {"name": name, "host": where, "result": ans["ret"]}


def revert_snapshot(name, snapshot, host=None):
    """
    Revert VM ``name`` to its snapshot ``snapshot`` (the snapshots after it stay; its backup checkpoints are
    discarded, the next backup is full: docs/topics/backups.md).

    CLI Example:: salt-run virt.revert_snapshot web1 before-upgrade
    """
    try:
        where, ans = _on_vm(_who(), name, "virt.revert_snapshot", [validate.vm_name(snapshot, "snapshot name")], host)
    except SaltException as exc:
        return _failed(exc)
    return {"name": name, "host": where, "result": ans["ret"]}


def delete_snapshot(name, snapshot, host=None):
    """
    Delete snapshot ``snapshot`` of VM ``name``.

    CLI Example:: salt-run virt.delete_snapshot web1 before-upgrade
    """
    try:
        where, ans = _on_vm(_who(), name, "virt.delete_snapshots", [validate.vm_name(snapshot, "snapshot name")], host)
    except SaltException as exc:
        return _failed(exc)
    return {"name": name, "host": where, "result": ans["ret"]}


def backups(name, host=None):
    """
    The backups of VM ``name`` in its hypervisor's backup directory, oldest first (a tenant member: of its
    tenant's VMs, and only the backups that recorded its tenant as the owner): ``{name, host, backups: [{id,
    type, finished, size, ...}]}``. ``virt.backup NAME`` makes one, ``virt.restore NAME ID`` restores one.

    CLI Example:: salt-run virt.backups web1
    """
    try:
        who = _who()
        where, ans = _on_vm(who, name, "virt.backup_list", (), host)
    except SaltException as exc:
        return _failed(exc)
    listed = [b for b in (ans["ret"] or {}).get("backups") or [] if who.operator or tenants.owned_by(b, who.tenant)]
    return {"name": name, "host": where, "backups": listed}


def job(jid):
    """
    The state of the caller's own ``virt`` runner job ``jid`` (one it started through salt-api's ``runner_async``):
    ``{jid, fun, state: running}`` or ``{jid, fun, state: finished, success, return}``. Read from what the master
    itself writes (its running-job file, its job cache under its own id), never from the event bus; another user's
    job, or a job that is not a ``virt`` runner's, is answered as unknown.

    CLI Example:: salt-run virt.job 20260101120000123456
    """
    try:
        who = _who()
        if not isinstance(jid, str) or not _JID.match(jid):
            raise SaltInvocationError(f"{jid!r} is not a job id (20 digits)")
        for _ in range(6):  # a finished job leaves the running list just before the master stores its return
            found = _running(jid) or _finished(jid)
            if found is not None:
                break
            time.sleep(0.5)
        if found is None or found.get("user") != who.user or not str(found.get("fun", "")).startswith("runner.virt."):
            raise SaltInvocationError(f"no virt runner job {jid} of user {who.user}")
    except SaltException as exc:
        return _failed(exc)
    out = {"jid": jid, "fun": found["fun"][len("runner.") :], "state": found["state"]}
    if found["state"] == "finished":
        out.update(success=bool(found.get("success", True)), **{"return": found.get("return")})
    return out


def _running(jid):
    """The master's own record of a runner job in progress (``<cachedir>/proc/<jid>``, written by the runner
    client with the user Salt authenticated), or None."""
    path = os.path.join(__opts__["cachedir"], "proc", jid)
    try:
        with open(path, "rb") as fh:
            data = salt.payload.load(fh)
    except (OSError, ValueError, TypeError):
        return None
    return {**data, "state": "running"} if isinstance(data, dict) else None


def _finished(jid):
    """The finished runner job's return the master stored in its job cache under its own id, or None. A minion
    whose key has the master's id could write a return there: then nothing is trusted."""
    mid = __opts__["id"]
    if any(os.path.exists(os.path.join(__opts__["pki_dir"], d, mid)) for d in ("minions", "minions_pre")):
        raise SaltInvocationError(f"a minion key is named like this master ({mid}): job answers are not read")
    with salt.minion.MasterMinion(__opts__, states=False, rend=False, matcher=False) as cache:
        ret = (cache.returners[f"{__opts__['master_job_cache']}.get_jid"](jid) or {}).get(mid)
    data = (ret or {}).get("return")
    return {**data, "state": "finished"} if isinstance(data, dict) and "fun" in data else None
