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
