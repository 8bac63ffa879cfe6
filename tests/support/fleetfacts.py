"""Hypervisor facts in the shape ``virt.full_info`` answers them (``{status, host, vm_info}``, as
:meth:`saltvirt.fleet.publish.Fleet.gather` returns them), for the fleet tests of rebalancing and balancing; and a
balancing master over two hypervisors that sign their answers (:mod:`tests.support.signedfleet`)."""

from saltvirt.fleet import balance, fleetstate
from tests.support import signedfleet

GIB = 1024


def host(vms=(), mem=16 * GIB, status="up", group=None, owner=None, cpu=1):
    """A hypervisor running ``vms`` (``(name, mem)`` pairs) with ``mem`` MiB, each VM of ``cpu`` vCPUs, in
    anti-affinity ``group`` and owned by tenant ``owner`` (None: an operator's); ``status`` other than ``up``:
    one that did not answer."""
    if status != "up":
        return {"status": status, "error": "did not answer"}
    info = {n: {"state": "running", "cpu": cpu, "mem": m, "group": group} for n, m in vms}
    for vm in info.values():
        if owner:
            vm["owner"] = {"tenant": owner, "creator": "u"}
    return {
        "status": "up",
        "host": {
            "mem_total": mem,
            "mem_used_by_vms": sum(m for _n, m in vms),
            "vcpus_total": 8,
            "vcpus_used_by_vms": cpu * len(vms),
            "disk_free": 100 * GIB,
            "vms_defined": len(vms),
        },
        "vm_info": info,
    }


# a balancing master and its signed fleet ----------------------------------------------------------------------
HVS = ["hv1", "hv2"]
# each hypervisor's answer to each step of a migration (saltvirt.fleet.relocate), as a signed fleet gives them
MIGRATION_STEPS = {
    "virt.migrate_source_info": {"active": True, "probes": {}},
    "virt.migrate_prepare": {
        "copy_storage": None,
        "unsafe": True,
        "disk_map": None,
        "migrate_disks": None,
        "verify_backing": None,
        "address": "target",
        "created": [],
        "disks": [],
    },
    "virt.migrate": {"undefined_on_source": True, "live": True, "tunnelled": False, "target_uri": "x", "seconds": 0.1},
    "virt.migrate_finish": {"host": "target", "state": "running", "persistent": True, "disks": []},
}
MIGRATION = {**MIGRATION_STEPS, "virt.recovery_record": {"vms": {}}}


def fleet(owner=None):
    """hv1 runs four 2 GiB VMs of 16 GiB (load 0.5), hv2 none: over the threshold (0.1) at once."""
    return {"hv1": host([(f"v{i}", 2 * GIB) for i in range(4)], owner=owner), "hv2": host()}


def answers(hosts, silent_migrate=False):
    """Each hypervisor's signed answers: ``virt.full_info``, ``virt.capacity`` (the move's placement checks) and
    each step of a migration (``silent_migrate``: the source never answers ``virt.migrate``: it is still at it)."""
    out = {fun: dict.fromkeys(HVS, ret) for fun, ret in MIGRATION.items()}
    out["virt.full_info"] = {h: {"host": a["host"], "vm_info": a["vm_info"]} for h, a in hosts.items()}
    out["virt.capacity"] = {h: {"host": dict(a["host"], groups={}), "vm_info": a["vm_info"]} for h, a in hosts.items()}
    if silent_migrate:
        del out["virt.migrate"]["hv1"]
    return out


def master(tmp_path, mid="master", enabled=True, **virt):
    """Master opts (id ``mid``) of a fleet of ``HVS`` (signed answers), balancing ``enabled``, no memory reserve."""
    opts = signedfleet.fleet_opts(tmp_path, HVS, placement={"mem_reserve_mib": 0}, balance={"enabled": enabled}, **virt)
    opts["id"] = mid
    return opts


def held(opts, now):
    """``opts`` whose store has the state a previous round left: at ``now``, hv1 has been over for 600 s already
    (hold_seconds: 300)."""
    state = {"round": 1, "at": now - 600, "over_since": {"hv1": now - 600}, "moved": {}}
    fleetstate.Store(opts).transact(balance.BANK, balance.STATE, lambda _old: state)
    return opts
