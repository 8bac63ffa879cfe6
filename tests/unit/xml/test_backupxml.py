"""saltvirt.xml.backupxml: <domainbackup> and <domaincheckpoint>, pinned by golden files that libvirt's
schemas accept (and, for checkpoints, the test driver creates)."""

import xml.etree.ElementTree as ET

import pytest

from saltvirt.xml import backupxml

BACKUPS = {
    "push-full": dict(copy={"vda": "/srv/backups/web1/20260101T020000Z.vda.qcow2"}, skip=["vdb"]),
    "push-incremental": dict(
        copy={
            "vda": "/srv/backups/web1/20260102T020000Z.vda.qcow2",
            "vdb": "/srv/backups/web1/20260102T020000Z.vdb.qcow2",
        },
        incremental="salt-backup-20260101T020000Z",
    ),
}


@pytest.mark.parametrize("case", sorted(BACKUPS))
def test_golden_backup(golden, case):
    golden(f"backupxml/{case}", backupxml.backup_xml(**BACKUPS[case]))


def test_backup_copies_only_what_it_names():
    root = ET.fromstring(backupxml.backup_xml(**BACKUPS["push-full"]))
    assert root.get("mode") == "push" and root.find("incremental") is None
    assert [(d.get("name"), d.get("backup")) for d in root.findall("disks/disk")] == [("vda", "yes"), ("vdb", "no")]
    assert root.find("disks/disk/target").get("file").endswith(".vda.qcow2")


def test_golden_checkpoint_and_parse(golden):
    """The test driver's domain 'test' has one disk, vda: libvirt reads the bitmap back under our name."""
    xml = backupxml.checkpoint_xml("salt-backup-20260101T020000Z", ["vda"], description="salt-virt <&>")
    back = golden("backupxml/checkpoint-bitmap", xml)
    facts = backupxml.parse_checkpoint(back)
    assert facts["name"] == "salt-backup-20260101T020000Z" and facts["bitmaps"] == ["vda"]
    assert facts["created"] > 0 and facts["parent"] is None


def test_checkpoint_skips_disks_without_bitmaps():
    root = ET.fromstring(backupxml.checkpoint_xml("c", ["vda"], skip=["vdb"]))
    assert [(d.get("name"), d.get("checkpoint")) for d in root.findall("disks/disk")] == [
        ("vda", "bitmap"),
        ("vdb", "no"),
    ]


def test_redefine_xml_names_creation_time_and_bitmaps():
    """The XML that gives libvirt back a checkpoint's metadata: the test driver redefines it as written
    (its REDEFINE_VALIDATE, the check of the disks' bitmaps, needs QEMU: tests/integration/test_backup_real.py)."""
    import libvirt

    xml = backupxml.checkpoint_xml("salt-backup-20260101T020000Z", ["vda"], created=1767232800)
    conn = libvirt.open("test:///default")
    try:
        cp = conn.lookupByName("test").checkpointCreateXML(xml, libvirt.VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE)
        try:
            root = ET.fromstring(cp.getXMLDesc(libvirt.VIR_DOMAIN_CHECKPOINT_XML_NO_DOMAIN))
        finally:
            cp.delete(libvirt.VIR_DOMAIN_CHECKPOINT_DELETE_METADATA_ONLY)
    finally:
        conn.close()
    assert root.findtext("creationTime") == "1767232800"
    assert [(d.get("name"), d.get("bitmap")) for d in root.findall("disks/disk")] == [
        ("vda", "salt-backup-20260101T020000Z")
    ]


def test_backup_files_reads_back_what_backup_xml_wrote():
    xml = backupxml.backup_xml({"vda": "/b/web1/1.vda.qcow2", "vdb": "/b/web1/1.vdb.qcow2"}, skip=["sda"])
    assert backupxml.backup_files(xml) == ["/b/web1/1.vda.qcow2", "/b/web1/1.vdb.qcow2"]


PULLS = {
    "pull-full": dict(
        socket="/run/salt-virt-nbd-x/nbd.sock",
        scratch={"vda": "/srv/backups/web1/20260101T020000Z.vda.scratch.qcow2"},
        skip=["vdb"],
    ),
    "pull-incremental": dict(
        socket="/run/salt-virt-nbd-y/nbd.sock",
        scratch={"vda": "/srv/backups/web1/20260102T020000Z.vda.scratch.qcow2"},
        incremental="salt-backup-20260101T020000Z",
    ),
}


@pytest.mark.parametrize("case", sorted(PULLS))
def test_golden_pull_backup(golden, case):
    golden(f"backupxml/{case}", backupxml.pull_xml(**PULLS[case]))


def test_pull_job_exports_and_files_read_back_as_libvirt_describes_them():
    """A running pull job's XML as libvirt 9 gives it back (backupGetXMLDesc) names each disk's export and
    dirty bitmap; an interrupted job's scratch files are what a stale-job check must find."""
    running = (
        "<domainbackup mode='pull'><incremental>salt-backup-1</incremental>"
        "<server transport='unix' socket='/run/s/nbd.sock'/><disks>"
        "<disk name='vda' backup='yes' type='file' backupmode='incremental' incremental='salt-backup-1' "
        "exportname='vda' exportbitmap='backup-vda'><driver type='qcow2'/><scratch file='/b/1.vda.scratch.qcow2'/>"
        "</disk><disk name='vdb' backup='no'/></disks></domainbackup>"
    )
    assert backupxml.exports(running) == {"vda": ("vda", "backup-vda")}
    assert backupxml.backup_files(running) == ["/b/1.vda.scratch.qcow2"]
    assert backupxml.exports(backupxml.pull_xml(**PULLS["pull-full"])) == {"vda": ("vda", None)}
