"""
Runner ``virt`` (continued): what a tenant's member (or an operator) asks about tenancy, ``virt.whoami`` and
``virt.usage`` (``saltvirt.fleet.callers``, ``saltvirt.fleet.tenants``, ``saltvirt.fleet.quota``). Salt's loader
merges every runner file whose ``__virtualname__`` is ``virt`` into one ``virt`` runner. Tenants, quotas and the
master config: docs/topics/tenants.md.
"""

import contextlib
import os
import sys
import time
import types
from typing import TYPE_CHECKING

import salt.client
from salt.exceptions import SaltException

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
    from saltvirt.fleet import callers, fleetstate, publish, quota, tenants

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltContext, SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __context__: SaltContext

__virtualname__ = "virt"


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


def usage(tgt=None, tgt_type=None, timeout=None):
    """
    Each tenant's usage against its quota (vCPUs, memory MiB, disk MiB, VMs), with a text bar per
    resource, counted as ``virt.init`` counts it (the VMs whose <metadata> name the tenant, plus
    creations in flight); under ``groups``, its use on each hypervisor group of its ``group_quotas``
    against that quota, counted as placement counts it. A tenant member sees its own tenant only.

    CLI Example:

    .. code-block:: bash

        salt-run virt.usage
        salt-run virt.usage --out=json
    """
    try:
        who = callers.job_caller(__opts__, globals(), __salt__)
        conf = tenants.config(__opts__)["tenants"]
        if not who.operator:
            conf = {who.tenant: conf[who.tenant]}
        since = time.time()
        fleet = publish.Fleet.of_master(__opts__, tgt=tgt, tgt_type=tgt_type, timeout=timeout)  # checked first
        with salt.client.get_local_client(__opts__["conf_file"]) as client:
            hosts = fleet.with_client(client).gather("virt.full_info")
        store = fleetstate.Store(__opts__)
        data = quota.usage(store, hosts, conf, since, fleetstate.config(__opts__))
        down = publish.down_hosts(hosts)
        if down:
            data["_note"] = (
                f"these hypervisors did not answer (their VMs are counted from the ledger): {', '.join(down)}"
            )
        return data
    except SaltException as exc:
        return _failed(exc)


def whoami():
    """
    Who Salt says called this job, and whether it acts as an operator or for a tenant.

    CLI Example:: salt-run virt.whoami
    """
    try:
        who = callers.job_caller(__opts__, globals(), __salt__)
    except SaltException as exc:
        return _failed(exc)
    return {"user": who.user, "operator": who.operator, "tenant": who.tenant, "why": who.why}
