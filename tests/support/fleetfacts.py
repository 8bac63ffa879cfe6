"""Hypervisor facts in the shape ``virt.full_info`` answers them (``{status, host, vm_info}``, as
:func:`saltvirt.fleet.publish.gather` returns them), for the fleet tests of rebalancing and balancing."""

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
