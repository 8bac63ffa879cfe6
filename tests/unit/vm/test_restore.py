"""saltvirt.vm.restore through ``virt.restore`` on libvirt's test driver with real qcow2 files: verify,
rebuild into fresh disks, define; refusals that protect a running VM and damaged backups."""

import json
import os
import pathlib
import subprocess
import xml.etree.ElementTree as ET

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.xml.domain import metadata
from tests.support.saltloader import make_minion_mods
from tests.unit.vm.test_backup import CDROM, POOL_DISK, SHARED, bk, make_incremental, read_pattern, with_disks  # noqa: F401 - the fixture is shared

pytestmark = pytest.mark.usefixtures("bk")


def test_restore_beside_the_original_rebuilds_the_chain(bk):  # noqa: F811
    v, tmp = bk
    full = v["virt.backup"]("bk1")
    inc = make_incremental(pathlib.Path(full["dir"]), full, "20990101T000000Z")
    done = v["virt.restore"]("bk1", inc, as_name="bk1-copy")
    assert done["name"] == "bk1-copy" and done["chain"] == [full["id"], inc] and done["started"] is False
    (disk,) = done["disks"].values()
    assert disk.startswith(str(tmp / "images" / "bk1-copy") + "/")
    # flattened: no backing file, the full's data with the incremental's change on top
    info = json.loads(subprocess.check_output(["qemu-img", "info", "--output=json", disk]))
    assert "backing-filename" not in info
    assert read_pattern(disk, "0x22", 0, 65536) and read_pattern(disk, "0x11", 65536, 1048576 - 65536)
    conn = libvirt.open("test:///default")
    xml = conn.lookupByName("bk1-copy").XMLDesc(0)
    assert disk in xml and conn.lookupByName("bk1-copy").UUIDString() != conn.lookupByName("bk1").UUIDString()
    owned = json.loads((tmp / "images" / "bk1-copy" / ".salt-virt.json").read_text())
    assert owned["files"] == [disk] and owned["uuid"] == conn.lookupByName("bk1-copy").UUIDString()
    with pytest.raises(SaltInvocationError, match="exists already"):
        v["virt.restore"]("bk1", inc, as_name="bk1-copy")
    # restoring the full alone gives the full's data
    assert not read_pattern(v["virt.restore"]("bk1", full["id"], as_name="bk1-old")["disks"]["vda"], "0x22", 0, 65536)
    conn.lookupByName("bk1-old").undefine()


def test_restore_in_place_refuses_a_running_vm_unless_forced(bk):  # noqa: F811
    v, tmp = bk
    made = v["virt.backup"]("bk1")
    old_disk = v["virt.get_disks"]("bk1")["vda"]["file"]
    v["virt.start"]("bk1")
    with pytest.raises(CommandExecutionError, match="is running"):
        v["virt.restore"]("bk1", made["id"])
    assert v["virt.vm_state"]("bk1") == {"bk1": "running"}
    done = v["virt.restore"]("bk1", made["id"], force=True, start=True)
    assert done["replaced"]["removed"] == [old_disk] and done["started"] is True
    assert v["virt.get_disks"]("bk1")["vda"]["file"] == done["disks"]["vda"]


def test_damaged_backup_is_never_restored(bk):  # noqa: F811
    v, tmp = bk
    made = v["virt.backup"]("bk1")
    path = pathlib.Path(made["dir"]) / made["disks"][0]["file"]
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x66 0 4k", str(path)], check=True, capture_output=True)
    with pytest.raises(CommandExecutionError, match="checksum mismatch"):
        v["virt.restore"]("bk1", made["id"], as_name="bk1-copy")
    assert not (tmp / "images" / "bk1-copy").exists() or not list((tmp / "images" / "bk1-copy").iterdir())
    with pytest.raises(SaltInvocationError, match="VM bk1 has no backup 20990101T000000Z in "):
        v["virt.restore"]("bk1", "20990101T000000Z")


def test_a_restored_copy_has_neither_the_minion_record_nor_the_nvram_file_of_the_original(bk):  # noqa: F811
    """Purging a copy that kept the original's <saltvirt:minion> deletes the original's minion key (salt-run
    virt.purge deletes the recorded key), and one <nvram> path makes both VMs write one UEFI variables file."""
    v, _tmp = bk
    conn = libvirt.open("test:///default")
    fw = "<loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader>"
    fw += "<nvram template='/usr/share/OVMF/OVMF_VARS.fd'>/var/lib/libvirt/qemu/nvram/bk1_VARS.fd</nvram></os>"
    root = ET.fromstring(conn.lookupByName("bk1").XMLDesc(0).replace("</os>", fw, 1))
    ns = metadata.METADATA_NS  # into the <saltvirt:vm> virt.init wrote (it records the image)
    ET.SubElement(root.find(f"metadata/{{{ns}}}vm"), f"{{{ns}}}minion", id="bk1", key_sha256="ab")
    conn.defineXML(ET.tostring(root, encoding="unicode"))
    original = v["virt.vm_info"]("bk1")["bk1"]
    assert original["minion"] == {"id": "bk1", "key_sha256": "ab"} and original["image"].endswith("src.qcow2")
    made = v["virt.backup"]("bk1")
    done = v["virt.restore"]("bk1", made["id"], as_name="bk1-copy")
    copied = v["virt.vm_info"]("bk1-copy")["bk1-copy"]
    assert copied["minion"] is None and copied["image"] == original["image"]  # made from the same image
    assert "connects to the master as minion bk1" in done["note"]
    copy = ET.fromstring(conn.lookupByName("bk1-copy").XMLDesc(0))
    assert (
        copy.find("os/nvram").text is None and copy.find("os/nvram").get("template") == "/usr/share/OVMF/OVMF_VARS.fd"
    )
    assert "/var/lib/libvirt/qemu/nvram/bk1_VARS.fd" in conn.lookupByName("bk1").XMLDesc(0)  # the original's
    conn.close()


def test_a_restore_in_place_keeps_the_disks_the_backup_does_not_know(bk):  # noqa: F811
    """A disk added after the backup holds data the backup does not have: the restore leaves it in place,
    detached, and says so; only the disks it restores over go."""
    v, _tmp = bk
    made = v["virt.backup"]("bk1")
    old_vda = v["virt.get_disks"]("bk1")["vda"]["file"]
    v["virt.update"]("bk1", disks=[{"system": {}}, {"data": {"size": 8}}])
    added = v["virt.get_disks"]("bk1")["vdb"]["file"]
    done = v["virt.restore"]("bk1", made["id"])
    assert done["replaced"]["removed"] == [old_vda] and done["detached"] == {"vdb": added}
    assert os.path.isfile(added) and not os.path.exists(old_vda)
    assert sorted(v["virt.get_disks"]("bk1")) == ["vda"]


def test_a_manifest_changed_in_the_backup_directory_is_never_restored(bk, tmp_path_factory):  # noqa: F811
    """Write access to a shared backup directory is not the operator's: a manifest edited there (here: a host
    file added to the recorded domain XML) or written from scratch does not carry the MAC of the hypervisor's
    backup key, and nothing is defined from it. A hypervisor sharing the directory restores with the same key
    (virt:backup:key_file); with another key it refuses too."""
    v, tmp = bk
    made = v["virt.backup"]("bk1")
    path = pathlib.Path(made["dir"]) / f"{made['id']}.json"
    m = json.loads(path.read_text())
    evil = "<disk type='file' device='disk'><source file='/etc/shadow'/><target dev='vdz'/></disk></devices>"
    m["domain_xml"] = m["domain_xml"].replace("</devices>", evil)
    path.write_text(json.dumps(m))
    listed = v["virt.backup_list"]("bk1")
    assert listed["backups"] == [] and "does not carry the MAC" in listed["broken"][made["id"]]
    with pytest.raises(CommandExecutionError, match=f"backup {made['id']} of VM bk1 cannot be restored: its manifest"):
        v["virt.restore"]("bk1", made["id"], as_name="bk1-copy")
    assert "bk1-copy" not in v["virt.list_domains"]()
    m.pop("mac")
    path.write_text(json.dumps(m))  # unsigned: the same
    with pytest.raises(CommandExecutionError, match="does not carry the MAC of this hypervisor's backup key"):
        v["virt.restore"]("bk1", made["id"], as_name="bk1-copy")

    good = v["virt.backup"]("bk1")
    key_file = str(tmp / "pki" / "salt-virt-backups.key")
    for key, ok in ((key_file, True), (None, False)):  # another hypervisor: the shared key, or its own
        other = make_minion_mods(
            tmp_path_factory.mktemp("hv2"), "test:///default", backup={"dir": str(tmp / "backups"), "key_file": key}
        )
        assert [b["id"] for b in other["virt.backup_list"]("bk1")["backups"]] == ([good["id"]] if ok else [])
    with pytest.raises(CommandExecutionError, match="the key /nonexistent/k cannot be read"):
        make_minion_mods(
            tmp_path_factory.mktemp("hv3"), "test:///default", backup={"dir": str(tmp), "key_file": "/nonexistent/k"}
        )["virt.backup_list"]("bk1")


def test_disks_the_backup_does_not_hold_pass_the_door_of_every_disk(bk):  # noqa: F811
    """A pool volume (never backed up) stays in the restored definition only when attach.admit takes it, as for
    any disk a VM is given: a copy never shares the original's volume, a pool the operator no longer lists is
    refused, the VM's own volume is kept in place. A CD-ROM whose medium does not pass is restored empty; a
    file disk outside virt:images and virt:allowed_paths is refused."""
    v, tmp = bk
    (tmp / "bkp").mkdir()
    v["virt.pool_define"]("bkp", "dir", target=str(tmp / "bkp"))
    conn = libvirt.open("test:///default")
    try:
        v["virt.volume_define"]("bkp", "shared", 4)
        (tmp / "bkp" / "shared").write_bytes(b"\0" * 4096)
        with_disks("bk1", POOL_DISK.format(pool="bkp", volume="shared"), CDROM.format(path="/etc/hostname"))
        made = v["virt.backup"]("bk1")
        assert sorted(made["skipped"]) == ["sda", "vdb"]
        with pytest.raises(SaltInvocationError, match=r"of VM bk1: pool 'bkp' is not one the operator made available"):
            v["virt.restore"]("bk1", made["id"])  # this minion's virt:pools does not list bkp
        # the same hypervisor once the operator lists the pool (one loader per process at a time: v is done)
        ops = make_minion_mods(tmp, "test:///default", pools=["bkp"], backup={"dir": str(tmp / "backups")})
        copy = f"restoring backup {made['id']} of VM bk1 as bk1-copy: disk vdb: volume bkp/shared is a disk of VM 'bk1'"
        with pytest.raises(SaltInvocationError, match=f"^{copy}: refused"):
            ops["virt.restore"]("bk1", made["id"], as_name="bk1-copy")
        assert "bk1-copy" not in ops["virt.list_domains"]() and not (tmp / "images" / "bk1-copy").exists()
        done = ops["virt.restore"]("bk1", made["id"])  # in place: its own volume
        assert "<source pool='bkp' volume='shared'/>" in conn.lookupByName("bk1").XMLDesc(0)
        assert list(done["ejected"]) == ["sda"] and "/etc/hostname is outside the directories" in done["ejected"]["sda"]
        assert ET.fromstring(conn.lookupByName("bk1").XMLDesc(0)).find("devices/disk[@device='cdrom']/source") is None
        outside = tmp / "elsewhere.raw"
        outside.write_bytes(b"\0" * 4096)
        with_disks("bk1", SHARED.format(path=outside))
        again = ops["virt.backup"]("bk1")
        with pytest.raises(
            SaltInvocationError, match=f"of VM bk1: path of disk vdc {outside} is outside the directories"
        ):
            ops["virt.restore"]("bk1", again["id"])
        assert (
            "bk1" in ops["virt.list_domains"]()
            and not (tmp / "images" / "bk1" / f"vda-restored-{again['id']}.qcow2").exists()
        )
    finally:
        for name in ("bk1",):
            conn.lookupByName(name).undefine()
        pool = conn.storagePoolLookupByName("bkp")
        pool.destroy()
        pool.undefine()
        conn.close()


def test_a_file_swapped_in_the_backup_directory_after_its_check_is_never_read(bk, monkeypatch):  # noqa: F811
    """A writer of a shared backup directory who swaps a backup file between its check and its copy (a qcow2
    backing onto a host file) gets nothing in: the restore reads the private copy it checked. The swap is
    made at that moment by wrapping images.clone (a concurrent writer cannot be timed otherwise)."""
    v, tmp = bk
    made = v["virt.backup"]("bk1")
    shared = pathlib.Path(made["dir"]) / made["disks"][0]["file"]
    host_file = tmp / "host-secret.raw"
    host_file.write_bytes(b"\x77" * (1 << 20))
    from saltvirt.storage import images

    real_clone = images.clone

    def swap_then_clone(src, dst, **kwargs):
        shared.unlink()
        cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(host_file), str(shared), "16M"]
        subprocess.run(cmd, check=True)
        return real_clone(src, dst, **kwargs)

    monkeypatch.setattr(images, "clone", swap_then_clone)
    done = v["virt.restore"]("bk1", made["id"], as_name="bk1-copy")
    assert read_pattern(done["disks"]["vda"], "0x11", 0, 1048576)  # the backup's data, not the host file's
