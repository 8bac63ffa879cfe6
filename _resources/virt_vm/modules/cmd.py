"""
``cmd`` for ``virt_vm`` resources (docs/topics/resources.md): ``cmd.run`` in a VM through its QEMU guest agent
(``guest-exec``), with no minion inside the guest. Off unless the hypervisor's minion config turns it on
(``virt:resources:guest_exec: True``), and for operators only (``virt:operators``), tenants included or not:
the logic is ``saltvirt.host.guestexec``.
"""

import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltInvocationError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{resources/virt_vm/modules,utils/saltvirt}
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import operators as _operators
    from saltvirt.host import guestexec as _guestexec
    from saltvirt.host import vmresources as _vmr

if TYPE_CHECKING:  # what Salt's per-type resource loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts
    __resource__: dict

__virtualname__ = "cmd"


def __virtual__():
    if saltvirt is None:
        return False, "cmd (virt_vm): the saltvirt library is missing: run saltutil.sync_all"
    return __virtualname__


def run(cmd, timeout=None, python_shell=None, **kwargs):
    """
    Run ``cmd`` in the targeted VM through its QEMU guest agent and return its stdout; a command that fails
    (exit code, signal) raises with its stderr. ``cmd``: a string (run by ``/bin/sh -c``; ``python_shell=False``
    splits it into arguments instead) or a list of arguments. ``timeout``: seconds (default 60, at most 3600).
    Operators only, and only where the hypervisor's minion config sets ``virt:resources:guest_exec: True``.

    CLI Example:: salt -C 'T@virt_vm:6f1c...-...' cmd.run 'uname -a'
    """
    extra = sorted(k for k in kwargs if not k.startswith("__pub_"))
    if extra:
        raise SaltInvocationError(_guestexec.UNSUPPORTED.format(names=", ".join(extra)))
    return _guestexec.guest_run(
        _vmr.opts_config(__opts__),
        lambda: _vmr.connect(__opts__),
        _vmr.resource_id(__resource__["id"]),
        cmd,
        timeout=timeout,
        python_shell=python_shell,
    )


if saltvirt is not None:  # last: operators only (virt:operators); not in operators.TENANT_RESOURCE_FUNCTIONS
    _operators.guard_module(globals(), advice=_operators.RESOURCE_ADVICE)
