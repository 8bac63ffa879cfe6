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


def test_uptime_is_the_qemu_processs_age_found_by_its_uuid(test_conn):
    """A process whose arguments carry ``-uuid <uuid>`` as libvirt starts QEMU (here a shell standing in for it: no
    QEMU in the unit tests) gives that VM's uptime; a VM with no such process has none; vm_info reports ``uptime``
    for every VM (None for the test driver's, which have no process), and a remote libvirtd's none at all."""
    import subprocess
    import time

    from saltvirt.host import query

    uuid = "6695eb01-f6a4-8304-79aa-97f2502e193f"
    other = "0b7e2c57-6a2f-4a7b-9c51-7d3a1f2e9aff"
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 30", "qemu", "-name", "test", "-uuid", uuid.upper()])
    try:
        time.sleep(1.1)
        got = stats.uptimes(test_conn, [uuid, other])
        assert list(got) == [uuid] and 1 <= got[uuid] < 30, got
    finally:
        proc.kill()
        proc.wait()
    assert stats.uptimes(test_conn, [uuid]) == {}  # its process is gone

    class Remote:
        def getURI(self):
            return "qemu+tls://hyper2.example/system"

    assert stats.uptimes(Remote(), [uuid]) == {}
    test_conn.createXML(
        f"<domain type='test'><name>up1</name><uuid>{other}</uuid><memory unit='MiB'>64</memory>"
        "<os><type>hvm</type></os></domain>"
    )
    info = query.vm_info(test_conn)
    assert info["up1"]["state"] == "running" and info["up1"]["uptime"] is None, info  # no QEMU process
