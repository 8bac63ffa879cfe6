"""VMs as Salt Resources (Salt 3008's ``T@`` targeting): what the hypervisor minion's ``virt_vm`` resource type
asks its libvirt. The loader side is ``_resources/virt_vm/`` (docs/topics/resources.md).

A VM's resource id is its libvirt UUID, lower case: names are labels (two hosts may each have a ``web1``, a
purged VM's name comes back on a new VM, a guest's own minion may be called by it), and Salt matches a bare
resource id like a minion id (``salt <id> ...``), so an id must never be one a minion could have by accident.

Every fact here is one the hypervisor knows from libvirt and the domain's definition (the tenant, group and
image ``virt.init`` wrote into its metadata); nothing a guest reports about itself (no guest agent, no guest
minion's grains, no guest addresses: even DHCP leases are filed under the MAC the guest's request names): a
tenant is root in its guest. The one thing asked of the guest is :func:`ping`'s "does your agent answer", which
only ever turns a running VM's answer to False.
"""

import math
import re
import uuid as uuidlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import salt.utils.data
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import ConfigGet, Conn, Data, Domain
from saltvirt.host import guestips, query
from saltvirt.host.conn import configured_connect, libvirt, lv_errors
from saltvirt.spec import compat, tenancy, vmgrains
from saltvirt.xml import domxml

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


def left(rid: str) -> CommandExecutionError:
    """The error of a call on VM ``rid`` once it left this host (purged, migrated away) since discovery."""
    return CommandExecutionError(f"VM {rid} is no longer on this hypervisor")


def agent_answers(dom: Domain, timeout: float = guestips.AGENT_TIMEOUT) -> bool | None:
    """Whether the QEMU guest agent of running ``dom`` answers ``guest-ping`` within ``timeout`` seconds; None
    when the VM has no agent channel. A channel libvirt reports ``disconnected`` (no agent listening) is not
    asked; any libvirt error (no answer in time, an agent gone, a driver without agent commands) is False."""
    with lv_errors(f"reading VM {dom.UUIDString()}"):
        state = domxml.parse(dom.XMLDesc(0))["guest_agent"]
    if state is None:
        return None
    if state == "disconnected":
        return False
    import libvirt_qemu  # noqa: PLC0415 - part of libvirt-python, needed only here

    try:  # libvirt's agent timeout is whole seconds (0 would mean "do not wait")
        libvirt_qemu.qemuAgentCommand(dom, '{"execute": "guest-ping"}', max(1, math.ceil(timeout)), 0)
    except libvirt.libvirtError:
        return False
    return True


def ping(conn: Conn, rid: str, agent_timeout: float = guestips.AGENT_TIMEOUT) -> bool:
    """True when VM ``rid`` is here and running, and its guest agent answers where it has an agent channel
    (:func:`agent_answers`; a VM without a channel, and so with no minion or agent inside, answers too)."""
    dom = domain(conn, rid)
    if dom is None or query.state_name(dom.state()[0]) != "running":
        return False
    return agent_answers(dom, agent_timeout) is not False


def member_tenant(pillar: Mapping[str, Any], user: str) -> str | None:
    """The tenant Salt user ``user`` belongs to, by the master's membership in the hypervisor's compiled pillar
    ``pillar`` (:data:`saltvirt.spec.tenancy.MEMBERS_PILLAR`, from the ``libvirt`` ext_pillar: the master
    config's ``virt:tenants``); None for a user it does not list, or a value that is not ``{user: tenant}``."""
    members = pillar.get(tenancy.MEMBERS_PILLAR) if isinstance(pillar, Mapping) else None
    tenant = members.get(user) if isinstance(members, Mapping) else None
    return tenant if isinstance(tenant, str) and tenant else None


def owner_tenant(conn: Conn, rid: str) -> str | None:
    """The tenant ``salt-run virt.init`` recorded as VM ``rid``'s owner in its <metadata>; None for an operator's
    VM and for one that is not (or no longer) on this host."""
    dom = domain(conn, rid)
    if dom is None:
        return None
    with lv_errors(f"reading VM {rid}"):
        owner = domxml.owner(domxml.read(dom.XMLDesc(0)))
    tenant = (owner or {}).get("tenant")
    return tenant or None


def tenant_owns(conn: Conn, rid: str, pillar: Mapping[str, Any], user: str) -> bool:
    """True when ``user`` is a member (:func:`member_tenant`) of the tenant that owns VM ``rid``
    (:func:`owner_tenant`): the ``virt_vm`` resources' tenant gate (``saltvirt.base.operators.TENANT_GATE``)."""
    tenant = member_tenant(pillar, user)
    return tenant is not None and owner_tenant(conn, rid) == tenant
