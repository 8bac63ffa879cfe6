"""saltvirt.host.stats: Salt's per-VM counters and the rates salt-run virt.query rates=True shows."""

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.host import stats


def test_counters_on_the_test_driver(test_conn):
    cpu = stats.cputime(test_conn)
    assert set(cpu) == {d.name() for d in test_conn.listAllDomains(0)}
    assert all(isinstance(v["cputime"], int) and isinstance(v["cputime_percent"], int) for v in cpu.values())
    disk = stats.diskstats(test_conn)  # running VMs only
    assert all(set(stats.DISK_KEYS) <= set(v) for v in disk.values())
    with pytest.raises(CommandExecutionError, match="is not defined"):
        stats.cputime(test_conn, "nope")


def test_rates_between_two_samples():
    first = {
        "at": 100.0,
        "cpu": {"a": {"cputime": 0, "vcpus": 2}, "gone": {"cputime": 5, "vcpus": 1}},
        "net": {"a": {"rx_bytes": 1000, "tx_bytes": 0}},
        "disk": {"a": {"rd_bytes": 0, "wr_bytes": 4096, "rd_req": 0, "wr_req": 1}},
    }
    second = {
        "at": 102.0,
        "cpu": {"a": {"cputime": 2 * 10**9, "vcpus": 2}, "new": {"cputime": 1, "vcpus": 1}},
        "net": {"a": {"rx_bytes": 3000, "tx_bytes": 512}},
        "disk": {"a": {"rd_bytes": 8192, "wr_bytes": 4096, "rd_req": 4, "wr_req": 1}},
    }
    assert stats.rates(first, second) == {
        "a": {
            "cpu_percent": 50.0,  # 2 s of CPU over 2 s on 2 vCPUs
            "rx_bytes_per_s": 1000.0,
            "tx_bytes_per_s": 256.0,
            "rd_bytes_per_s": 4096.0,
            "wr_bytes_per_s": 0.0,
            "rd_req_per_s": 2.0,
            "wr_req_per_s": 0.0,
        }
    }
