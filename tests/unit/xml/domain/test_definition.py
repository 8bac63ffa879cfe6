"""saltvirt.xml.domain.definition: a whole domain definition built from a VM spec by the groups' builders and
read back by their readers, and golden files of what it builds, one per device kind (tests/golden/domain/, see
tests/support/golden.py)."""

import xml.etree.ElementTree as ET

import pytest

from saltvirt.model import vmargs
from saltvirt.model import vmspec as spec
from saltvirt.xml import etree
from saltvirt.xml.domain import boot, definition, devices, elements, metadata, tuning
from tests.support import golden as golden_files
from tests.support.goldenvm import vm


def test_xml_escapes_and_round_trips():
    s = spec.build(
        vmargs.InitRequest(
            "vm-1",
            2,
            1024,
            image="/i.qcow2",
            enable_vnc=True,
            boot={"kernel": "/v/k", "initrd": "/v/i", "cmdline": "console=ttyS0 x='<&>'"},
        ),
        image_format="qcow2",
        images_dir="/v",
    )
    xml = definition.build(s)
    root = ET.fromstring(xml)  # would raise if the cmdline broke the XML
    assert root.find("os/cmdline").text == "console=ttyS0 x='<&>'"
    facts = definition.parse(xml)
    assert (facts["cpu"], facts["mem"], facts["type"]) == (2, 1024, "qemu")
    assert facts["disks"][0]["file"] == "/v/vm-1/system.qcow2"
    assert facts["graphics"] == [
        {"type": "vnc", "port": -1, "autoport": True, "listen": "127.0.0.1", "password": True, "websocket": -1}
    ]
    assert facts["serial_log"] == "/var/log/libvirt/qemu/vm-1-serial.log"


def test_vnc_only_when_asked():
    assert "<graphics" not in definition.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None), images_dir="/v"))
    assert "<graphics" in definition.build(
        spec.build(vmargs.InitRequest("n", 1, 64, disk=None, enable_vnc=True), images_dir="/v")
    )


def test_domain_name_of_user_xml():
    assert definition.domain_name("<domain><name>web1</name></domain>") == "web1"
    assert definition.domain_name("<domain/>") is None
    with pytest.raises(ValueError, match="the domain XML does not parse"):
        definition.domain_name("<domain><name>web1</domain>")


def facts(xml):
    """What definition.parse reads, without what libvirt adds on define (uuid, interface target names)."""
    out = definition.parse(xml)
    out["uuid"] = None
    for nic in out["nics"]:
        nic["target"] = None
    return out


GOLDEN_CASES = {
    "minimal": vm(),
    "disk-file-qcow2": vm(
        disks=[spec.Disk("system", format="qcow2", path="/srv/vms/golden1/system.qcow2", target="vda")]
    ),
    "disk-file-raw-sata": vm(
        disks=[spec.Disk("data", format="raw", path="/srv/vms/golden1/data.raw", bus="sata", target="sda")]
    ),
    "disk-volume-qcow2": vm(
        disks=[spec.Disk("data", format="qcow2", pool="default-pool", volume="golden1_data", target="vdb")]
    ),
    "disk-cdrom": vm(
        disks=[spec.Disk("iso", format="raw", path="/srv/iso/install.iso", device="cdrom", bus="sata", target="sdb")]
    ),
    # the cloud-init seed volume exactly as spec.build makes it for cloud_init=... (saltvirt.guest.cloudinit)
    "disk-cidata": vm(
        disks=[
            spec.build(vmargs.InitRequest("golden1", 1, 64, disk=None, cloud_init=True), images_dir="/srv/vms").disks[0]
        ]
    ),
    "nic-bridge": vm(nics=[spec.Nic("eth0", type="bridge", source="br0", model="virtio", mac="52:54:00:6b:00:01")]),
    "nic-network": vm(nics=[spec.Nic("eth0", type="network", source="default", model="e1000")]),
    "nic-direct": vm(nics=[spec.Nic("eth0", type="direct", source="eno1", model="virtio", mac="52:54:00:6b:00:02")]),
    "graphics-vnc-autoport": vm(graphics=spec.Graphics(type="vnc")),
    "graphics-spice-port-password": vm(
        graphics=spec.Graphics(type="spice", listen="0.0.0.0", port=5901, password="s3cret&<x>")
    ),
    "boot-kernel-initrd-cmdline": vm(
        boot=spec.Boot(kernel="/srv/boot/vmlinuz", initrd="/srv/boot/initrd.img", cmdline="console=ttyS0 x='<&>'")
    ),
    # Salt's PXE/cobbler install: kernel boot now, this boot order once the kernel is taken away
    "boot-kernel-and-boot-dev": vm(
        boot=spec.Boot(kernel="/srv/boot/vmlinuz", initrd="/srv/boot/initrd.img", cmdline="autoyast=x"),
        boot_dev=["network", "hd"],
    ),
    "serial-log": vm(serial_log="/var/log/libvirt/qemu/golden1-serial.log"),
    "metadata-group": vm(group="web"),
    "kvm-aarch64": vm(vtype="kvm", arch="aarch64"),
    "guest-agent-channel": vm(guest_agent=True),
    "tcg-tb-cache": vm(vtype="qemu", tb_cache_mib=128),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(golden, case):
    """The XML of each device kind is exactly its golden file, valid for libvirt's schema, accepted by the
    test driver, and libvirt reads back the same facts from it as definition.parse does from ours."""
    xml = definition.build(GOLDEN_CASES[case])
    ours, libvirts = facts(xml), facts(golden(f"domain/{case}", xml))
    for mine, theirs in zip(ours["nics"], libvirts["nics"], strict=True):
        if mine["mac"] is None:  # libvirt generates one
            assert theirs["mac"].startswith("52:54:00:")
            theirs["mac"] = None
    assert libvirts == ours


def test_golden_check_catches_a_changed_builder():
    """A golden comparison that cannot fail would be worthless: a changed attribute is reported as a diff
    (compared even under --regen-golden, which must never write this altered XML)."""
    xml = definition.build(GOLDEN_CASES["nic-network"]).replace("e1000", "rtl8139")
    with pytest.raises(AssertionError, match=r"(?s)golden.*-.*e1000.*\+.*rtl8139"):
        golden_files.compare_or_write("domain/nic-network", xml, regen=False)
    with pytest.raises(AssertionError, match="no golden file tests/golden/domain/no-such-case.xml"):
        golden_files.compare_or_write("domain/no-such-case", xml, regen=False)


def test_facts_from_a_tree_parsed_once_equal_those_from_the_string():
    """query.describe parses a domain's XML once and hands the tree to parse/salt_facts/loader."""
    xml = (
        "<domain type='kvm'><name>t1</name><memory unit='KiB'>65536</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader></os>"
        "<on_reboot>restart</on_reboot><devices><disk type='file' device='disk'><source file='/x.qcow2'/>"
        "<target dev='vda' bus='virtio'/></disk></devices></domain>"
    )
    tree = etree.read(xml)
    assert etree.read(tree) is tree
    assert definition.parse(tree) == definition.parse(xml)
    assert boot.salt_facts(tree) == boot.salt_facts(xml)
    assert (
        boot.loader(tree)
        == boot.loader(xml)
        == {
            "path": "/usr/share/OVMF/OVMF_CODE.fd",
            "readonly": "yes",
            "type": "pflash",
        }
    )


def test_feature_facts_from_spec_build():
    """What virt.init's arguments become, read back the way virt.update compares them."""
    s = spec.build(
        vmargs.InitRequest(
            "f1",
            1,
            64,
            disk=None,
            nic=None,
            boot={"efi": "yes", "secure_boot": True},
            serials=[{"type": "tcp", "port": "4555", "protocol": "raw"}],
            consoles={"type": "pty"},
            tpm=True,
            watchdog=True,
            stop_on_reboot="true",
        ),
        images_dir="/v",
    )
    facts = definition.feature_facts(definition.build(s))
    assert facts == {
        "firmware": {"efi": True, "loader": None, "nvram": None, "secure_boot": True},
        "kernel_boot": {"kernel": None, "initrd": None, "cmdline": None},
        "boot_dev": ["hd"],
        "stop_on_reboot": True,
        "serials": [{"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "raw"}],
        "consoles": [{"type": "pty"}],
        "tpm": {"model": "tpm-crb", "version": "2.0"},
        "watchdog": {"model": "i6300esb", "action": "reset"},
        "rng": None,
        "clock": None,
        "hypervisor_features": {},
        "cpu_model": None,
        "memtune": None,
        "numatune": None,
        "vcpu": {"placement": "static", "cpuset": None},
        "cputune": None,
        "max_mem": None,
        "memory_backing": None,
        "host_devices": [],
    }
    root = ET.fromstring(definition.build(s))
    assert root.find("os/type").get("machine") == "q35" and root.find("features/smm").get("state") == "on"


def test_groups_compose_the_whole():
    """build writes every group's elements in libvirt's order (ORDER names each one), feature_facts reads each
    of FEATURES from exactly one group, parse is the groups' facts beside the domain's name, uuid and type."""
    s = spec.build(
        vmargs.InitRequest("f1", 2, 128, enable_vnc=True, clock={"timezone": "Europe/Paris"}, group="g"),
        images_dir="/v",
    )
    s.cpu_model, s.cputune, s.memtune = {"mode": "host-passthrough", "features": {}}, {"shares": 2}, {"hard_limit": 1}
    root = ET.fromstring(definition.build(s))
    tags = [el.tag for el in root]
    assert tags == sorted(tags, key=definition.ORDER.index)  # ORDER names each one (index() raises otherwise)
    readers = [boot.feature_facts(root), devices.feature_facts(root), tuning.feature_facts(root)]
    assert sorted(k for part in readers for k in part) == sorted(definition.FEATURES)
    parts = [tuning.facts(root), devices.facts(root), boot.facts(root), metadata.facts(root)]
    assert definition.parse(root) == {
        "name": "f1",
        "uuid": None,
        "type": "qemu",
        **{k: v for part in parts for k, v in part.items()},
    }


def test_every_row_of_its_own_has_its_element():
    """A checked row that fills no VMSpec field is an element of its own: exactly one group registers its builder
    and reader (elements.of), and virt.update manages it (FEATURES); a row without them would be dropped."""
    registered = [e.key for e in (*boot.ELEMENTS, *tuning.ELEMENTS, *devices.ELEMENTS)]
    own = [a.name for a in vmargs.ARGS if a.check is not None and a.into and a.into not in spec.FIELDS]
    assert own and sorted(own) == sorted(registered) and set(own) <= set(definition.FEATURES)
    s = spec.build(vmargs.InitRequest("e1", 1, 64, disk=None, nic=None, tpm=True, watchdog=True), images_dir="/v")
    assert set(s.elements) == set(own) and s.elements["tpm"] == {"model": "tpm-crb", "version": "2.0"}
    with pytest.raises(ValueError, match="registered twice"):
        elements.of(list(devices.ELEMENTS), "tpm", "tpm", read=devices.tpm_facts)(devices.tpm)
