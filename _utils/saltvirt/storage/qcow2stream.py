"""A qcow2 image written front to back in one pass: every metadata cluster first, then the data clusters
in the order of the virtual disk. Because nothing is ever rewritten, a checksum taken of the bytes as
they are written is the checksum of the file (what a backup records) without reading it again.

That needs the allocated clusters known before the first byte: a backup knows them from the NBD
export's block status (allocation for a full copy, the dirty bitmap for an incremental one). Clusters
not listed are unallocated: zeros, or the backing file's data when the image has one.

Layout (qcow2 version 3, 64 KiB clusters, 16-bit refcounts, every cluster's refcount 1)::

    cluster 0           header, header extensions (backing format), backing file name
    refcount table      then its refcount blocks
    L1 table            then one L2 table per 512 MiB of virtual disk holding any data
    data clusters       in virtual order
"""

import struct
from collections.abc import Callable, Iterable

CLUSTER_BITS = 16
CLUSTER = 1 << CLUSTER_BITS
L2_ENTRIES = CLUSTER // 8  # one L2 table maps 512 MiB
REFCOUNTS_PER_BLOCK = CLUSTER // 2  # 16-bit refcounts
COPIED = 1 << 63  # refcount is exactly 1: QEMU may write in place
HEADER_LEN = 104
EXT_BACKING_FORMAT = 0xE2792ACA


def _clusters(n: int) -> int:
    return (n + CLUSTER - 1) // CLUSTER


def clusters_of(extents: Iterable[tuple[int, int]], size: int) -> list[int]:
    """The cluster indexes covering ``extents`` (``(offset, length)`` in bytes, any alignment), sorted."""
    out: set[int] = set()
    for offset, length in extents:
        if length > 0:
            out.update(range(offset // CLUSTER, min(_clusters(offset + length), _clusters(size))))
    return sorted(out)


class Layout:
    """Where every cluster of the image goes, for ``size`` bytes of virtual disk whose clusters
    ``data`` (indexes, sorted) are allocated; ``backing``: the backing file's name (qcow2), or None."""

    def __init__(self, size: int, data: list[int], backing: str | None = None):
        self.size, self.data, self.backing = size, data, backing
        self.l1_size = max(1, (_clusters(size) + L2_ENTRIES - 1) // L2_ENTRIES)
        self.l2_tables = sorted({c // L2_ENTRIES for c in data})
        l1_clusters = _clusters(self.l1_size * 8)
        fixed = 1 + l1_clusters + len(self.l2_tables) + len(data)
        blocks = table = 1
        while True:  # the refcounts cover themselves: grow until they do
            total = fixed + table + blocks
            need_blocks = (total + REFCOUNTS_PER_BLOCK - 1) // REFCOUNTS_PER_BLOCK
            need_table = _clusters(need_blocks * 8)
            if (need_blocks, need_table) == (blocks, table):
                break
            blocks, table = need_blocks, need_table
        self.total = total
        self.rt_offset = CLUSTER
        self.rb_offset = self.rt_offset + table * CLUSTER
        self.rt_clusters, self.rb_count = table, blocks
        self.l1_offset = self.rb_offset + blocks * CLUSTER
        self.l2_offset = self.l1_offset + l1_clusters * CLUSTER
        self.data_offset = self.l2_offset + len(self.l2_tables) * CLUSTER

    def file_size(self) -> int:
        return self.total * CLUSTER

    def metadata(self) -> bytes:
        """Every byte of the file before the first data cluster."""
        return self._header() + self._refcounts() + self._l1() + self._l2()

    def _header(self) -> bytes:
        name = (self.backing or "").encode()
        ext = b""
        if name:
            fmt = b"qcow2"
            ext = struct.pack(">II", EXT_BACKING_FORMAT, len(fmt)) + fmt + b"\0" * (-len(fmt) % 8)
        ext += struct.pack(">II", 0, 0)  # end of the extensions
        name_offset = HEADER_LEN + len(ext)
        if name_offset + len(name) > CLUSTER:
            raise ValueError("backing file name too long for the header cluster")
        head = struct.pack(
            ">4sIQIIQIIQQIIQQQQII",
            b"QFI\xfb",
            3,
            name_offset if name else 0,
            len(name),
            CLUSTER_BITS,
            self.size,
            0,  # no encryption
            self.l1_size,
            self.l1_offset,
            self.rt_offset,
            self.rt_clusters,
            0,  # no snapshots
            0,
            0,  # incompatible features: none (clean, no external data file)
            0,
            0,
            4,  # refcount_order: 16 bits
            HEADER_LEN,
        )
        out = head + ext + name
        return out + b"\0" * (CLUSTER - len(out))

    def _refcounts(self) -> bytes:
        table = b"".join(struct.pack(">Q", self.rb_offset + i * CLUSTER) for i in range(self.rb_count))
        table += b"\0" * (self.rt_clusters * CLUSTER - len(table))
        counts = struct.pack(">H", 1) * self.total
        return table + counts + b"\0" * (self.rb_count * CLUSTER - len(counts))

    def _l1(self) -> bytes:
        entries = [0] * self.l1_size
        for i, region in enumerate(self.l2_tables):
            entries[region] = (self.l2_offset + i * CLUSTER) | COPIED
        raw = struct.pack(f">{self.l1_size}Q", *entries)
        return raw + b"\0" * (-len(raw) % CLUSTER)

    def _l2(self) -> bytes:
        tables = {region: [0] * L2_ENTRIES for region in self.l2_tables}
        for i, c in enumerate(self.data):
            tables[c // L2_ENTRIES][c % L2_ENTRIES] = (self.data_offset + i * CLUSTER) | COPIED
        return b"".join(struct.pack(f">{L2_ENTRIES}Q", *tables[r]) for r in self.l2_tables)


def runs(clusters: list[int], most: int) -> list[tuple[int, int]]:
    """``(first cluster, count)`` of the consecutive runs in ``clusters``, none longer than ``most``."""
    out: list[tuple[int, int]] = []
    for c in clusters:
        if out and out[-1][0] + out[-1][1] == c and out[-1][1] < most:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((c, 1))
    return out


def pieces(layout: Layout, chunk: int = 1 << 22) -> list[tuple[int, int, int]]:
    """``(offset, length, padding)`` of the virtual disk to put after :meth:`Layout.metadata`, in file
    order: ``length`` bytes read at ``offset``, then ``padding`` zero bytes (the last cluster past the
    disk's end)."""
    out = []
    for first, count in runs(layout.data, chunk // CLUSTER):
        offset = first * CLUSTER
        length = min(count * CLUSTER, layout.size - offset)
        out.append((offset, length, count * CLUSTER - length))
    return out


def write(
    layout: Layout,
    read: Callable[[int, int], bytes | memoryview],
    emit: Callable[[bytes | memoryview], object],
    chunk: int = 1 << 22,
) -> None:
    """Produce the image: ``emit`` gets its bytes in file order; ``read(offset, length)`` returns the
    virtual disk's bytes of an allocated run."""
    emit(layout.metadata())
    for offset, length, padding in pieces(layout, chunk):
        data = read(offset, length)
        if len(data) != length:
            raise OSError(f"short read at {offset}: {len(data)} of {length} bytes")
        emit(data)
        if padding:
            emit(b"\0" * padding)
