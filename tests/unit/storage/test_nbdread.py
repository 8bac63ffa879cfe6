"""saltvirt.storage.nbdread against a real QEMU NBD server (qemu-storage-daemon, tests/support/nbdserve.py):
data, holes, block status, refusals."""

import subprocess

import pytest

from saltvirt.storage import nbdread
from tests.support import nbdserve

MIB = 1 << 20


def qemu_io(disk, command):
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", command, disk], capture_output=True, check=True)


@pytest.fixture
def served(tmp_path):
    """A 40 MiB qcow2 disk: data at 0 and 9 MiB, zeros written at 20 MiB."""
    disk, sock = str(tmp_path / "d.qcow2"), str(tmp_path / "s.sock")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "40M"], check=True)
    qemu_io(disk, "write -P 0x11 0 1M")
    qemu_io(disk, "write -P 0x22 9M 200k")
    qemu_io(disk, "write -z 20M 1M")
    with nbdserve.serve(disk, sock) as url:
        yield disk, sock, url


def test_the_client_reads_data_holes_and_block_status(served):
    _disk, sock, _url = served
    with nbdread.Client(sock, "disk") as nbd:
        assert nbd.size == 40 * MIB
        ext = nbd.extents()
        data = [(o, n) for o, n, f in ext if not f & nbdread.STATE_ZERO]
        assert data[0] == (0, MIB) and data[1][0] == 9 * MIB and len(data) == 2  # the zeros at 20 MiB are not data
        assert 200 * 1024 <= data[1][1] <= 256 * 1024  # to the byte or to the cluster, as QEMU reports it
        assert sum(n for _o, n, _f in ext) == 40 * MIB
        assert bytes(nbd.read(9 * MIB, 4)) == b"\x22" * 4 and bytes(nbd.read(5 * MIB, 3)) == b"\0" * 3
        buf = memoryview(bytearray(b"\xff" * (2 * MIB)))
        assert bytes(nbd.read(MIB - 8, 2 * MIB, buf)) == b"\x11" * 8 + b"\0" * (2 * MIB - 8)  # a hole zeroes it
    with pytest.raises(nbdread.NBDError, match="does not offer"):
        nbdread.Client(sock, "disk", "qemu:dirty-bitmap:nope")
    with pytest.raises(nbdread.NBDError, match="refused"):
        nbdread.Client(sock, "other")


def test_reads_keep_several_requests_in_flight_and_come_back_in_order(served):
    """Pipelined reads on one connection: ``depth`` requests are sent before the first reply is taken,
    the replies (QEMU may answer out of order) land in their own buffers, holes as zeros."""
    _disk, sock, _url = served
    ranges = [(0, MIB), (9 * MIB, 256 * 1024), (5 * MIB, 64 * 1024), (MIB - 8, 16), (20 * MIB, MIB)]
    want = [
        b"\x11" * MIB,
        b"\x22" * 200 * 1024 + b"\0" * 56 * 1024,
        b"\0" * 65536,
        b"\x11" * 8 + b"\0" * 8,
        b"\0" * MIB,
    ]
    given = []

    def buffer():
        given.append(memoryview(bytearray(b"\xff" * MIB)))  # not zeros: a hole must be written as zeros
        return given[-1]

    with nbdread.Client(sock, "disk") as nbd:
        before = nbd.cookie
        got = nbd.reads(ranges, buffer, depth=3)
        first = next(got)
        assert nbd.cookie - before == 3  # three requests on the wire before the first reply was read
        assert bytes(first) == want[0] and first.obj is given[0].obj
        assert [bytes(v) for v in got] == want[1:]
        assert nbd.cookie - before == len(ranges)
        assert bytes(nbd.read(9 * MIB, 4)) == b"\x22" * 4  # the connection is in step afterwards
        with pytest.raises(ValueError, match="buffer"):
            next(nbd.reads([(0, 2 * MIB)], buffer))
