"""saltvirt.xml.domxml: domain XML built from a VM spec and parsed back (ElementTree), and golden files of
what it builds, one per device kind (tests/golden/domxml/, see tests/support/golden.py)."""

import xml.etree.ElementTree as ET

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.spec import vmargs
from saltvirt.spec import vmspec as spec
from saltvirt.xml import domxml
from tests.support import golden as golden_files


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
    xml = domxml.build(s)
    root = ET.fromstring(xml)  # would raise if the cmdline broke the XML
    assert root.find("os/cmdline").text == "console=ttyS0 x='<&>'"
    facts = domxml.parse(xml)
    assert (facts["cpu"], facts["mem"], facts["type"]) == (2, 1024, "qemu")
    assert facts["disks"][0]["file"] == "/v/vm-1/system.qcow2"
    assert facts["graphics"] == [
        {"type": "vnc", "port": -1, "autoport": True, "listen": "127.0.0.1", "password": True, "websocket": -1}
    ]
    assert facts["serial_log"] == "/var/log/libvirt/qemu/vm-1-serial.log"


def test_vnc_only_when_asked():
    assert "<graphics" not in domxml.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None), images_dir="/v"))
    assert "<graphics" in domxml.build(
        spec.build(vmargs.InitRequest("n", 1, 64, disk=None, enable_vnc=True), images_dir="/v")
    )


def test_move_disks_moves_only_mapped_disks_and_drops_their_backing_chain():
    xml = """<domain><name>m</name><devices>
      <disk type='file' device='disk'><source file='/a/m/system.qcow2'/>
        <backingStore type='file'><format type='qcow2'/><source file='/a/.bases/b.qcow2'/></backingStore>
        <target dev='vda'/></disk>
      <disk type='file' device='disk'><source file='/shared/data.raw'/><backingStore/><target dev='vdb'/></disk>
    </devices></domain>"""
    out = ET.fromstring(domxml.move_disks(xml, {"/a/m/system.qcow2": "/b/m/system.qcow2"}))
    vda, vdb = out.findall("devices/disk")
    assert vda.find("source").get("file") == "/b/m/system.qcow2" and vda.find("backingStore") is None
    assert vdb.find("source").get("file") == "/shared/data.raw" and vdb.find("backingStore") is not None


def test_parse_reads_what_a_migration_needs_of_each_disk():
    """cache, readonly and shareable: migrate prepares the target from these (libvirt copies writable
    disks only), read here rather than by a second parser."""
    xml = """<domain><name>m</name><devices>
      <disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='none'/>
        <source file='/a/m/system.qcow2'/><target dev='vda'/></disk>
      <disk type='file' device='disk'><source file='/shared/ro.raw'/><target dev='vdb'/><readonly/></disk>
      <disk type='block' device='disk'><source dev='/dev/vg/lv'/><target dev='vdc'/><shareable/></disk>
    </devices></domain>"""
    vda, vdb, vdc = domxml.parse(xml)["disks"]
    assert (vda["cache"], vda["readonly"], vda["shareable"], vda["format"]) == ("none", False, False, "qcow2")
    assert (vdb["cache"], vdb["readonly"], vdb["shareable"]) == (None, True, False)
    assert (vdc["file"], vdc["readonly"], vdc["shareable"]) == ("/dev/vg/lv", False, True)


def test_domain_name_of_user_xml():
    assert domxml.domain_name("<domain><name>web1</name></domain>") == "web1"
    assert domxml.domain_name("<domain/>") is None
    with pytest.raises(ValueError, match="the domain XML does not parse"):
        domxml.domain_name("<domain><name>web1</domain>")


# golden files: one per device kind -------------------------------------------------------------------
def vm(**kw):
    """A VM with no devices but the ones a case adds (the serial console is always there; the guest agent
    channel, on by default in a VMSpec, only in its own case)."""
    return spec.VMSpec(**dict({"name": "golden1", "cpu": 2, "mem": 256, "guest_agent": False}, **kw))


def facts(xml):
    """What domxml.parse reads, without what libvirt adds on define (uuid, interface target names)."""
    out = domxml.parse(xml)
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
    test driver, and libvirt reads back the same facts from it as domxml.parse does from ours."""
    xml = domxml.build(GOLDEN_CASES[case])
    ours, libvirts = facts(xml), facts(golden(f"domxml/{case}", xml))
    for mine, theirs in zip(ours["nics"], libvirts["nics"], strict=True):
        if mine["mac"] is None:  # libvirt generates one
            assert theirs["mac"].startswith("52:54:00:")
            theirs["mac"] = None
    assert libvirts == ours


def test_golden_check_catches_a_changed_builder():
    """A golden comparison that cannot fail would be worthless: a changed attribute is reported as a diff
    (compared even under --regen-golden, which must never write this altered XML)."""
    xml = domxml.build(GOLDEN_CASES["nic-network"]).replace("e1000", "rtl8139")
    with pytest.raises(AssertionError, match=r"(?s)golden.*-.*e1000.*\+.*rtl8139"):
        golden_files.compare_or_write("domxml/nic-network", xml, regen=False)
    with pytest.raises(AssertionError, match="no golden file tests/golden/domxml/no-such-case.xml"):
        golden_files.compare_or_write("domxml/no-such-case", xml, regen=False)


def test_minion_key_kept_in_metadata():
    """virt.init records the seeded minion key; salt-run virt.purge compares it with the master's."""
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, disk=None, group="web"), images_dir="/srv/img", profiles={})
    assert domxml.parse(domxml.build(vm))["minion"] is None
    vm.minion_key = {"minion_id": "web1", "fingerprint": "ab" * 32}
    facts = domxml.parse(domxml.build(vm))
    assert facts["minion"] == {"id": "web1", "key_sha256": "ab" * 32} and facts["group"] == "web"


def test_owner_kept_in_metadata():
    """salt-run virt.init records the tenant and the creator; the runner scopes tenants by it."""
    vm = spec.build(
        vmargs.InitRequest("web1", 1, 128, owner={"tenant": "acme", "creator": "alice"}),
        images_dir="/srv/img",
        profiles={},
    )
    xml = domxml.build(vm)
    assert '<saltvirt:owner tenant="acme" creator="alice" />' in xml
    assert domxml.parse(xml)["owner"] == {"tenant": "acme", "creator": "alice"}
    assert domxml.parse(domxml.build(spec.build(vmargs.InitRequest("web2", 1, 128))))["owner"] is None
    only = spec.build(vmargs.InitRequest("web3", 1, 128, owner={"creator": "root"}))
    assert domxml.parse(domxml.build(only))["owner"] == {"tenant": None, "creator": "root"}
    for bad in ({"tenant": "a b"}, {"tenant": "x", "role": "admin"}, "acme", {"creator": "<x>"}):
        with pytest.raises(SaltInvocationError, match="owner"):
            spec.build(vmargs.InitRequest("web4", 1, 128, owner=bad))


@pytest.mark.parametrize("image", ["debian12", "https://images.example.com:8443/a&b/web.qcow2", "/srv/img/x.raw"])
def test_image_kept_in_metadata(image):
    """virt.init records the image a VM came from (a catalog name or a source); parse reads it back."""
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, owner={"tenant": "acme"}), images_dir="/srv/img", profiles={})
    assert domxml.parse(domxml.build(vm))["image"] is None
    vm.image_origin = image
    xml = domxml.build(vm)
    assert domxml.parse(xml)["image"] == image and domxml.parse(xml)["owner"] == {"tenant": "acme", "creator": None}
    assert ET.fromstring(xml).find(f"metadata/{{{domxml.METADATA_NS}}}vm/{{{domxml.METADATA_NS}}}image").text == image
    alone = spec.build(vmargs.InitRequest("web2", 1, 128))  # the image is reason enough for salt-virt's <metadata>
    alone.image_origin = image
    assert domxml.parse(domxml.build(alone))["image"] == image


def test_new_vms_get_the_guest_agent_channel_unless_opted_out():
    assert spec.build(vmargs.InitRequest("ga1", 1, 128)).guest_agent is True
    xml = domxml.build(spec.build(vmargs.InitRequest("ga1", 1, 128)))
    assert domxml.parse(xml)["guest_agent"] == "unknown"  # defined, not running: libvirt reports no state
    assert "org.qemu.guest_agent.0" in xml
    for off in (False, "false", "no"):
        xml = domxml.build(spec.build(vmargs.InitRequest("ga1", 1, 128, guest_agent=off)))
        assert "channel" not in xml and domxml.parse(xml)["guest_agent"] is None


@pytest.mark.parametrize("state", ["connected", "disconnected"])
def test_parse_reads_the_agent_channel_state_of_a_running_vm(state):
    xml = (
        "<domain type='kvm'><name>x</name><devices>"
        "<channel type='unix'><source mode='bind' path='/run/x.sock'/>"
        "<target type='virtio' name='org.qemu.spice.0' state='connected'/></channel>"
        f"<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0' state='{state}'/></channel>"
        "</devices></domain>"
    )
    assert domxml.parse(xml)["guest_agent"] == state


def test_facts_from_a_tree_parsed_once_equal_those_from_the_string():
    """query.describe parses a domain's XML once and hands the tree to parse/salt_facts/loader."""
    xml = (
        "<domain type='kvm'><name>t1</name><memory unit='KiB'>65536</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader></os>"
        "<on_reboot>restart</on_reboot><devices><disk type='file' device='disk'><source file='/x.qcow2'/>"
        "<target dev='vda' bus='virtio'/></disk></devices></domain>"
    )
    tree = domxml.read(xml)
    assert domxml.read(tree) is tree
    assert domxml.parse(tree) == domxml.parse(xml)
    assert domxml.salt_facts(tree) == domxml.salt_facts(xml)
    assert (
        domxml.loader(tree)
        == domxml.loader(xml)
        == {
            "path": "/usr/share/OVMF/OVMF_CODE.fd",
            "readonly": "yes",
            "type": "pflash",
        }
    )


# firmware, boot order, extra serial ports and consoles, vTPM (issue #15) ------------------------------


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
    out = ET.fromstring(domxml.restored(xml, {"/i/web1/system.raw": "/i/web2/vda.qcow2"}, new_name="web2"))
    assert out.findtext("name") == "web2" and out.find("uuid") is None
    assert out.find("devices/interface/mac") is None
    assert out.find("devices/serial/log").get("file") == "/var/log/libvirt/qemu/web2-serial.log"
    vda, vdb = out.findall("devices/disk")
    assert (vda.find("source").get("file"), vda.find("driver").get("type")) == ("/i/web2/vda.qcow2", "qcow2")
    assert (vdb.find("source").get("file"), vdb.find("driver").get("type")) == ("/shared/x.raw", "raw")
    same = ET.fromstring(domxml.restored(xml, {"/i/web1/system.raw": "/i/web1/vda.qcow2"}))
    assert same.findtext("name") == "web1" and same.findtext("uuid") == "0f3c2a44-1b5e-4e0c-9a8f-1234567890ab"
    assert same.find("devices/interface/mac").get("address") == "52:54:00:00:00:01"


def test_restored_copy_gets_neither_the_minion_record_nor_the_nvram_file_of_the_original():
    """A copy with the original's <saltvirt:minion> would delete the original's minion key when purged, and
    with its <nvram> path both VMs would share (and a purge delete) one UEFI variables file."""
    meta = f"<metadata><sv:vm xmlns:sv='{domxml.METADATA_NS}'><sv:minion id='web1' key_sha256='ab'/>"
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
        copy = ET.fromstring(domxml.restored(xml, {}, new_name="web2"))
        assert domxml.parse(copy)["minion"] is None and domxml.parse(copy)["owner"] == {
            "tenant": "acme",
            "creator": "alice",
        }
        el = copy.find("os/nvram")
        assert (None if el is None else (dict(el.attrib), el.text, list(el))) == (
            None if want is None else (want, None, [])
        ), nvram
        same = ET.fromstring(domxml.restored(xml, {}))  # in place: the same VM keeps its key and variables
        assert domxml.parse(same)["minion"] == {"id": "web1", "key_sha256": "ab"}
        assert ET.tostring(same.find("os/nvram")) == ET.tostring(ET.fromstring(xml).find("os/nvram"))


def test_eject_empties_the_named_cdrom_drives_only():
    xml = """<domain><name>web1</name><devices>
      <disk type='file' device='cdrom'><source file='/i/web0/cidata.iso'/><target dev='sda'/><readonly/></disk>
      <disk type='file' device='cdrom'><source file='/srv/iso/x.iso'/><target dev='sdb'/><readonly/></disk>
      <disk type='file' device='disk'><source file='/i/web1/vda.qcow2'/><target dev='vda'/></disk>
    </devices></domain>"""
    out = ET.fromstring(domxml.eject(xml, ["sda", "vda"]))
    sda, sdb, vda = out.findall("devices/disk")
    assert sda.find("source") is None and sda.find("target").get("dev") == "sda"  # the drive stays, empty
    assert sdb.find("source").get("file") == "/srv/iso/x.iso" and vda.find("source") is not None  # not a CD-ROM


def test_domain_readers_name_a_missing_devices_element():
    for call in (domxml.disks_by_target, lambda x: domxml.new_interfaces(x, ()), domxml.edit_devices):
        with pytest.raises(ValueError, match="has no <devices>"):
            call("<domain><name>web1</name></domain>")


def test_a_vnc_console_gets_a_websocket_on_a_free_port_and_spice_none():
    """The web console's noVNC reaches QEMU's VNC over websocket; libvirt picks its port (-1), it listens
    where the VNC listens."""
    vnc = domxml.read(
        domxml.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None, enable_vnc=True), images_dir="/v"))
    )
    (g,) = vnc.findall("devices/graphics")
    assert (g.get("type"), g.get("websocket"), g.get("listen")) == ("vnc", "-1", "127.0.0.1")
    assert domxml.parse(vnc)["graphics"][0]["websocket"] == -1
    spice = domxml.read(
        domxml.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None, graphics="spice"), images_dir="/v"))
    )
    assert spice.find("devices/graphics").get("websocket") is None
    assert domxml.parse(spice)["graphics"][0]["websocket"] is None
    assert domxml.vnc_websocket(vnc) is None  # -1: not running, no port yet
    # never without a password (QEMU would then start it without password authentication): a random one unless
    # one is given
    again = domxml.read(
        domxml.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None, enable_vnc=True), images_dir="/v"))
    )
    assert len(g.get("passwd")) == 8 and again.find("devices/graphics").get("passwd") != g.get("passwd")
    given = spec.build(
        vmargs.InitRequest("n", 1, 64, disk=None, graphics={"type": "vnc", "password": "mine"}), images_dir="/v"
    )
    assert domxml.read(domxml.build(given)).find("devices/graphics").get("passwd") == "mine"
    assert spice.find("devices/graphics").get("passwd") is None


def test_the_live_websocket_console_and_its_password_change():
    live = domxml.read(
        "<domain><devices><graphics type='spice' port='5900'/>"
        "<graphics type='vnc' port='5901' autoport='yes' websocket='5701' listen='10.0.0.1' connected='keep'>"
        "<listen type='address' address='10.0.0.1'/></graphics></devices></domain>"
    )
    g = domxml.vnc_websocket(live)
    assert g is not None and g.get("websocket") == "5701"
    changed = domxml.read(domxml.graphics_password(g, "s3cr3tpw", "2030-01-02T03:04:05"))
    assert changed.tag == "graphics" and changed.attrib == {
        "type": "vnc",
        "port": "5901",
        "autoport": "yes",
        "websocket": "5701",
        "listen": "10.0.0.1",
        "passwd": "s3cr3tpw",
        "passwdValidTo": "2030-01-02T03:04:05",
    }
    assert changed.find("listen").attrib == {"type": "address", "address": "10.0.0.1"}
    assert "passwd" not in g.attrib  # the live element read is left as it was


def test_ha_kept_in_metadata():
    """virt.init ha=True records the flag automatic HA reads (saltvirt.fleet.ha); parse reads it back."""
    assert domxml.parse(domxml.build(spec.build(vmargs.InitRequest("web1", 1, 128))))["ha"] is False
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, group="web", owner={"creator": "root"}, ha="yes"))
    xml = domxml.build(vm)
    assert ET.fromstring(xml).find(f"metadata/{{{domxml.METADATA_NS}}}vm/{{{domxml.METADATA_NS}}}ha").text == "true"
    facts = domxml.parse(xml)
    assert facts["ha"] is True and facts["group"] == "web" and facts["owner"] == {"tenant": None, "creator": "root"}
    with pytest.raises(SaltInvocationError, match="ha must be true or false"):
        spec.build(vmargs.InitRequest("web1", 1, 128, ha="maybe"))


def test_with_ha_keeps_the_rest_of_salt_virts_metadata():
    """virt.update ha=: libvirt's setMetadata replaces salt-virt's whole <vm> element: the group, owner, minion key
    and image must survive, as libvirt writes it back (namespaced) into the domain."""
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, group="web", owner={"tenant": "acme", "creator": "alice"}))
    vm.minion_key, vm.image_origin = {"minion_id": "web1", "fingerprint": "ab" * 32}, "debian12"
    xml = domxml.build(vm)
    on = domxml.with_ha(xml, True)
    assert ET.fromstring(on).tag == "vm" and "{" not in "".join(el.tag for el in ET.fromstring(on).iter())

    def injected(fragment):  # what libvirt makes of it: its <vm> and children in our namespace, in <metadata>
        root = ET.fromstring(xml)
        meta = root.find("metadata")
        meta.remove(meta[0])
        el = ET.fromstring(fragment)
        for child in el.iter():
            child.tag = f"{{{domxml.METADATA_NS}}}{child.tag}"
        meta.append(el)
        return domxml.parse(ET.tostring(root, encoding="unicode"))

    facts = injected(on)
    assert facts["ha"] is True and facts["group"] == "web" and facts["image"] == "debian12"
    assert facts["owner"] == {"tenant": "acme", "creator": "alice"} and facts["minion"]["id"] == "web1"
    assert (
        injected(domxml.with_ha(domxml.build(spec.build(vmargs.InitRequest("web1", 1, 128, ha=True))), False))["ha"]
        is False
    )
    assert (
        ET.fromstring(domxml.with_ha(domxml.build(spec.build(vmargs.InitRequest("web2", 1, 128))), True)).findtext("ha")
        == "true"
    )
