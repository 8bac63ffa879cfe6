"""saltvirt.xml.domain.edit: an existing definition changed with the element builders: disks moved, CD-ROMs
ejected, definitions restored beside or over the original."""

import xml.etree.ElementTree as ET

import pytest

from saltvirt.xml.domain import definition, edit, metadata


def test_move_disks_moves_only_mapped_disks_and_drops_their_backing_chain():
    xml = """<domain><name>m</name><devices>
      <disk type='file' device='disk'><source file='/a/m/system.qcow2'/>
        <backingStore type='file'><format type='qcow2'/><source file='/a/.bases/b.qcow2'/></backingStore>
        <target dev='vda'/></disk>
      <disk type='file' device='disk'><source file='/shared/data.raw'/><backingStore/><target dev='vdb'/></disk>
    </devices></domain>"""
    out = ET.fromstring(edit.move_disks(xml, {"/a/m/system.qcow2": "/b/m/system.qcow2"}))
    vda, vdb = out.findall("devices/disk")
    assert vda.find("source").get("file") == "/b/m/system.qcow2" and vda.find("backingStore") is None
    assert vdb.find("source").get("file") == "/shared/data.raw" and vdb.find("backingStore") is not None


def test_restored_beside_the_original_gets_a_new_identity_and_qcow2_disks():
    """A restore with as_name: renamed, no uuid or MACs (libvirt makes new ones), serial log renamed,
    moved disks qcow2 whatever they were; an unmoved disk is left as it was."""
    xml = """<domain><name>web1</name><uuid>0f3c2a44-1b5e-4e0c-9a8f-1234567890ab</uuid><devices>
      <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/i/web1/system.raw'/>
        <target dev='vda'/></disk>
      <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/shared/x.raw'/>
        <target dev='vdb'/></disk>
      <interface type='bridge'><mac address='52:54:00:00:00:01'/><source bridge='br0'/></interface>
      <serial type='pty'><log file='/var/log/libvirt/qemu/web1-serial.log'/></serial>
    </devices></domain>"""
    out = ET.fromstring(edit.restored(xml, {"/i/web1/system.raw": "/i/web2/vda.qcow2"}, new_name="web2"))
    assert out.findtext("name") == "web2" and out.find("uuid") is None
    assert out.find("devices/interface/mac") is None
    assert out.find("devices/serial/log").get("file") == "/var/log/libvirt/qemu/web2-serial.log"
    vda, vdb = out.findall("devices/disk")
    assert (vda.find("source").get("file"), vda.find("driver").get("type")) == ("/i/web2/vda.qcow2", "qcow2")
    assert (vdb.find("source").get("file"), vdb.find("driver").get("type")) == ("/shared/x.raw", "raw")
    same = ET.fromstring(edit.restored(xml, {"/i/web1/system.raw": "/i/web1/vda.qcow2"}))
    assert same.findtext("name") == "web1" and same.findtext("uuid") == "0f3c2a44-1b5e-4e0c-9a8f-1234567890ab"
    assert same.find("devices/interface/mac").get("address") == "52:54:00:00:00:01"


def test_restored_copy_gets_neither_the_minion_record_nor_the_nvram_file_of_the_original():
    """A copy with the original's <saltvirt:minion> would delete the original's minion key when purged, and
    with its <nvram> path both VMs would share (and a purge delete) one UEFI variables file."""
    meta = f"<metadata><sv:vm xmlns:sv='{metadata.METADATA_NS}'><sv:minion id='web1' key_sha256='ab'/>"
    meta += "<sv:owner tenant='acme' creator='alice'/></sv:vm></metadata>"
    loader = "<loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader>"
    for nvram, want in (
        (
            "<nvram template='/usr/share/OVMF/OVMF_VARS.fd'>/var/lib/libvirt/qemu/nvram/web1_VARS.fd</nvram>",
            {"template": "/usr/share/OVMF/OVMF_VARS.fd"},
        ),
        ("<nvram>/var/lib/libvirt/qemu/nvram/web1_VARS.fd</nvram>", None),
        ("<nvram type='file'><source file='/var/lib/libvirt/qemu/nvram/web1_VARS.fd'/></nvram>", None),
    ):
        xml = f"<domain><name>web1</name>{meta}<os><type>hvm</type>{loader}{nvram}</os><devices/></domain>"
        copy = ET.fromstring(edit.restored(xml, {}, new_name="web2"))
        assert definition.parse(copy)["minion"] is None and definition.parse(copy)["owner"] == {
            "tenant": "acme",
            "creator": "alice",
        }
        el = copy.find("os/nvram")
        assert (None if el is None else (dict(el.attrib), el.text, list(el))) == (
            None if want is None else (want, None, [])
        ), nvram
        same = ET.fromstring(edit.restored(xml, {}))  # in place: the same VM keeps its key and variables
        assert definition.parse(same)["minion"] == {"id": "web1", "key_sha256": "ab"}
        assert ET.tostring(same.find("os/nvram")) == ET.tostring(ET.fromstring(xml).find("os/nvram"))


def test_eject_empties_the_named_cdrom_drives_only():
    xml = """<domain><name>web1</name><devices>
      <disk type='file' device='cdrom'><source file='/i/web0/cidata.iso'/><target dev='sda'/><readonly/></disk>
      <disk type='file' device='cdrom'><source file='/srv/iso/x.iso'/><target dev='sdb'/><readonly/></disk>
      <disk type='file' device='disk'><source file='/i/web1/vda.qcow2'/><target dev='vda'/></disk>
    </devices></domain>"""
    out = ET.fromstring(edit.eject(xml, ["sda", "vda"]))
    sda, sdb, vda = out.findall("devices/disk")
    assert sda.find("source") is None and sda.find("target").get("dev") == "sda"  # the drive stays, empty
    assert sdb.find("source").get("file") == "/srv/iso/x.iso" and vda.find("source") is not None  # not a CD-ROM


def test_domain_readers_name_a_missing_devices_element():
    for call in (edit.disks_by_target, lambda x: edit.new_interfaces(x, ()), edit.edit_devices):
        with pytest.raises(ValueError, match="has no <devices>"):
            call("<domain><name>web1</name></domain>")
