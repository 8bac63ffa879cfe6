"""saltvirt.storage.qcow2stream: images written front to back, checked by qemu-img itself (check,
compare, info), with and without a backing file, across several L2 tables."""

import hashlib
import os
import subprocess

import pytest

from saltvirt.storage import qcow2stream as q

MIB = 1 << 20


def qemu_img(*args):
    return subprocess.run(["qemu-img", *args], capture_output=True, text=True, check=False)


def stream(layout, src, out):
    """Write ``layout`` with the data of the raw file ``src``; the sha256 of what was emitted."""
    digest = hashlib.sha256()
    with open(src, "rb") as fin, open(out, "wb") as fout:

        def read(offset, length):
            fin.seek(offset)
            return fin.read(length)

        def emit(data):
            digest.update(data)
            fout.write(data)

        q.write(layout, read, emit, chunk=4 * MIB)
    return digest.hexdigest()


@pytest.fixture
def raw(tmp_path):
    """A 1300 MiB raw disk (three L2 tables' worth) with data at 0, 5 MiB, 700 MiB and in its last cluster."""
    path = tmp_path / "src.raw"
    size = 1300 * MIB
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset, length in ((0, 3 * MIB), (5 * MIB, 3 * MIB), (700 * MIB, 3 * MIB), (size - 4096, 4096)):
            fh.seek(offset)
            fh.write(os.urandom(length))
    return path, size, [(0, 3 * MIB), (5 * MIB, 3 * MIB), (700 * MIB, 3 * MIB), (size - 4096, 4096)]


def test_a_full_image_is_what_qemu_reads_and_its_digest_is_the_files(raw, tmp_path):
    src, size, extents = raw
    out = tmp_path / "full.qcow2"
    layout = q.Layout(size, q.clusters_of(extents, size))
    digest = stream(layout, src, out)
    assert os.path.getsize(out) == layout.file_size()
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest  # one pass: what was emitted is the file
    check = qemu_img("check", "--output=human", str(out))
    assert check.returncode == 0 and "No errors were found" in check.stdout, check.stdout + check.stderr
    assert qemu_img("compare", "-f", "raw", "-F", "qcow2", str(src), str(out)).returncode == 0
    assert layout.l2_tables == [0, 1, 2] and len(layout.data) == 3 * 48 + 1


def test_an_incremental_image_holds_only_its_clusters_and_reads_the_rest_from_its_backing(raw, tmp_path):
    src, size, extents = raw
    base = tmp_path / "base.qcow2"
    stream(q.Layout(size, q.clusters_of(extents, size)), src, base)
    with open(src, "r+b") as fh:  # the guest rewrites 100 KiB across two clusters
        fh.seek(700 * MIB + 30000)
        fh.write(b"\x77" * 100000)
    inc = tmp_path / "inc.qcow2"
    layout = q.Layout(size, q.clusters_of([(700 * MIB + 30000, 100000)], size), backing=base.name)
    stream(layout, src, inc)
    info = qemu_img("info", "--output=json", str(inc)).stdout
    assert '"backing-filename": "base.qcow2"' in info and '"backing-filename-format": "qcow2"' in info
    assert qemu_img("check", str(inc)).returncode == 0
    assert qemu_img("compare", "-f", "raw", "-F", "qcow2", str(src), str(inc)).returncode == 0
    assert qemu_img("compare", "-f", "raw", "-F", "qcow2", str(src), str(base)).returncode == 1  # it did change
    assert len(layout.data) == 2 and os.path.getsize(inc) < 8 * q.CLUSTER


def test_an_empty_image_and_cluster_runs():
    layout = q.Layout(64 * MIB, [])
    assert layout.l2_tables == [] and layout.metadata()[:4] == b"QFI\xfb"
    assert q.runs([0, 1, 2, 5, 6, 9], most=2) == [(0, 2), (2, 1), (5, 2), (9, 1)]
    assert q.clusters_of([(q.CLUSTER - 1, 2), (10 * q.CLUSTER, 0)], 64 * MIB) == [0, 1]
