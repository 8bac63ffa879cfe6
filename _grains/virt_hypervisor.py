"""Grain ``virt_hypervisor``: True on a minion that can act as a libvirt hypervisor for salt-virt
(libvirt python bindings import, and a libvirt daemon is installed or ``virt:connection:uri`` is set).
The ``libvirt`` ext_pillar hands TLS certificates to these minions by default.

Set ``virt_hypervisor: False`` (or True) in the minion config to decide it yourself."""

import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts

DAEMONS = ("libvirtd", "virtqemud")


def virt_hypervisor():
    forced = __opts__.get("virt_hypervisor")
    if forced is not None:
        return {"virt_hypervisor": bool(forced)}
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return {"virt_hypervisor": False}
    configured = bool(((__opts__.get("virt") or {}).get("connection") or {}).get("uri"))
    installed = any(shutil.which(d) or shutil.which(d, path="/usr/sbin:/sbin") for d in DAEMONS)
    return {"virt_hypervisor": configured or installed}
