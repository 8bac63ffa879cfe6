"""Per-VM rates for ``salt-run virt.query rates=True`` (master side): two ``virt.vm_stats_sample`` answers of
a hypervisor (:func:`saltvirt.host.stats.sample`, taken an interval apart) made into CPU percent and bytes and
requests per second, added to the VMs of the query's answer. Pure data: the samples arrive as answers."""

from saltvirt.base.salttypes import Data


def rates(first: Data, second: Data) -> dict[str, Data]:
    """Per-VM rates between two :func:`saltvirt.host.stats.sample` results: cpu percent (of the VM's vCPUs),
    network and disk bytes/s and requests/s."""
    elapsed = max(second["at"] - first["at"], 1e-6)
    out = {}
    for name, cpu in second["cpu"].items():
        if name not in first["cpu"]:
            continue
        vcpus = cpu.get("vcpus") or 1
        entry = {
            "cpu_percent": round(100.0 * (cpu["cputime"] - first["cpu"][name]["cputime"]) / (elapsed * 1e9 * vcpus), 1)
        }
        for kind, keys in (("net", ("rx_bytes", "tx_bytes")), ("disk", ("rd_bytes", "wr_bytes", "rd_req", "wr_req"))):
            a, b = first[kind].get(name), second[kind].get(name)
            if a and b:
                for key in keys:
                    entry[f"{key}_per_s"] = round(max(b[key] - a[key], 0) / elapsed, 1)
        out[name] = entry
    return out


def add(seen: dict[str, Data], first: dict[str, Data], second: dict[str, Data]) -> None:
    """Give each VM in ``seen`` (``virt.query``'s answers per hypervisor: what the caller may see) its ``rates``
    from the two ``virt.vm_stats_sample`` answers of its hypervisor (``first``, ``second``: per hypervisor).
    A hypervisor that was not up for all three is left as it is, and so is a VM the samples do not show."""
    for mid, ans in seen.items():
        a, b = first.get(mid) or {}, second.get(mid) or {}
        if ans.get("status") != "up" or a.get("status") != "up" or b.get("status") != "up":
            continue
        for vm, rate in rates(a["host"], b["host"]).items():
            if vm in (ans.get("vm_info") or {}):
                ans["vm_info"][vm]["rates"] = rate
