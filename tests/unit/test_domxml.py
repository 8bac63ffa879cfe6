"""saltvirt.domxml: domain XML built from a VM spec and parsed back (ElementTree, no libvirt needed).
Golden-file tests of each device builder: test_domxml_golden.py."""

import xml.etree.ElementTree as ET

from saltvirt import domxml, spec


def test_xml_escapes_and_round_trips():
    s = spec.build(
        "vm-1",
        2,
        1024,
        image="/i.qcow2",
        image_format="qcow2",
        enable_vnc=True,
        boot={"kernel": "/k", "initrd": "/i", "cmdline": "console=ttyS0 x='<&>'"},
        images_dir="/v",
    )
    xml = domxml.build(s)
    root = ET.fromstring(xml)  # would raise if the cmdline broke the XML
    assert root.find("os/cmdline").text == "console=ttyS0 x='<&>'"
    facts = domxml.parse(xml)
    assert (facts["cpu"], facts["mem"], facts["type"]) == (2, 1024, "qemu")
    assert facts["disks"][0]["file"] == "/v/vm-1/system.qcow2"
    assert facts["graphics"] == [
        {"type": "vnc", "port": -1, "autoport": True, "listen": "127.0.0.1", "password": False}
    ]
    assert facts["serial_log"] == "/var/log/libvirt/qemu/vm-1-serial.log"


def test_vnc_only_when_asked():
    assert "<graphics" not in domxml.build(spec.build("n", 1, 64, disk=None, images_dir="/v"))
    assert "<graphics" in domxml.build(spec.build("n", 1, 64, disk=None, images_dir="/v", enable_vnc=True))
