"""saltvirt.storage.images with the real qemu-img on copies of the test guest's disks, a real HTTP server on
127.0.0.1 and real files for the ownership manifest."""

import fcntl
import json
import os
import pathlib
import shutil
import stat
import struct
import subprocess

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.storage import images
from tests.support import toollimits

MIB = 1048576


def qemu_info(path):
    out = subprocess.run(["qemu-img", "info", "-U", "--output=json", path], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def same_content(a, b):
    return subprocess.run(["qemu-img", "compare", "-U", a, b], capture_output=True, check=False).returncode == 0


def snapshot(path):
    st = os.stat(path)
    with open(path, "rb") as fh:
        return st.st_ino, st.st_mtime_ns, st.st_size, fh.read()


@pytest.fixture
def base(tmp_path, guest):
    """Private copies of the guest images: {'raw': path, 'qcow2': path}."""
    out = {}
    for fmt in ("raw", "qcow2"):
        out[fmt] = str(tmp_path / f"base.{fmt}")
        shutil.copyfile(guest[fmt], out[fmt])
    return out


# image_info --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_image_info(base, fmt):
    info = images.image_info(base[fmt])
    assert info["format"] == fmt
    assert info["virtual_size"] == 64 * MIB
    assert info["actual_size"] > 0
    assert info["backing_file"] is None and info["backing_format"] is None
    assert info["chain"] == [base[fmt]]


def test_image_info_runs_qemu_img_capped(base, tmp_path, monkeypatch):
    """Issue 36 #3: the images it reads may be a caller's (an existing disk given to a VM)."""
    runs = toollimits.note_limits(monkeypatch, tmp_path)
    assert images.image_info(base["qcow2"], "qcow2")["format"] == "qcow2"
    assert runs() == [{"address space": ("1073741824", "1073741824"), "cpu time": ("30", "31")}]


def test_image_info_bad_input(tmp_path):
    with pytest.raises(SaltInvocationError, match="does not exist"):
        images.image_info(str(tmp_path / "nope.qcow2"))
    with pytest.raises(SaltInvocationError, match="absolute"):
        images.image_info("relative.qcow2")
    with pytest.raises(SaltInvocationError, match="non-empty"):
        images.image_info(None)


# clone -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("src_fmt, fmt", [("raw", None), ("qcow2", None), ("raw", "qcow2"), ("qcow2", "raw")])
def test_full_clone(base, tmp_path, src_fmt, fmt):
    dst = str(tmp_path / "copy.img")
    ret = images.clone(base[src_fmt], dst, fmt=fmt)
    want = fmt or src_fmt
    assert ret["path"] == dst and ret["format"] == want and ret["overlay"] is False and ret["backing"] is None
    assert ret["seconds"] >= 0
    info = images.image_info(dst)
    assert info["format"] == want and info["virtual_size"] == 64 * MIB and info["chain"] == [dst]
    assert same_content(base[src_fmt], dst)


def test_full_clone_of_an_overlay_flattens_the_chain(base, tmp_path):
    over = str(tmp_path / "over.qcow2")
    images.clone(base["qcow2"], over, overlay=True)
    flat = str(tmp_path / "flat.qcow2")
    images.clone(over, flat)
    assert images.image_info(flat)["chain"] == [flat]
    assert same_content(base["qcow2"], flat)


@pytest.mark.parametrize("src_fmt", ["qcow2", "raw"])
def test_overlay_records_backing_format_and_chain(base, tmp_path, src_fmt):
    before = snapshot(base[src_fmt])
    dst = str(tmp_path / "vm" / "system.qcow2")
    os.mkdir(tmp_path / "vm")
    ret = images.clone(base[src_fmt], dst, overlay=True)
    assert ret == dict(ret, path=dst, format="qcow2", overlay=True, backing=base[src_fmt])
    raw = qemu_info(dst)
    assert raw["backing-filename"] == base[src_fmt]  # absolute
    assert raw["backing-filename-format"] == src_fmt  # set explicitly, never probed
    info = images.image_info(dst)
    assert info["backing_file"] == base[src_fmt] and info["backing_format"] == src_fmt
    assert info["chain"] == [dst, base[src_fmt]]
    assert same_content(base[src_fmt], dst)
    # an overlay on the overlay: the chain has three layers
    top = str(tmp_path / "vm" / "top.qcow2")
    images.clone(dst, top, overlay=True)
    assert images.image_info(top)["chain"] == [top, dst, base[src_fmt]]
    assert qemu_info(top)["backing-filename-format"] == "qcow2"
    assert snapshot(base[src_fmt]) == before


def test_clone_never_overwrites(base, tmp_path):
    dst = tmp_path / "taken.qcow2"
    dst.write_bytes(b"someone's data")
    before = snapshot(dst)
    for overlay in (False, True):
        with pytest.raises(SaltInvocationError, match="already exists: refusing to overwrite"):
            images.clone(base["qcow2"], str(dst), overlay=overlay)
    assert snapshot(dst) == before
    link = tmp_path / "link.qcow2"  # a dangling symlink is "existing" too: never write through it
    link.symlink_to(tmp_path / "elsewhere.qcow2")
    with pytest.raises(SaltInvocationError, match="already exists"):
        images.clone(base["qcow2"], str(link))
    assert not (tmp_path / "elsewhere.qcow2").exists()


def test_clone_bad_input_creates_nothing(base, tmp_path):
    dst = str(tmp_path / "new.img")
    with pytest.raises(SaltInvocationError, match="always qcow2"):
        images.clone(base["raw"], dst, overlay=True, fmt="raw")
    with pytest.raises(SaltInvocationError, match="must be one of"):
        images.clone(base["raw"], dst, fmt="vmdk")
    with pytest.raises(SaltInvocationError, match="does not exist"):
        images.clone(str(tmp_path / "missing.qcow2"), dst)
    with pytest.raises(SaltInvocationError, match="without '..'"):
        images.clone(base["raw"], str(tmp_path / ".." / "x.img"))
    with pytest.raises(SaltInvocationError, match="does not exist: create it first"):
        images.clone(base["raw"], str(tmp_path / "nodir" / "x.img"))
    assert not os.path.lexists(dst)


@pytest.mark.parametrize("fmt", ["qcow2", "raw"])
def test_failed_clone_removes_only_what_it_created(base, tmp_path, fmt):
    """A source held open for writing by "a running VM": the copy is refused, the new file removed."""
    fd = os.open(base[fmt], os.O_RDWR)
    try:
        # the byte locks qemu holds for a writable disk (perm "write" = 101, "unshare write" = 201)
        for offset in (101, 201):
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hh4xqqi4x", fcntl.F_RDLCK, 0, offset, 1, 0))
        dst = str(tmp_path / f"copy.{fmt}")
        with pytest.raises(CommandExecutionError, match="in use by a running VM"):
            images.clone(base[fmt], dst)
        assert not os.path.lexists(dst)
    finally:
        os.close(fd)


# create_disk / resize ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["qcow2", "raw"])
def test_create_disk_and_grow(tmp_path, fmt):
    path = str(tmp_path / f"data.{fmt}")
    ret = images.create_disk(path, 16, fmt=fmt)
    assert ret["path"] == path and ret["format"] == fmt and ret["size_mb"] == 16
    assert images.image_info(path)["virtual_size"] == 16 * MIB
    assert os.stat(path).st_blocks * 512 < 4 * MIB  # sparse
    with pytest.raises(SaltInvocationError, match="already exists"):
        images.create_disk(path, 32, fmt=fmt)
    assert images.image_info(path)["virtual_size"] == 16 * MIB
    assert images.resize(path, 16)["changed"] is False
    grown = images.resize(path, "48")
    assert grown == {"path": path, "old_size": 16 * MIB, "new_size": 48 * MIB, "changed": True}
    with pytest.raises(SaltInvocationError, match="cannot shrink"):
        images.resize(path, 8)
    assert images.image_info(path)["virtual_size"] == 48 * MIB


@pytest.mark.parametrize("size", [0, -1, "lots", True, None])
def test_create_disk_bad_size(tmp_path, size):
    with pytest.raises(SaltInvocationError, match="positive integer"):
        images.create_disk(str(tmp_path / "d.qcow2"), size)
    assert not (tmp_path / "d.qcow2").exists()


# ownership manifest ------------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    """images/ with VM directories a/ and b/ and a file outside of both."""
    root = tmp_path / "images"
    for vm in ("a", "b"):
        (root / vm).mkdir(parents=True)
    outside = tmp_path / "precious.img"
    outside.write_bytes(b"not salt-virt's")
    return root, outside


def test_record_owned_writes_a_private_manifest_and_merges(tree):
    root, _ = tree
    vm_dir = str(root / "a")
    disk1, disk2 = f"{vm_dir}/system.qcow2", f"{vm_dir}/data.raw"
    images.record_owned(vm_dir, "a", [disk1])
    images.record_owned(vm_dir, "a", [disk2, disk1])
    path = os.path.join(vm_dir, ".salt-virt.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads(pathlib.Path(path).read_text())
    assert data["vm"] == "a" and data["uuid"] is None and data["files"] == [disk1, disk2] and data["created"]
    images.set_uuid(vm_dir, "1111-aaaa")
    assert json.loads(pathlib.Path(path).read_text())["uuid"] == "1111-aaaa"
    with pytest.raises(SaltInvocationError, match="is bound to uuid 1111-aaaa"):
        images.set_uuid(vm_dir, "2222-bbbb")
    with pytest.raises(SaltInvocationError, match="belongs to VM 'a'"):
        images.record_owned(vm_dir, "b", [disk1])
    assert os.listdir(vm_dir) == [".salt-virt.json"]  # no temp or lock files left behind


def test_owned_files_only_inside_and_only_for_this_vm(tree):
    root, outside = tree
    vm_dir = root / "a"
    (vm_dir / "system.qcow2").write_bytes(b"disk")
    (vm_dir / "escape.qcow2").symlink_to(outside)  # a symlink inside pointing outside
    with pytest.raises(SaltInvocationError, match="without '..'"):
        images.record_owned(str(vm_dir), "a", [f"{vm_dir}/../b/other.qcow2"])
    listed = [str(vm_dir / "system.qcow2"), str(vm_dir / "escape.qcow2"), str(outside)]
    images.record_owned(str(vm_dir), "a", listed, vm_uuid="u-1")
    manifest = vm_dir / ".salt-virt.json"  # edited by hand: '..' and relative entries count for nothing
    data = json.loads(manifest.read_text())
    data["files"] += [f"{vm_dir}/../b/other.qcow2", "system.qcow2"]
    manifest.write_text(json.dumps(data))
    (root / "b" / "other.qcow2").write_bytes(b"b's")
    assert images.owned_files(str(vm_dir), "a") == [str(vm_dir / "system.qcow2")]
    assert images.owned_files(str(vm_dir), "a", "u-1") == [str(vm_dir / "system.qcow2")]
    assert images.owned_files(str(vm_dir), "a", "u-2") == []  # a newer VM with the same name
    assert images.owned_files(str(vm_dir), "b") == []
    assert images.owned_files(str(root / "b"), "b") == []  # no manifest at all
    (vm_dir / ".salt-virt.json").write_text("{not json")
    assert images.owned_files(str(vm_dir), "a") == []


def test_remove_owned_deletes_only_owned_files_and_then_the_directory(tree):
    root, outside = tree
    vm_dir = root / "a"
    disk = vm_dir / "system.qcow2"
    disk.write_bytes(b"disk")
    foreign = vm_dir / "notes.txt"  # in the directory but not created by salt-virt
    foreign.write_bytes(b"mine")
    link = vm_dir / "link.qcow2"
    link.symlink_to(outside)
    images.record_owned(str(vm_dir), "a", [str(disk), str(link)], vm_uuid="u-1")
    candidates = [str(disk), str(foreign), str(outside), str(link), str(vm_dir / "gone.qcow2")]
    out = images.remove_owned(str(vm_dir), "a", "u-1", candidates)
    assert out["removed"] == [str(disk)]
    assert set(out["kept"]) == {str(foreign), str(outside), str(link), str(vm_dir / "gone.qcow2")}
    assert "did not create it" in out["kept"][str(foreign)]
    assert "outside" in out["kept"][str(outside)] and "outside" in out["kept"][str(link)]
    assert outside.read_bytes() == b"not salt-virt's" and foreign.read_bytes() == b"mine"
    assert sorted(os.listdir(vm_dir)) == ["link.qcow2", "notes.txt"]  # manifest gone: nothing owned is left
    foreign.unlink()
    link.unlink()
    images.record_owned(str(vm_dir), "a", [str(vm_dir / "x.raw")])
    (vm_dir / "x.raw").write_bytes(b"x")
    assert images.remove_owned(str(vm_dir), "a", None, [str(vm_dir / "x.raw")])["removed"] == [str(vm_dir / "x.raw")]
    assert not vm_dir.exists()  # empty: removed


def test_remove_owned_refuses_another_vms_files(tree):
    root, _ = tree
    vm_dir = root / "a"
    disk = vm_dir / "system.qcow2"
    disk.write_bytes(b"disk")
    images.record_owned(str(vm_dir), "a", [str(disk)], vm_uuid="u-old")
    out = images.remove_owned(str(vm_dir), "a", "u-new", [str(disk)])
    assert out["removed"] == [] and "another VM of that name (an earlier one" in out["kept"][str(disk)]
    out = images.remove_owned(str(vm_dir), "b", None, [str(disk)])
    assert out["removed"] == [] and "belongs to VM 'a'" in out["kept"][str(disk)]
    out = images.remove_owned(str(root / "b"), "b", None, str(root / "b" / "x"))  # a single path is fine too
    assert out["removed"] == [] and "no ownership manifest" in out["kept"][str(root / "b" / "x")]
    assert disk.exists() and (vm_dir / ".salt-virt.json").exists()


def test_remove_owned_keeps_backing_files_of_other_images(tree, base):
    """VM b's overlay backs onto VM a's disk: purging a keeps that disk until b is gone."""
    root, _ = tree
    a_disk = str(root / "a" / "system.qcow2")
    images.clone(base["qcow2"], a_disk)
    images.record_owned(str(root / "a"), "a", [a_disk], vm_uuid="u-a")
    b_disk = str(root / "b" / "system.qcow2")
    images.clone(a_disk, b_disk, overlay=True)
    images.record_owned(str(root / "b"), "b", [b_disk], vm_uuid="u-b")

    out = images.remove_owned(str(root / "a"), "a", "u-a", [a_disk])
    assert out["removed"] == [] and f"backing file of {b_disk}" in out["kept"][a_disk]
    assert os.path.exists(a_disk) and os.path.exists(root / "a" / ".salt-virt.json")
    assert images.image_info(b_disk)["chain"][:2] == [b_disk, a_disk]

    assert images.remove_owned(str(root / "b"), "b", "u-b", [b_disk])["removed"] == [b_disk]
    assert images.remove_owned(str(root / "a"), "a", "u-a", [a_disk])["removed"] == [a_disk]
    assert not (root / "a").exists() and not (root / "b").exists()


def test_remove_owned_deletes_a_chain_within_one_vm(tree, base):
    """Two disks of the same VM where one backs onto the other: both go in one call."""
    root, _ = tree
    vm_dir = root / "a"
    lower, upper = str(vm_dir / "lower.qcow2"), str(vm_dir / "upper.qcow2")
    images.clone(base["qcow2"], lower)
    images.clone(lower, upper, overlay=True)
    images.record_owned(str(vm_dir), "a", [lower, upper])
    out = images.remove_owned(str(vm_dir), "a", None, [lower, upper])
    assert sorted(out["removed"]) == sorted([lower, upper]) and out["kept"] == {}
    assert not vm_dir.exists()


def test_qcow2_virtual_size_reads_the_header_as_qemu_img_does(base, tmp_path):
    over = str(tmp_path / "o.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", over, "3G"], check=True)
    assert images.qcow2_virtual_size(over) == 3 << 30 == images.image_info(over, "qcow2")["virtual_size"]
    assert images.qcow2_virtual_size(base["qcow2"]) == images.image_info(base["qcow2"], "qcow2")["virtual_size"]
    with pytest.raises(CommandExecutionError, match="not a qcow2 image"):
        images.qcow2_virtual_size(base["raw"])


def test_qcow2_backing_reads_the_header(base, tmp_path):
    over = str(tmp_path / "o.qcow2")
    images.clone(base["raw"], over, overlay=True)
    assert images.qcow2_backing(over) == base["raw"]
    assert images.qcow2_backing(base["qcow2"]) is None
    assert images.qcow2_backing(base["raw"]) is None
