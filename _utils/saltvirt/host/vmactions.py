"""What a ``virt_vm`` resource's own ``virt.*`` functions (``_resources/virt_vm/modules/virt_vm_virt.py``) need
beyond the library functions the hypervisor's ``virt.*`` module uses (``saltvirt.host.lifecycle``,
``saltvirt.host.snapshot``, ``saltvirt.vm.backup``): the VM found by its resource id, and the rules that keep a
UUID target safe.

A ``T@virt_vm:<uuid>`` job runs on every hypervisor that has a definition of that UUID, including one left
behind on a host that was down while its VMs were recovered elsewhere (docs/topics/resources.md, "One VM, two
hypervisors"). Neither the job nor the hypervisor knows that another copy is defined elsewhere (the master's
recovery record does; nothing on this host marks it), so:

* :func:`refuse_start`: starting a stopped VM through its resource could start a second copy on shared storage.
  It is allowed only where libvirt's lock manager guards the disks (minion config ``virt:lock_manager``: a disk
  another host's QEMU holds cannot be opened here, whatever any controller believes; docs/topics/faults.md),
  or with the operator's loudly named opt-in :data:`ONE_DEFINITION` (every VM is defined on one hypervisor
  only). Otherwise ``salt-run virt.start <name>`` asks every hypervisor first.
* :func:`refuse_offline`: a snapshot or backup of a VM that is not running here works on its disk files
  directly (``qemu-img``), outside any QEMU and so outside the lock manager's leases; a definition left behind
  here may share those files with the copy running elsewhere. These act on a VM running on this host only
  (its own QEMU holds the disks then), or with the same opt-in.

Stopping, shutting down, rebooting and forcing off act on a copy running here only (libvirt refuses them on
a stopped VM): they never start anything and need neither rule.

And one rule for every function that acts on a VM, :func:`refuse_untargeted`: Salt also runs a job aimed at the
hypervisor minions on every VM they manage (a glob with a wildcard, ``-E``, ``-I``, ``-S``, ...: salt/minion.py
``Minion._resolve_resource_targets``), and the resource's ``virt.stop`` has the name of the hypervisor's. So
``salt 'hyper*' virt.shutdown web1`` would shut down every VM there. These act only in a job whose target names
VM resources: ``T@`` in a compound target, or the VM's id itself (``salt <uuid>``, ``salt -L <uuid>,...``).
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from salt.exceptions import CommandExecutionError

from saltvirt.base import validate
from saltvirt.base.salttypes import ConfigGet, Conn, Domain
from saltvirt.host import vmresources
from saltvirt.host.conn import libvirt

LOCK_MANAGER = "virt:lock_manager"
LOCK_MANAGERS = ("lockd", "sanlock")  # libvirt's lock managers that lease a VM's disks ("nop": none)
ONE_DEFINITION = "virt:resources:unsafe_assume_one_definition"


class Pinned:
    """``conn`` where the name of VM ``dom`` finds ``dom`` itself: the library's functions look a VM up by name,
    and a name is a label another VM may take between two lookups (a purge and a new ``virt.init``). A libvirt
    domain handle acts on its UUID. Everything else is ``conn``'s."""

    def __init__(self, conn: Conn, dom: Domain):
        self._conn, self._dom, self._name = conn, dom, dom.name()

    def lookupByName(self, name: str) -> Domain:  # noqa: N802 - libvirt's name
        return self._dom if name == self._name else self._conn.lookupByName(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._conn, attr)


@contextmanager
def vm(opts: Any, rid: str) -> Iterator[tuple[Conn, Domain]]:
    """``(conn, dom)``: VM ``rid`` (a resource id) on the minion's configured libvirt (``virt:connection`` of the
    minion config ``opts``), found by UUID, with ``conn`` pinned to it (:class:`Pinned`); CommandExecutionError
    when it left this host, before or while the block runs."""
    rid = vmresources.resource_id(rid)
    with vmresources.connect(opts) as conn:
        dom = vmresources.domain(conn, rid)
        if dom is None:
            raise vmresources.left(rid)
        try:
            yield Pinned(conn, dom), dom
        except libvirt.libvirtError as exc:  # the library's calls on the handle: the VM went meanwhile
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise vmresources.left(rid) from None
            raise


def lock_manager(get: ConfigGet) -> str | None:
    """The libvirt lock manager the operator declared for this hypervisor (``virt:lock_manager``), or None."""
    value = get(LOCK_MANAGER, None)
    if value in (None, "", "nop"):
        return None
    if value not in LOCK_MANAGERS:
        raise CommandExecutionError(
            f"{LOCK_MANAGER} in the minion config is {value!r:.40}: set it to the lock manager qemu.conf's "
            f"lock_manager names ({' or '.join(LOCK_MANAGERS)}), or remove it"
        )
    return value


def one_definition_assumed(get: ConfigGet) -> bool:
    """The operator's opt-in :data:`ONE_DEFINITION`: no VM of this hypervisor is ever defined on another one."""
    return validate.to_bool(get(ONE_DEFINITION, False))


def _what(fun: str, dom: Domain) -> str:
    return f"{fun} of VM {dom.name()} ({dom.UUIDString()}) through its virt_vm resource"


def refuse_start(get: ConfigGet, dom: Domain, minion: str) -> None:
    """Refuse (CommandExecutionError) to start stopped ``dom`` through its resource on hypervisor ``minion``
    unless a lock manager guards its disks or the operator opted in (see the module doc)."""
    if dom.isActive() or lock_manager(get) or one_definition_assumed(get):
        return
    raise CommandExecutionError(
        f"{_what('virt.start', dom)} is refused on {minion}: a T@virt_vm:<uuid> target reaches every hypervisor "
        "with a definition of that VM (one stays behind on a host that was down while its VMs were recovered "
        f"elsewhere), and nothing keeps a second copy from starting here (no {LOCK_MANAGER} in this minion's "
        f"config). Start it with salt-run virt.start {dom.name()}, which asks every hypervisor first"
    )


def refuse_offline(get: ConfigGet, dom: Domain, fun: str, minion: str, advice: str) -> None:
    """Refuse (CommandExecutionError) ``fun`` (``virt.snapshot``, ``virt.backup``) on ``dom`` through its resource
    when it is not running on hypervisor ``minion``, unless the operator opted in (see the module doc);
    ``advice``: how to do it instead."""
    if dom.isActive() or one_definition_assumed(get):
        return
    raise CommandExecutionError(
        f"{_what(fun, dom)} acts only on a VM running on its hypervisor, and it is not running on {minion}: a "
        "definition left behind here (its VM recovered elsewhere) may share its disk files with the copy running "
        f"there. {advice}"
    )


def refuse_untargeted(fun: str, rid: str, pub: Mapping[str, Any]) -> None:
    """Refuse (CommandExecutionError) ``fun`` on VM ``rid`` in a published job (``pub``: the call's keywords, with
    Salt's ``__pub_tgt``/``__pub_tgt_type``) whose target does not name VM resources (see the module doc). A call
    that was not published (``salt-call``, another module) is not refused."""
    if "__pub_tgt_type" not in pub:
        return
    tgt, tgt_type = pub.get("__pub_tgt"), pub["__pub_tgt_type"]
    words = tgt.split() if isinstance(tgt, str) else [str(w) for w in tgt or ()]
    if tgt_type == "compound" and any(w.startswith("T@") for w in words):
        return
    if tgt_type == "list" and rid in {t.strip() for w in words for t in w.split(",")}:
        return
    if tgt_type == "glob" and tgt == rid:
        return
    raise CommandExecutionError(
        f"{fun} acts on a VM resource only in a job whose target names VM resources (-C 'T@virt_vm:<uuid>', "
        f"-C 'T@virt_vm and G@...', or the VM's UUID itself), not in this {tgt_type} target {str(tgt)!r:.80}: Salt "
        "also runs a job aimed at hypervisors on every VM they manage. For the hypervisor's own virt.* name the "
        "hypervisors with -L or one id without a wildcard"
    )
