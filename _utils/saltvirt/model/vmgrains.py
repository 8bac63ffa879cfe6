"""A VM's ``virt_vm`` resource grains from the facts its hypervisor reports about it (``virt.vm_info`` /
``virt.full_info``: :func:`saltvirt.host.query.describe`). One mapping for both sides: the resource type on the
hypervisor minion (``saltvirt.host.vmresources.grains``) and the master's ``salt-run virt.* select=``
(``saltvirt.fleet.vmselect``), so a selection matches on the master exactly the grains ``salt -C 'T@virt_vm and
G@...'`` matches on the minions. docs/topics/resources.md lists them.
"""

from typing import Any

from saltvirt.base.salttypes import Data

TYPE = "virt_vm"  # the resource type: T@virt_vm, T@virt_vm:<uuid>
NAMES = (
    "id",
    "uuid",
    "name",
    TYPE,
    "hypervisor",
    "state",
    "vcpus",
    "mem_mib",
    "group",
    "tenant",
    "image",
    "ha",
    "persistent",
    "autostart",
    "macs",
)


def grains(facts: Data, hypervisor: str) -> Data:
    """The grains of the VM ``facts`` describes (one ``vm_info`` entry) on minion ``hypervisor``; ``{}`` for an
    entry without a UUID (a VM its hypervisor could not read: nothing to select it by)."""
    uuid = facts.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        return {}
    uuid = uuid.lower()
    owner = facts.get("owner") or {}
    nics: Any = facts.get("nics") or {}
    return {
        "id": uuid,
        "uuid": uuid,
        "name": facts.get("name"),
        TYPE: True,
        "hypervisor": hypervisor,
        "state": facts.get("state"),
        "vcpus": facts.get("cpu"),
        "mem_mib": facts.get("mem"),
        "group": facts.get("group"),
        "tenant": owner.get("tenant"),
        "image": facts.get("image"),  # what virt.init recorded: a catalog name, or the source without secrets
        "ha": bool(facts.get("ha")),  # its record's HA flag (virt.init/virt.update ha=True; docs/topics/recovery.md)
        "persistent": facts.get("persistent"),
        "autostart": facts.get("autostart"),
        "macs": sorted(n["mac"] for n in nics.values() if isinstance(n, dict) and n.get("mac")),
    }
