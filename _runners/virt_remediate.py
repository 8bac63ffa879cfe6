"""
Runner ``virt`` (continued): ``salt-run virt.remediate``, what the master does when an event says a VM or a
hypervisor needs help (a crashed VM, a disk error, a silent guest agent, a host's beacon), and
``virt.remediate_log`` (``saltvirt.fleet.remediate``). The shipped reactor ``salt-virt.remediate.sls`` runs it
with the event's hints only; every kind is off until ``virt:remediate:<kind>:enabled`` (master config). Salt's
loader merges every runner file whose ``__virtualname__`` is ``virt``. User guide: docs/topics/remediation.md.
"""

import contextlib
import os
import sys
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
    from saltvirt.base import validate
    from saltvirt.fleet import callers, fleetstate, publish, tenants
    from saltvirt.fleet import remediate as _remediate

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


def _failed(exc, **extra):
    with contextlib.suppress(NameError):  # __context__ is injected by the loader
        __context__["retcode"] = 1
    return publish.failure(exc, **extra)


def remediate(kind, host=None, name=None, uuid=None):
    """
    Remediate what an event hinted at (the reactor ``salt-virt.remediate.sls`` passes the hints; see
    docs/topics/remediation.md): ``kind=crashed`` restarts a crashed VM with backoff, then moves it or alerts;
    ``io_error`` keeps a VM paused by a disk error paused and alerts; ``agent`` resets a VM whose guest agent stays
    silent (without ``host``: looks again at every VM it watches); ``beacon`` runs one balancing round. The event
    decides nothing: ``host`` must be one of ``virt:hypervisors`` and is asked, in a job only it answers, what
    state VM ``name`` is in (``uuid``, when given, must be its UUID there). Each kind is off until
    ``virt:remediate:<kind>:enabled: True`` in the master config. Returns ``{kind, host, name, acted, decision,
    reason}``; a hint that does not hold is refused (exit code 1), nothing done.

    CLI Example:

    .. code-block:: bash

        salt-run virt.remediate kind=crashed host=hyper1 name=web1
        salt-run virt.remediate kind=agent
    """
    try:
        tenants.operator_only(callers.job_caller(__opts__, globals(), __salt__), "virt.remediate")
        with _client() as client:
            return _remediate.remediate(__opts__, kind, host or None, name or None, uuid or None, client=client)
    except SaltException as exc:
        return _failed(exc, kind=kind, host=host, name=name)


def remediate_log(last=20):
    """
    The remediation log (``salt-run virt.remediate``), oldest first: the last ``last`` records (at most the 200 the
    shared store keeps), each with its time, kind, host, VM, decision (``restarted``, ``restart_failed``, ``moved``,
    ``move_failed``, ``gave_up``, ``kept_paused``, ``agent_silent``, ``reset``, ``reset_failed``, ``agent_back``,
    ``balanced``) and the reason. Refused hints are not logged here (the master's log has them).

    CLI Example:

    .. code-block:: bash

        salt-run virt.remediate_log
        salt-run virt.remediate_log last=100
    """
    try:
        tenants.operator_only(callers.job_caller(__opts__, globals(), __salt__), "virt.remediate_log")
        last = validate.int_in(last, "last", 1, _remediate.JOURNAL.size)
        return {"entries": _remediate.JOURNAL.history(fleetstate.Store(__opts__), last)}
    except SaltException as exc:
        return _failed(exc)


def _client():
    return salt.client.get_local_client(__opts__["conf_file"])
