"""saltvirt.host.stats: Salt's per-VM counters and the samples salt-run virt.query rates=True takes."""

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
