"""What is on a guest disk image, read from its bytes without a tool: the partition table (MBR or GPT)
and a filesystem's type from its superblock's signature. :mod:`saltvirt.guest.seed` uses it to find the
root filesystem with one loop device and no ``partx``/``blkid`` runs.

Only the plain, common layouts are answered: a layout this reader does not handle for certain (an
extended partition, a GPT of 4 KiB sectors or with a bad checksum, entries outside the disk or
overlapping, boot flags an MBR never has) gives ``None``, and the caller asks the kernel and
``blkid`` as before. Every offset and length read from the image is checked against the image's size
before use: the image is the tenant's and not trusted.
"""

import dataclasses
import itertools
import os
import struct
import zlib

SECTOR = 512
_EXTENDED = (0x05, 0x0F, 0x85)  # MBR extended partitions: logical partitions in a chain (left to the kernel)
_GPT_PROTECTIVE = 0xEE
_MAX_GPT_ENTRIES = 1024  # 128 is the usual
_MAX_GPT_ENTRY = 4096  # bytes; 128 is the usual

# ext2/3/4 feature bits (as libblkid tells the three apart)
_EXT_COMPAT_HAS_JOURNAL = 0x4
_EXT_INCOMPAT_JOURNAL_DEV = 0x8
_EXT_INCOMPAT_RECOVER = 0x4
_EXT3_INCOMPAT = 0x2 | 0x4 | 0x10  # filetype, recover, meta_bg
_EXT3_RO_COMPAT = 0x1 | 0x2 | 0x4  # sparse_super, large_file, btree_dir
_EXT_FLAGS_TEST_FS = 0x4
_PROBE_BYTES = 65536 + 4096  # up to and including btrfs's superblock at 64 KiB


@dataclasses.dataclass(frozen=True)
class Part:
    """One partition: its number (1-based, as the kernel names it), where it starts and its length, in bytes."""

    number: int
    offset: int
    size: int


def _pread(fd: int, length: int, offset: int) -> bytes:
    data = b""
    while len(data) < length:
        chunk = os.pread(fd, length - len(data), offset + len(data))
        if not chunk:
            break
        data += chunk
    return data


def partitions(fd: int, disk_size: int) -> list[Part] | None:
    """The partitions of the disk open as ``fd`` (``disk_size`` bytes) in number order; ``[]`` when it has
    no partition table (a filesystem on the whole disk); ``None`` when the layout is not one this reader
    answers for certain."""
    mbr = _pread(fd, SECTOR, 0)
    if len(mbr) < SECTOR or mbr[510:512] != b"\x55\xaa":
        return []
    entries = [struct.unpack_from("<B3xB3xII", mbr, 446 + 16 * i) for i in range(4)]
    if any(boot not in (0, 0x80) for boot, _, _, _ in entries):
        return None  # a boot sector (a FAT filesystem on the whole disk?), not a partition table
    if any(kind == _GPT_PROTECTIVE for _, kind, _, _ in entries):
        return _gpt(fd, disk_size)
    found = []
    for number, (_, kind, start, count) in enumerate(entries, 1):
        if kind == 0:
            continue
        if kind in _EXTENDED or start == 0 or count == 0:
            return None
        found.append(Part(number, start * SECTOR, count * SECTOR))
    return _checked(found, disk_size)


def _gpt(fd, disk_size):
    header = _pread(fd, SECTOR, SECTOR)
    if len(header) < 92 or header[:8] != b"EFI PART":
        return None  # 4 KiB sectors, or only the backup header is left: the kernel's job
    size, crc = struct.unpack_from("<II", header, 12)
    if not 92 <= size <= SECTOR or zlib.crc32(header[:16] + b"\0\0\0\0" + header[20:size]) != crc:
        return None
    table_lba, count, entry_size, table_crc = struct.unpack_from("<QIII", header, 72)
    if count > _MAX_GPT_ENTRIES or not 128 <= entry_size <= _MAX_GPT_ENTRY or entry_size % 8 or table_lba < 2:
        return None  # the table read below stays within 1,024 x 4 KiB whatever the header claims
    length = count * entry_size
    if table_lba * SECTOR + length > disk_size:
        return None
    table = _pread(fd, length, table_lba * SECTOR)
    if len(table) < length or zlib.crc32(table) != table_crc:
        return None
    found = []
    for number in range(1, count + 1):
        entry = table[(number - 1) * entry_size : number * entry_size]
        if entry[:16] == b"\0" * 16:
            continue  # unused
        first, last = struct.unpack_from("<QQ", entry, 32)
        if first == 0 or last < first:
            return None
        found.append(Part(number, first * SECTOR, (last - first + 1) * SECTOR))
    return _checked(found, disk_size)


def _checked(found, disk_size):
    """``found`` when every partition lies inside the disk and none overlaps another, else None."""
    spans = sorted((p.offset, p.offset + p.size) for p in found)
    if any(end > disk_size for _, end in spans) or any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        return None
    return found


def fstype(fd: int, offset: int, size: int) -> str | None:
    """The filesystem type (``blkid``'s name) at ``offset`` of ``fd`` (a region of ``size`` bytes) when it
    is ext2/3/4, xfs or btrfs with no other signature beside it, or a FAT filesystem; ``None`` for
    anything else or when unsure (``blkid`` names it)."""
    data = _pread(fd, min(_PROBE_BYTES, size), offset)
    if _other_signature(data):
        return None
    if len(data) >= 2048 and data[1080:1082] == b"\x53\xef":
        return _ext(data[1024:2048])
    if data[:4] == b"XFSB":
        return "xfs"
    if len(data) >= 65608 and data[65600:65608] == b"_BHRfS_M":
        return "btrfs"
    if len(data) >= SECTOR and data[510:512] == b"\x55\xaa" and (data[54:59] == b"FAT16" or data[54:59] == b"FAT12"):
        return "vfat"
    if len(data) >= SECTOR and data[510:512] == b"\x55\xaa" and data[82:87] == b"FAT32":
        return "vfat"
    return None


def _other_signature(data):
    """Whether ``data`` also carries a LUKS, LVM or swap signature (``blkid`` sorts out such mixes)."""
    if data[:6] == b"LUKS\xba\xbe" or data[:6] == b"SKUL\xba\xbe":
        return True
    if any(data[s : s + 8] == b"LABELONE" for s in range(0, 2048, SECTOR)):
        return True
    return data[4086:4096] in (b"SWAPSPACE2", b"SWAP-SPACE")


def _ext(sb):
    compat, incompat, ro_compat = struct.unpack_from("<III", sb, 92)
    flags = struct.unpack_from("<I", sb, 352)[0]
    if incompat & _EXT_INCOMPAT_JOURNAL_DEV or flags & _EXT_FLAGS_TEST_FS:
        return None  # an external journal, ext4dev: blkid's
    journal = bool(compat & _EXT_COMPAT_HAS_JOURNAL)
    if ro_compat & ~_EXT3_RO_COMPAT or incompat & ~_EXT3_INCOMPAT:
        return "ext4"
    if not journal:
        return None if incompat & _EXT_INCOMPAT_RECOVER else "ext2"
    return "ext3"
