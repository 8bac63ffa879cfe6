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

Registration follows libvirt's lifecycle events (:class:`Refresher`, run by the hypervisor's events engine): a
burst of them becomes one ``resource_refresh`` on the minion's own event bus, which makes Salt's minion discover
its VMs and register them with the master again.
"""

import logging
import math
import re
import threading
import time
import uuid as uuidlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import salt.utils.data
import salt.utils.resources
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import config
from saltvirt.base.salttypes import ConfigGet, Conn, Data, Domain
from saltvirt.host import guestips, query
from saltvirt.host.conn import configured_connect, libvirt, lv_errors
from saltvirt.model import tenancy, vmgrains
from saltvirt.xml import etree
from saltvirt.xml.domain import definition, metadata

log = logging.getLogger(__name__)

TYPE = vmgrains.TYPE  # the resource type: T@virt_vm, T@virt_vm:<uuid>
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def opts_config(opts: Mapping[str, Any]) -> ConfigGet:
    """``virt:`` settings from the minion config ``opts`` as a ``(key, default)`` function. Salt calls a
    resource type's ``discover(opts)`` from a loader with no ``__salt__`` (``salt/minion.py``
    ``_discover_resources``), so ``saltvirt.host.conn.salt_config`` cannot be used there; this reads the same minion
    config (never ``opts["grains"]`` or ``opts["pillar"]``: callers write those)."""
    return config.getter(lambda key, default=None: salt.utils.data.traverse_dict_and_list(opts, key, default))


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
        state = definition.parse(dom.XMLDesc(0))["guest_agent"]
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
    ``pillar`` (:data:`saltvirt.model.tenancy.MEMBERS_PILLAR`, from the ``libvirt`` ext_pillar: the master
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
        owner = metadata.owner(etree.read(dom.XMLDesc(0)))
    tenant = (owner or {}).get("tenant")
    return tenant or None


def tenant_owns(conn: Conn, rid: str, pillar: Mapping[str, Any], user: str) -> bool:
    """True when ``user`` is a member (:func:`member_tenant`) of the tenant that owns VM ``rid``
    (:func:`owner_tenant`): the ``virt_vm`` resources' tenant gate (``saltvirt.base.operators.TENANT_GATE``)."""
    tenant = member_tenant(pillar, user)
    return tenant is not None and owner_tenant(conn, rid) == tenant


# registration following lifecycle events ------------------------------------------------------------------------
# the lifecycle events that change the resource list (defined, undefined, migrated, a transient VM started or
# stopped) or a registered grain (state, and a definition's name, vCPUs, memory, metadata); the others (reboot,
# I/O and control errors, the guest agent) change neither
# (``connected``: the watcher's first session, libvirtd reached: the minion's own discovery at its start may have
# found libvirtd not yet up)
CHANGES = frozenset(
    ("defined", "undefined", "started", "stopped", "crashed", "panicked", "migrated")
    + ("suspended", "resumed", "shutdown", "pmsuspended", "lifecycle", "connected")
)
QUIET = 2.0  # seconds without a change before the refresh: a burst (a migration's events, 100 inits) is one
MAX_WAIT = 10.0  # seconds after the first change of a burst at the latest, however long the burst goes on
SETTLE = 5.0  # seconds after a VM migrated in: its new host registers once more (see Refresher)
RECHECK = 60.0  # seconds a pillar's answer to "does this minion manage virt_vm?" is used for
RESYNC = 600.0  # seconds without a refresh after which the minion registers again anyway (Refresher)


def manages(opts: Mapping[str, Any]) -> bool:
    """Whether this minion manages ``virt_vm`` resources: its pillar (as the minion compiled it, key
    ``resource_pillar_key``, default ``resources``) declares the type, as Salt's ``_discover_resources`` reads
    it."""
    return TYPE in salt.utils.resources.pillar_resources_tree(opts)


def pillar_declares(opts: Mapping[str, Any], grains: Mapping[str, Any]) -> bool:
    """Whether this minion's pillar, compiled now by its master (as ``salt-call pillar.items``), declares the type.
    For an engine: its process starts before the minion has its pillar or has resolved its master, so ``opts``
    (the minion config as the engine got it) is completed as Salt's minion completes it (``master_uri``)."""
    import salt.minion  # noqa: PLC0415 - only in an engine's process, when a registration is due
    import salt.pillar  # noqa: PLC0415

    conf = dict(opts)
    if not conf.get("master_uri"):
        conf.update(salt.minion.prep_ip_port(conf))
        conf.update(salt.minion.resolve_dns(conf))
    compiled = salt.pillar.get_pillar(conf, dict(grains), conf["id"], pillarenv=conf.get("pillarenv"))
    try:
        pillar = compiled.compile_pillar()
    finally:
        destroy = getattr(compiled, "destroy", None)
        if destroy is not None:
            destroy()
    return manages(dict(conf, pillar=pillar))


class Refresher:
    """Debounced ``resource_refresh``: :meth:`lifecycle` is told every libvirt lifecycle event of this host (by
    the events engine's watcher, from libvirt's own events: never from the master's bus); ``fire()`` (the engine:
    ``saltutil.refresh_resources``, an event on the minion's own bus) runs once a burst is :data:`QUIET` seconds
    quiet, and at most :data:`MAX_WAIT` seconds after its first event, on a thread of its own.

    ``declared()`` says whether the minion manages the type (the engine: its pillar, compiled afresh: an engine
    process starts before the minion has its pillar); asked when a refresh is due, its answer used for
    :data:`RECHECK` seconds; nothing is fired while it says no, and a failing one counts as yes (the minion's own
    discovery reads its pillar anyway).

    A VM that migrated in makes its new host register a second time, :data:`SETTLE` seconds later. Both hosts of
    a migration register at nearly the same time, and Salt 3008.5's registry replaces a minion's set without a
    lock across master workers (``ResourceRegistry.register_minion``: it reads the minion's previous ids from a
    view refreshed at most every 0.25 s, then deletes those not sent, whoever holds them now): the source's
    registration landing with the destination's can delete the UUID the destination just put. In either order
    one after the other the UUID ends up the destination's; the second registration restores it after a
    collision.

    And every :data:`RESYNC` seconds without a refresh, one more (``every``; None: never): Salt 3008.5's registry
    can lose a registration when hypervisors register at the same moment (bench/RESULTS.md, "Resources"), and a
    VM that nothing happens to would otherwise stay out of it."""

    def __init__(
        self, fire, quiet=QUIET, max_wait=MAX_WAIT, settle=SETTLE, declared=None, recheck=RECHECK, every=RESYNC
    ):
        self.fire, self.quiet, self.max_wait, self.settle, self.every = fire, quiet, max_wait, settle, every
        self.resync_at: float | None = None  # the next refresh nothing else asked for
        self.declared, self.recheck = declared, recheck
        self.answer: tuple[float, bool] | None = None  # (when, what) declared() last said
        self.cond = threading.Condition()
        self.first: float | None = None  # the burst's first and last change (monotonic)
        self.last = 0.0
        self.arrived = False  # a VM migrated in during the burst
        self.again_at: float | None = None  # the follow-up registration after a VM arrived
        self.thread: threading.Thread | None = None

    def lifecycle(self, event: str, extra: Mapping[str, Any] | None = None) -> None:
        """One lifecycle event of this host (``saltvirt.host.events`` names; ``extra``: its ``direction``)."""
        if event in CHANGES:
            self.poke(arrived=event == "migrated" and (extra or {}).get("direction") == "in")

    def poke(self, arrived: bool = False) -> None:
        with self.cond:
            now = time.monotonic()
            if self.first is None:
                self.first = now
            self.last = now
            self.arrived = self.arrived or arrived
            if self.thread is None:
                self.resync_at = None if self.every is None else now + self.every
                self.thread = threading.Thread(target=self._run, name="virt_vm-refresh", daemon=True)
                self.thread.start()
            self.cond.notify()

    def _due(self) -> float | None:
        times = [t for t in (self.again_at, self.resync_at) if t is not None]
        if self.first is not None:
            times.append(min(self.last + self.quiet, self.first + self.max_wait))
        return min(times) if times else None

    def _next(self) -> None:
        """Wait until a refresh is due, and reset what it covers."""
        with self.cond:
            while True:
                due = self._due()
                wait = None if due is None else due - time.monotonic()
                if wait is not None and wait <= 0:
                    break
                self.cond.wait(wait)
            now = time.monotonic()
            if self.first is not None and now >= min(self.last + self.quiet, self.first + self.max_wait):
                if self.arrived:
                    self.again_at = now + self.settle
                elif self.again_at is not None and now >= self.again_at:
                    self.again_at = None
                self.first, self.arrived = None, False
            elif self.again_at is not None and now >= self.again_at:
                self.again_at = None
            if self.every is not None:  # a refresh is due now: the next resync counts from it
                self.resync_at = now + self.every

    def _wanted(self) -> bool:
        if self.declared is None:
            return True
        now = time.monotonic()
        if self.answer is None or now - self.answer[0] >= self.recheck:
            try:
                said = bool(self.declared())
                if self.answer is None or self.answer[1] != said:
                    log.info("virt_vm: registration follows lifecycle events: %s", "on" if said else "off")
                self.answer = (now, said)
            except Exception as exc:  # noqa: BLE001 - the minion's discovery reads its pillar itself
                log.warning("virt_vm: could not tell whether this minion manages virt_vm resources: %s", exc)
                return True
        return self.answer[1]

    def _run(self) -> None:
        while True:
            self._next()
            if not self._wanted():
                continue
            try:
                self.fire()
            except Exception as exc:  # noqa: BLE001 - the next change tries again; the engine goes on
                log.warning("virt_vm: could not ask the minion to register its VMs again: %s", exc)


def follow_lifecycle(salt: Mapping[str, Any], opts: Mapping[str, Any], grains: Mapping[str, Any]) -> Any:
    """For an events engine (``virt_events``, ``libvirt_events``): the hook its watcher tells every lifecycle event
    (:meth:`Refresher.lifecycle`). A burst is one ``saltutil.refresh_resources`` (an event on this minion's own
    bus) while the minion's pillar declares the type (compiled afresh when a burst is due, at most once a minute:
    an engine starts before the minion has its pillar). ``salt``, ``opts``, ``grains``: the engine's dunders, read
    now: the Refresher calls on a thread of its own, where the loader's dunders are unset."""
    opts, grains = dict(opts), dict(grains)
    return Refresher(salt["saltutil.refresh_resources"], declared=lambda: pillar_declares(opts, grains)).lifecycle
