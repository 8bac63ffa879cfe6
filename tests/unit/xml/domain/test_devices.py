"""saltvirt.xml.domain.devices: disks, interfaces, chardevs, the guest agent channel, vTPM, host devices and
graphics as definition.build writes them and as they are read back (reported, compared with a spec), the
feature cases each a golden file (tests/golden/domain/<case>.xml, see tests/support/golden.py)."""

import pytest

from saltvirt.model import vmargs
from saltvirt.model import vmspec as spec
from saltvirt.xml import etree
from saltvirt.xml.domain import definition, devices
from tests.support.goldenvm import check_features, vm

FEATURE_CASES = {
    "serials-consoles": vm(
        serials=[
            {"type": "pty", "target_type": "serial"},
            {"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "telnet", "target_type": "serial"},
        ],
        consoles=[{"type": "pty", "target_type": "virtio"}],
    ),
    "tpm-crb": vm(tpm={"model": "tpm-crb", "version": "2.0"}),
    "watchdog": vm(watchdog={"model": "i6300esb", "action": "poweroff"}),
    "rng": vm(rng=True),
    "hostdev-pci-usb": vm(
        hostdevs=[
            {"name": "pci_0000_00_1f_2", "type": "pci", "address": "0000:00:1f.2"},
            {"name": "usb_3_1", "type": "usb", "vendor": "0x1d6b", "product": "0x0002", "bus": 3, "device": 1},
        ]
    ),
}


@pytest.mark.parametrize("case", sorted(FEATURE_CASES))
def test_golden_features(golden, case):
    """Each device is its golden file, valid for libvirt's schema and what libvirt reads back."""
    check_features(golden, case, FEATURE_CASES[case])


def test_what_goes_in_comes_back():
    """Built then read: the readers give back each device of the spec."""
    disks = [
        spec.Disk("system", format="qcow2", path="/srv/vms/t1/system.qcow2", target="vda"),
        spec.Disk("data", format="raw", pool="pool1", volume="t1_data", target="vdb"),
        spec.Disk("iso", format="raw", path="/srv/iso/x.iso", device="cdrom", bus="sata", target="sda"),
    ]
    nics = [
        spec.Nic("eth0", type="bridge", source="br0", model="virtio", mac="52:54:00:6b:00:01"),
        spec.Nic("eth1", type="network", source="default", model="e1000", mac="52:54:00:6b:00:02"),
        spec.Nic("eth2", type="direct", source="eno1", model="virtio", mac="52:54:00:6b:00:03"),
    ]
    serials = [{"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "telnet", "target_type": "serial"}]
    hostdevs = [
        {"type": "pci", "address": "0000:00:1f.2"},
        {"type": "usb", "vendor": "0x1d6b", "product": "0x0002", "bus": 3, "device": 1},
    ]
    s = vm(
        disks=disks,
        nics=nics,
        graphics=spec.Graphics(type="spice", listen="0.0.0.0", port=5901, password="pw"),
        serial_log="/var/log/t1-serial.log",
        guest_agent=True,
        serials=serials,
        consoles=[{"type": "pty", "target_type": "virtio"}],
        tpm={"model": "tpm-crb", "version": "2.0"},
        watchdog={"model": "ib700", "action": "inject-nmi"},
        rng=True,
        hostdevs=hostdevs,
    )
    root = etree.read(definition.build(s))
    got = devices.facts(root, compare=True)
    assert [(d["target"], d["bus"], d["device"], d["format"]) for d in got["disks"]] == [
        (d.target, d.bus, d.device, d.format) for d in disks
    ]
    assert [(d["file"], d["pool"], d["volume"]) for d in got["disks"]] == [
        ("/srv/vms/t1/system.qcow2", None, None),
        ("t1_data", "pool1", "t1_data"),
        ("/srv/iso/x.iso", None, None),
    ]
    assert [(n["type"], n["source"], n["model"], n["mac"]) for n in got["nics"]] == [
        (n.type, n.source, n.model, n.mac) for n in nics
    ]
    assert got["graphics"] == [
        {
            "type": "spice",
            "port": 5901,
            "autoport": False,
            "listen": "0.0.0.0",
            "password": True,
            "websocket": None,
            "passwd": "pw",
        }
    ]
    assert (got["serial_log"], got["guest_agent"]) == ("/var/log/t1-serial.log", "unknown")
    assert devices.feature_facts(root) == {
        "serials": [{"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "telnet"}],
        "consoles": [{"type": "pty"}],
        "tpm": {"model": "tpm-crb", "version": "2.0"},
        "watchdog": {"model": "ib700", "action": "inject-nmi"},
        "rng": True,
        "host_devices": [
            {"type": "pci", "address": "0000:00:1f.2"},
            {"type": "usb", "vendor": "0x1d6b", "product": "0x0002"},
        ],
    }
    assert "passwd" not in devices.facts(root)["graphics"][0]  # only for comparing, never reported


def test_parse_reads_what_a_migration_needs_of_each_disk():
    """cache, readonly and shareable: migrate prepares the target from these (libvirt copies writable
    disks only), read here rather than by a second parser."""
    xml = """<domain><name>m</name><devices>
      <disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='none'/>
        <source file='/a/m/system.qcow2'/><target dev='vda'/></disk>
      <disk type='file' device='disk'><source file='/shared/ro.raw'/><target dev='vdb'/><readonly/></disk>
      <disk type='block' device='disk'><source dev='/dev/vg/lv'/><target dev='vdc'/><shareable/></disk>
    </devices></domain>"""
    vda, vdb, vdc = definition.parse(xml)["disks"]
    assert (vda["cache"], vda["readonly"], vda["shareable"], vda["format"]) == ("none", False, False, "qcow2")
    assert (vdb["cache"], vdb["readonly"], vdb["shareable"]) == (None, True, False)
    assert (vdc["file"], vdc["readonly"], vdc["shareable"]) == ("/dev/vg/lv", False, True)


def test_new_vms_get_the_guest_agent_channel_unless_opted_out():
    assert spec.build(vmargs.InitRequest("ga1", 1, 128)).guest_agent is True
    xml = definition.build(spec.build(vmargs.InitRequest("ga1", 1, 128)))
    assert definition.parse(xml)["guest_agent"] == "unknown"  # defined, not running: libvirt reports no state
    assert "org.qemu.guest_agent.0" in xml
    for off in (False, "false", "no"):
        xml = definition.build(spec.build(vmargs.InitRequest("ga1", 1, 128, guest_agent=off)))
        assert "channel" not in xml and definition.parse(xml)["guest_agent"] is None


@pytest.mark.parametrize("state", ["connected", "disconnected"])
def test_parse_reads_the_agent_channel_state_of_a_running_vm(state):
    xml = (
        "<domain type='kvm'><name>x</name><devices>"
        "<channel type='unix'><source mode='bind' path='/run/x.sock'/>"
        "<target type='virtio' name='org.qemu.spice.0' state='connected'/></channel>"
        f"<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0' state='{state}'/></channel>"
        "</devices></domain>"
    )
    assert definition.parse(xml)["guest_agent"] == state


def test_a_vnc_console_gets_a_websocket_on_a_free_port_and_spice_none():
    """The web console's noVNC reaches QEMU's VNC over websocket; libvirt picks its port (-1), it listens
    where the VNC listens."""
    vnc = etree.read(
        definition.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None, enable_vnc=True), images_dir="/v"))
    )
    (g,) = vnc.findall("devices/graphics")
    assert (g.get("type"), g.get("websocket"), g.get("listen")) == ("vnc", "-1", "127.0.0.1")
    assert definition.parse(vnc)["graphics"][0]["websocket"] == -1
    spice = etree.read(
        definition.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None, graphics="spice"), images_dir="/v"))
    )
    assert spice.find("devices/graphics").get("websocket") is None
    assert definition.parse(spice)["graphics"][0]["websocket"] is None
    assert devices.vnc_websocket(vnc) is None  # -1: not running, no port yet
    # never without a password (QEMU would then start it without password authentication): a random one unless
    # one is given
    again = etree.read(
        definition.build(spec.build(vmargs.InitRequest("n", 1, 64, disk=None, enable_vnc=True), images_dir="/v"))
    )
    assert len(g.get("passwd")) == 8 and again.find("devices/graphics").get("passwd") != g.get("passwd")
    given = spec.build(
        vmargs.InitRequest("n", 1, 64, disk=None, graphics={"type": "vnc", "password": "mine"}), images_dir="/v"
    )
    assert etree.read(definition.build(given)).find("devices/graphics").get("passwd") == "mine"
    assert spice.find("devices/graphics").get("passwd") is None


def test_the_live_websocket_console_and_its_password_change():
    live = etree.read(
        "<domain><devices><graphics type='spice' port='5900'/>"
        "<graphics type='vnc' port='5901' autoport='yes' websocket='5701' listen='10.0.0.1' connected='keep'>"
        "<listen type='address' address='10.0.0.1'/></graphics></devices></domain>"
    )
    g = devices.vnc_websocket(live)
    assert g is not None and g.get("websocket") == "5701"
    changed = etree.read(devices.graphics_password(g, "s3cr3tpw", "2030-01-02T03:04:05"))
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
