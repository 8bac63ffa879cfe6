"""saltvirt.guest.disklabel against the tools that write the layouts (sfdisk, mkfs.*) and blkid, which
names what it finds; layouts it must not answer for (extended partitions, damaged tables, a second
signature) give None so that seeding asks the kernel and blkid instead."""

import os
import struct
import subprocess

import pytest

from saltvirt.guest import disklabel

MIB = 1 << 20


def sh(*cmd, data=None):
    return subprocess.run(cmd, input=data, check=True, capture_output=True)


def blank(tmp_path, name, mib=16):
    path = tmp_path / name
    with open(path, "wb") as fh:
        fh.truncate(mib * MIB)
    return str(path)


def read(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return disklabel.partitions(fd, size), size
    finally:
        os.close(fd)


def fstype(path, offset=0, size=None):
    fd = os.open(path, os.O_RDONLY)
    try:
        return disklabel.fstype(fd, offset, size or os.fstat(fd).st_size)
    finally:
        os.close(fd)


def sfdisk_parts(path):
    import json

    table = json.loads(sh("sfdisk", "--json", path).stdout)["partitiontable"]
    return [(int(p["node"].rsplit(path, 1)[1]), p["start"] * 512, p["size"] * 512) for p in table["partitions"]]


@pytest.mark.parametrize(
    "script",
    [
        "label: dos\nstart=2048, size=4M, type=83\nstart=10240, type=82\n",
        "label: dos\nstart=2048, size=2M, type=83\nstart=8192, size=2M, type=83\nstart=16384, type=83\n",
        "label: gpt\nstart=2048, size=2M, type=uefi\nstart=6144, size=4M\nsize=2M, type=swap\n",
    ],
)
def test_partitions_are_the_ones_sfdisk_wrote(tmp_path, script):
    disk = blank(tmp_path, "disk.raw")
    sh("sfdisk", "-q", disk, data=script.encode())
    parts, _ = read(disk)
    assert [(p.number, p.offset, p.size) for p in parts] == sfdisk_parts(disk)


def test_no_table_is_the_whole_disk(tmp_path):
    disk = blank(tmp_path, "fs.raw")
    sh("mkfs.ext4", "-q", "-F", disk)
    assert read(disk)[0] == []


def _mbr(path, entries, boot=0):
    with open(path, "r+b") as fh:
        fh.seek(446)
        for kind, start, count in entries:
            fh.write(struct.pack("<B3xB3xII", boot, kind, start, count))
        fh.seek(510)
        fh.write(b"\x55\xaa")


@pytest.mark.parametrize(
    "entries, boot",
    [
        ([(0x83, 2048, 4096), (0x05, 8192, 8192)], 0),  # an extended partition: logical ones in a chain
        ([(0x83, 2048, 4096)], 0x12),  # no boot flag an MBR has: a boot sector's code
        ([(0x83, 2048, 64 * 2048)], 0),  # past the end of the 16 MiB disk
        ([(0x83, 2048, 8192), (0x83, 4096, 2048)], 0),  # overlapping
        ([(0x83, 0, 2048)], 0),  # starts at the table itself
    ],
)
def test_layouts_left_to_the_kernel(tmp_path, entries, boot):
    disk = blank(tmp_path, "odd.raw")
    _mbr(disk, entries, boot)
    assert read(disk)[0] is None


def test_a_gpt_claiming_huge_entries_is_not_read(tmp_path):
    """The entry size comes from the tenant's image: a header claiming 64 KiB entries (the table 8 MiB)
    is refused before the table is read, even with both checksums right (the read stays bounded)."""
    import zlib

    disk = blank(tmp_path, "gpt.raw")
    sh("sfdisk", "-q", disk, data=b"label: gpt\nstart=2048, size=4M\n")
    with open(disk, "r+b") as fh:
        fh.seek(512)
        header = bytearray(fh.read(92))
        count = struct.unpack_from("<I", header, 80)[0]
        fh.seek(1024)
        table = fh.read(count * 65536)
        struct.pack_into("<II", header, 84, 65536, zlib.crc32(table))  # entry size, the entries' CRC
        struct.pack_into("<I", header, 16, 0)
        struct.pack_into("<I", header, 16, zlib.crc32(bytes(header)))
        fh.seek(512)
        fh.write(header)
    assert read(disk)[0] is None


def test_a_damaged_gpt_is_left_to_the_kernel(tmp_path):
    disk = blank(tmp_path, "gpt.raw")
    sh("sfdisk", "-q", disk, data=b"label: gpt\nstart=2048, size=4M\n")
    assert read(disk)[0]
    with open(disk, "r+b") as fh:  # one byte of the first entry's first LBA: the entries' CRC no longer matches
        fh.seek(1024 + 32)
        fh.write(b"\x07")
    assert read(disk)[0] is None


@pytest.mark.parametrize(
    "mkfs, expected",
    [
        (["mkfs.ext2", "-q", "-F"], "ext2"),
        (["mkfs.ext3", "-q", "-F"], "ext3"),
        (["mkfs.ext4", "-q", "-F"], "ext4"),
        (["mkfs.ext4", "-q", "-F", "-O", "^has_journal"], "ext4"),
        (["mkfs.vfat"], "vfat"),
        (["mkswap"], None),
        (["mkfs.minix"], None),
        (None, None),
    ],
)
def test_fstype_agrees_with_blkid_or_leaves_it_to_blkid(tmp_path, mkfs, expected):
    disk = blank(tmp_path, "fs.raw")
    if mkfs:
        sh(*mkfs, disk)
    found = fstype(disk)
    assert found == expected
    named = subprocess.run(["blkid", "-p", "-o", "value", "-s", "TYPE", disk], check=False, capture_output=True)
    if found:
        assert named.stdout.decode().strip() == found


def test_fstype_at_a_partitions_offset(tmp_path):
    part, disk = blank(tmp_path, "part.raw", 8), blank(tmp_path, "disk.raw")
    sh("mkfs.ext4", "-q", "-F", part)
    sh("sfdisk", "-q", disk, data=b"label: dos\nstart=4096, size=8M, type=83\n")
    sh("dd", f"if={part}", f"of={disk}", "bs=1M", "seek=2", "conv=notrunc", "status=none")
    (only,), _ = read(disk)
    assert fstype(disk, only.offset, only.size) == "ext4"
    assert fstype(disk, 0, only.offset) is None  # the table's own sectors: nothing


def test_a_second_signature_is_left_to_blkid(tmp_path):
    disk = blank(tmp_path, "mixed.raw")
    sh("mkfs.ext4", "-q", "-F", disk)
    with open(disk, "r+b") as fh:
        fh.seek(512)
        fh.write(b"LABELONE")  # an LVM label beside the ext4 superblock
    assert fstype(disk) is None
