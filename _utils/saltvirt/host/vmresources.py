"""VMs as Salt Resources (Salt 3008's ``T@`` targeting): what the hypervisor minion's ``virt_vm`` resource type
asks its libvirt. The loader side is ``_resources/virt_vm/`` (docs/topics/resources.md).

A VM's resource id is its libvirt UUID, lower case: names are labels (two hosts may each have a ``web1``, a
purged VM's name comes back on a new VM, a guest's own minion may be called by it), and Salt matches a bare
resource id like a minion id (``salt <id> ...``), so an id must never be one a minion could have by accident.

Every fact here is one the hypervisor knows from libvirt and the domain's definition (the tenant, group and
image ``virt.init`` wrote into its metadata); nothing a guest reports about itself (no guest agent, no guest
minion's grains, no guest addresses: even DHCP leases are filed under the MAC the guest's request names): a
tenant is root in its guest.
"""

import re
import uuid as uuidlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import salt.utils.data
from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import ConfigGet, Conn, Data, Domain
from saltvirt.host import query
from saltvirt.host.conn import configured_connect, libvirt, lv_errors
from saltvirt.spec import compat, vmgrains

TYPE = vmgrains.TYPE  # the resource type: T@virt_vm, T@virt_vm:<uuid>
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def opts_config(opts: Mapping[str, Any]) -> ConfigGet:
    """``virt:`` settings from the minion config ``opts`` as a ``(key, default)`` function. Salt calls a
    resource type's ``discover(opts)`` from a loader with no ``__salt__`` (``salt/minion.py``
    ``_discover_resources``), so ``saltvirt.host.conn.salt_config`` cannot be used there; this reads the same minion
    config (never ``opts["grains"]`` or ``opts["pillar"]``: callers write those)."""
    return compat.config_getter(lambda key, default=None: salt.utils.data.traverse_dict_and_list(opts, key, default))


def connect(opts: Mapping[str, Any]) -> AbstractContextManager[Conn]:
    """The minion's configured libvirt connection (``virt:connection``), opened as
    ``saltvirt.host.conn.salt_connect`` opens it."""
    return configured_connect(opts_config(opts))


def resource_id(value: Any) -> str:
    """``value`` as a resource id (a UUID in libvirt's lower-case form), or SaltInvocationError."""
    if isinstance(value, str) and _UUID.match(value):
        return value
    if isinstance(value, str):
        try:
            return str(uuidlib.UUID(value))
        except ValueError:
            pass
    raise SaltInvocationError(f"a virt_vm resource id is a VM's UUID, not {value!r:.80}")


def discover(conn: Conn) -> list[str]:
    """The resource ids of every VM defined or running on this host (transient ones too), sorted."""
    return sorted(query.defined_uuids(conn))


def domain(conn: Conn, rid: str) -> Domain | None:
    """VM ``rid`` (a resource id) on this host, or None when it is not (or no longer) here."""
    rid = resource_id(rid)
    with lv_errors(f"looking up VM {rid}"):
        try:
            return conn.lookupByUUIDString(rid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise


def grains(conn: Conn, rid: str, hypervisor: str) -> Data:
    """The grains of resource ``rid`` managed by minion ``hypervisor``: ``{}`` when the VM left this host
    (purged, migrated away) since it was discovered."""
    dom = domain(conn, rid)
    if dom is None:
        return {}
    return vmgrains.grains(query.describe(dom, conn.getHostname()), hypervisor)


def ping(conn: Conn, rid: str) -> bool:
    """True when VM ``rid`` is here and running (a VM with no minion inside answers too)."""
    dom = domain(conn, rid)
    return dom is not None and query.state_name(dom.state()[0]) == "running"
