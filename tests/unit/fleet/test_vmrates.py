"""saltvirt.fleet.vmrates: the rates salt-run virt.query rates=True shows, made on the master of two samples."""

from saltvirt.fleet import vmrates

FIRST = {
    "at": 100.0,
    "cpu": {"a": {"cputime": 0, "vcpus": 2}, "gone": {"cputime": 5, "vcpus": 1}},
    "net": {"a": {"rx_bytes": 1000, "tx_bytes": 0}},
    "disk": {"a": {"rd_bytes": 0, "wr_bytes": 4096, "rd_req": 0, "wr_req": 1}},
}
SECOND = {
    "at": 102.0,
    "cpu": {"a": {"cputime": 2 * 10**9, "vcpus": 2}, "new": {"cputime": 1, "vcpus": 1}},
    "net": {"a": {"rx_bytes": 3000, "tx_bytes": 512}},
    "disk": {"a": {"rd_bytes": 8192, "wr_bytes": 4096, "rd_req": 4, "wr_req": 1}},
}
RATES_A = {
    "cpu_percent": 50.0,  # 2 s of CPU over 2 s on 2 vCPUs
    "rx_bytes_per_s": 1000.0,
    "tx_bytes_per_s": 256.0,
    "rd_bytes_per_s": 4096.0,
    "wr_bytes_per_s": 0.0,
    "rd_req_per_s": 2.0,
    "wr_req_per_s": 0.0,
}


def test_rates_between_two_samples():
    assert vmrates.rates(FIRST, SECOND) == {"a": RATES_A}  # "gone" and "new" are in one sample only


def test_add_gives_rates_to_the_vms_the_caller_sees_on_hosts_up_for_all_three():
    seen = {
        "hv1": {"status": "up", "vm_info": {"a": {"state": "running"}}},  # "new" and "gone": not the caller's
        "hv2": {"status": "up", "vm_info": {"a": {"state": "running"}}},  # down for the second sample
        "hv3": {"status": "down"},
    }
    first = {h: {"status": "up", "host": FIRST} for h in ("hv1", "hv2", "hv3")}
    second = {"hv1": {"status": "up", "host": SECOND}, "hv2": {"status": "down"}}
    vmrates.add(seen, first, second)
    assert seen == {
        "hv1": {"status": "up", "vm_info": {"a": {"state": "running", "rates": RATES_A}}},
        "hv2": {"status": "up", "vm_info": {"a": {"state": "running"}}},
        "hv3": {"status": "down"},
    }
