"""saltvirt.xml.poolxml: pool/volume/secret specs and XML for every pool type Salt's virt.pool_define took.

Types whose servers cannot run on this machine (netfs needs an NFS/CIFS server, iscsi/iscsi-direct an iSCSI
target, rbd a Ceph cluster, gluster a Gluster volume, zfs the ZFS kernel module, scsi an HBA; the local
libvirtd also ships no rbd/gluster/zfs/iscsi-direct backend) are checked here: their XML against libvirt's
own RNG schema (virt-xml-validate) and defined on the test driver, read back without a difference. dir,
fs, logical and disk run for real in tests/integration/test_storage_real.py."""

import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.xml import poolxml

IQN = "iqn.2013-06.com.example:iscsi-pool"
CASES = {
    "dir": {"target": "/srv/p", "permissions": {"mode": "0750", "owner": 107, "group": 107, "label": "virt_image_t"}},
    "fs": {"target": "/mnt/fs", "source_devices": [{"path": "/dev/loop5"}], "source_format": "ext4"},
    "netfs": {
        "target": "/mnt/nfs",
        "source_hosts": ["nfs1.example.com"],
        "source_dir": "/export",
        "source_format": "nfs",
    },
    "netfs-cifs": {
        "target": "/mnt/cifs",
        "source_hosts": ["smb.example.com"],
        "source_dir": "samba_share",
        "source_format": "cifs",
    },
    "logical": {"source_devices": ["/dev/loop6"], "source_name": "vg0", "target": "/dev/vg0"},
    "disk": {
        "source_devices": [{"path": "/dev/loop7", "part_separator": True}],
        "target": "/dev",
        "source_format": "gpt",
    },
    "iscsi": {
        "target": "/dev/disk/by-path",
        "source_hosts": ["iscsi.example.com:3260"],
        "source_devices": [IQN],
        "source_auth": {"type": "chap", "username": "u", "secret": {"type": "usage", "value": "libvirtiscsi"}},
    },
    "iscsi-direct": {
        "source_hosts": ["iscsi.example.com"],
        "source_devices": [{"path": IQN}],
        "source_initiator": "iqn.2013-06.com.example:iscsi-initiator",
    },
    "rbd": {
        "source_hosts": ["mon1:6789", "mon2"],
        "source_name": "rbdpool",
        "source_auth": {
            "username": "admin",
            "secret": {"type": "uuid", "value": "2ec115d7-3a88-3ceb-bc12-0ac909a6fd87"},
        },
    },
    "gluster": {"source_hosts": ["gl1"], "source_name": "gv0", "source_dir": "/"},
    "zfs": {"source_name": "tank", "source_devices": ["/dev/sdz"]},
    "scsi": {
        "target": "/dev/disk/by-path",
        "source_adapter": {
            "type": "scsi_host",
            "parent_address": {
                "unique_id": 5,
                "address": {"domain": "0x0000", "bus": "0x00", "slot": "0x1f", "function": "0x2"},
            },
        },
    },
}


def validate_xml(tmp_path, xml, schema):
    """libvirt's own schema check (virt-xml-validate, from libvirt-clients; xmllint from libxml2-utils)."""
    assert shutil.which("virt-xml-validate") and shutil.which("xmllint"), "run scripts/setup.sh (libxml2-utils)"
    path = tmp_path / f"{schema}.xml"
    path.write_text(xml)
    proc = subprocess.run(["virt-xml-validate", str(path), schema], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{schema} XML rejected by libvirt's schema: {proc.stdout}{proc.stderr}\n{xml}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pool_type_validates_defines_and_reads_back(case, tmp_path, test_conn):
    ptype = case.split("-cifs")[0]
    spec = poolxml.pool_spec(f"p-{case}", ptype, **CASES[case])
    xml = poolxml.pool_xml(spec)
    validate_xml(tmp_path, xml, "storagepool")
    pool = test_conn.storagePoolDefineXML(xml, 0)
    back = poolxml.parse_pool(pool.XMLDesc(0))
    assert back["type"] == ptype and poolxml.pool_diff(spec, back) == {}
    # redefining from the current definition keeps the uuid and stays valid
    again = poolxml.pool_xml(spec, pool.XMLDesc(0))
    assert ET.fromstring(again).findtext("uuid") == pool.UUIDString()
    validate_xml(tmp_path, again, "storagepool")


def test_source_details_in_the_xml():
    root = ET.fromstring(poolxml.pool_xml(poolxml.pool_spec("r", "rbd", **CASES["rbd"])))
    assert [(h.get("name"), h.get("port")) for h in root.findall("source/host")] == [("mon1", "6789"), ("mon2", None)]
    auth = root.find("source/auth")
    assert (auth.get("type"), auth.get("username"), auth.find("secret").get("uuid")) == (
        "ceph",
        "admin",
        "2ec115d7-3a88-3ceb-bc12-0ac909a6fd87",
    )
    cifs = ET.fromstring(poolxml.pool_xml(poolxml.pool_spec("c", "netfs", **CASES["netfs-cifs"])))
    assert cifs.find("source/dir").get("path") == "samba_share" and cifs.find("source/format").get("type") == "cifs"
    disk = ET.fromstring(poolxml.pool_xml(poolxml.pool_spec("d", "disk", **CASES["disk"])))
    assert disk.find("source/device").attrib == {"path": "/dev/loop7", "part_separator": "yes"}
    perms = ET.fromstring(poolxml.pool_xml(poolxml.pool_spec("p", "dir", **CASES["dir"]))).find("target/permissions")
    assert [(e.tag, e.text) for e in perms] == [
        ("mode", "0750"),
        ("owner", "107"),
        ("group", "107"),
        ("label", "virt_image_t"),
    ]
    # Salt's docs wrote permissions as a YAML list of one-key dicts
    listed = poolxml.pool_spec("p", "dir", target="/x", permissions=[{"mode": "0770"}, {"owner": 1000}])
    assert listed["permissions"] == {"mode": "0770", "owner": "1000"}


@pytest.mark.parametrize(
    ("ptype", "kwargs", "message"),
    [
        ("lvm", {"target": "/x"}, "pool type must be one of"),
        ("dir", {}, "a dir pool needs target="),
        ("fs", {"target": "/mnt"}, "a fs pool needs source_devices"),
        ("netfs", {"target": "/mnt", "source_hosts": ["h"]}, "a netfs pool needs source_dir"),
        ("iscsi", {"source_hosts": ["h"]}, "an? iscsi pool needs source_devices"),
        ("iscsi-direct", {"source_hosts": ["h"], "source_devices": [IQN]}, "needs source_initiator"),
        ("rbd", {"source_name": "p"}, "needs source_hosts"),
        ("zfs", {}, "needs source_name"),
        ("scsi", {"target": "/dev"}, "needs source_adapter"),
        ("dir", {"target": "relative"}, "absolute path"),
        ("dir", {"target": "/x", "permissions": {"mode": "rwx"}}, "octal"),
        ("dir", {"target": "/x", "permissions": {"owner": "root"}}, "numeric id"),
        ("rbd", {"source_hosts": ["m"], "source_name": "p", "source_auth": {"username": "a"}}, "needs a password"),
        ("dir", {"target": "/x", "source_auth": {"username": "a", "password": "p"}}, "for rbd, iscsi"),
        ("rbd", {"source_hosts": ["m:port"], "source_name": "p"}, "host:port"),
        ("iscsi-direct", {"source_hosts": ["h"], "source_devices": [IQN], "source_initiator": "me"}, "IQN"),
        ("fs", {"target": "/m", "source_devices": [{"dev": "/dev/x"}]}, "path, part_separator"),
    ],
)
def test_bad_pool_input_is_a_clear_error(ptype, kwargs, message):
    with pytest.raises(SaltInvocationError, match=message):
        poolxml.pool_spec("bad", ptype, **kwargs)


def test_diff_ignores_libvirt_defaults_and_names_what_changed():
    spec = poolxml.pool_spec("vg", "logical", source_devices=["/dev/loop6"])
    current = poolxml.parse_pool(
        "<pool type='logical'><name>vg</name><source><device path='/dev/loop6'/><name>vg</name>"
        "<format type='lvm2'/></source><target><path>/dev/vg</path><permissions><mode>0755</mode>"
        "</permissions></target></pool>"
    )
    assert poolxml.pool_diff(spec, current) == {}
    other = poolxml.pool_spec("vg", "logical", source_devices=["/dev/loop9"], permissions={"mode": "0700"})
    assert poolxml.pool_diff(other, current) == {
        "permissions": {"old": {"mode": "0755"}, "new": {"mode": "0700"}},
        "source_devices": {"old": [{"path": "/dev/loop6"}], "new": [{"path": "/dev/loop9"}]},
    }


def test_password_never_shown():
    spec = poolxml.pool_spec(
        "r", "rbd", source_hosts=["m"], source_name="p", source_auth={"username": "a", "password": "s3cret"}
    )
    assert spec["source"]["auth"]["password"] == "s3cret"
    assert "s3cret" not in repr(poolxml.public(spec))
    diff = poolxml.pool_diff(spec, {"type": "rbd", "source": {}})
    assert "s3cret" not in repr(diff) and diff["source_auth"]["new"]["password"] == "***"


def test_volume_and_secret_xml(tmp_path):
    spec = poolxml.volume_spec(
        "v1",
        10,
        allocation=1,
        format="qcow2",
        permissions={"mode": "0600"},
        nocow=True,
        backing_store={"path": "/srv/b.img", "format": "raw"},
    )
    xml = poolxml.volume_xml(spec)
    validate_xml(tmp_path, xml, "storagevol")
    root = ET.fromstring(xml)
    assert root.findtext("capacity") == str(10 * 1024 * 1024) and root.findtext("allocation") == str(1024 * 1024)
    assert poolxml.parse_volume(xml)["backing_store"] == {"path": "/srv/b.img", "format": "raw"}
    validate_xml(tmp_path, poolxml.secret_xml("ceph", "pool_r", "d"), "secret")
    validate_xml(tmp_path, poolxml.secret_xml("chap", "pool_i", "d"), "secret")
    with pytest.raises(SaltInvocationError, match="never guessed"):
        poolxml.volume_spec("v", 1, backing_store={"path": "/srv/b.img"})
    with pytest.raises(SaltInvocationError, match="whole number of MiB"):
        poolxml.volume_spec("v", "big")
    with pytest.raises(SaltInvocationError, match="invalid volume name"):
        poolxml.volume_spec("../etc", 1)


GOLDEN_POOLS = ("dir", "logical", "disk", "netfs-cifs", "iscsi", "rbd", "gluster")


@pytest.mark.parametrize("case", GOLDEN_POOLS)
def test_golden_pool(golden, case):
    """Exactly the golden file, valid for libvirt's schema, defined on the test driver."""
    spec = poolxml.pool_spec(f"golden-{case}", case.split("-cifs")[0], **CASES[case])
    golden(f"poolxml/pool-{case}", poolxml.pool_xml(spec))


def test_golden_volumes(golden):
    spec = poolxml.volume_spec(
        "golden-vol",
        64,
        allocation=8,
        format="qcow2",
        permissions={"mode": "0600", "owner": 107, "group": 107},
        backing_store={"path": "/srv/images/base.qcow2", "format": "qcow2"},
    )
    golden("poolxml/volume-qcow2-backing", poolxml.volume_xml(spec))
    golden("poolxml/volume-raw", poolxml.volume_xml(poolxml.volume_spec("golden-raw", 16)))
