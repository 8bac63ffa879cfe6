"""
State ``libvirt.keys``: the older tutorial's spelling of ``virt.keys``, for formulas written as

.. code-block:: yaml

    libvirt_keys:
      libvirt.keys

Same arguments and result as ``virt.keys`` (libvirt TLS CA, server and client certificates and keys
from this minion's ``libvirt`` pillar); the comment says to use ``virt.keys``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions

    __states__: SaltFunctions

__virtualname__ = "libvirt"


def __virtual__():
    if "virt.keys" not in __states__:
        return False, "libvirt.keys: the virt states are not available (run saltutil.sync_all)"
    return __virtualname__


def keys(name, basepath="/etc/pki", **kwargs):
    """
    Write the libvirt TLS files, exactly as ``virt.keys`` (which see); kept for the older tutorial's
    ``libvirt.keys``. ``expiration_days``, ``country``, ``state``, ``locality``, ``organization`` of
    Salt's old state (self-signed certificates made on the minion) do not apply: the master's
    ``libvirt`` ext_pillar CA issues the certificates, so they are refused if given.

    .. code-block:: yaml

        libvirt_keys:
          libvirt.keys:
            - basepath: /etc/pki
    """
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    old = sorted(k for k in ("expiration_days", "country", "state", "locality", "organization") if k in kwargs)
    if old:
        return {
            "name": name,
            "result": False,
            "changes": {},
            "comment": f"libvirt.keys: {', '.join(old)} are not supported: certificates are issued by the master's "
            "libvirt ext_pillar CA (set days/organization there); leave them out",
        }
    ret = __states__["virt.keys"](name, basepath=basepath, **kwargs)
    note = "libvirt.keys is the old name of virt.keys"
    ret["comment"] = f"{ret.get('comment')} ({note})" if ret.get("comment") else note
    ret.setdefault("warnings", []).append(f"{note}: write virt.keys")
    return ret
