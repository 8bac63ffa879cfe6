"""Node XML for libvirt's test driver with many domains: ``test:///abs/path/node.xml``.

Every domain has the shape salt-virt creates: 1 vCPU, 256 MiB, one virtio qcow2 disk, one virtio NIC on
bridge br0, a serial console; every third domain also has VNC graphics. Half are running (the test driver
starts domains listed in a node file unless ``<test:runstate>`` says otherwise), half are shut off.

The disks are real files so that queries which inspect them (saltext-virt runs ``qemu-img info`` per
disk) do real work: one small qcow2 overlay on a small base, hard-linked once per domain (cheap, and
every domain still has a file of its own name).

    python bench/nodexml.py DIR N     # writes DIR/node-N.xml and DIR/disks/, prints the test:/// URI
"""

import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET

TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"
ET.register_namespace("test", TEST_NS)


def _sub(parent, tag, text=None, **attrs):
    el = ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})
    if text is not None:
        el.text = str(text)
    return el


def _disk_template(disk_dir):
    base = os.path.join(disk_dir, "base.qcow2")
    overlay = os.path.join(disk_dir, "template-overlay.qcow2")
    if not os.path.exists(overlay):
        os.makedirs(disk_dir, exist_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", base, "1G"], check=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", overlay], check=True)
    return overlay


def domain(index, disk_path, running=True, prefix="vm", dtype="test"):
    """One domain element; ``running`` only matters to the test driver (``dtype`` test)."""
    name = f"{prefix}{index:05d}"
    dom = ET.Element("domain", type=dtype)
    _sub(dom, "name", name)
    _sub(dom, "uuid", uuid.uuid5(uuid.NAMESPACE_DNS, f"salt-virt-bench-{prefix}-{index}"))
    _sub(dom, "memory", 256, unit="MiB")
    _sub(dom, "currentMemory", 256, unit="MiB")
    _sub(dom, "vcpu", 1)
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64")
    _sub(os_el, "boot", dev="hd")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    devices = _sub(dom, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2")
    _sub(disk, "source", file=disk_path)
    _sub(disk, "target", dev="vda", bus="virtio")
    nic = _sub(devices, "interface", type="bridge")
    _sub(nic, "mac", address=f"52:54:00:{(index >> 16) & 0xFF:02x}:{(index >> 8) & 0xFF:02x}:{index & 0xFF:02x}")
    _sub(nic, "source", bridge="br0")
    _sub(nic, "model", type="virtio")
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "target", port=0)
    if index % 3 == 0:
        _sub(devices, "graphics", type="vnc", port=5900 + index % 10000, autoport="no", listen="127.0.0.1")
    if dtype == "test" and not running:
        _sub(dom, f"{{{TEST_NS}}}runstate", 5)  # VIR_DOMAIN_SHUTOFF
    return dom


def write_node(directory, count, prefix="vm", cpus=64, mem_gib=512):
    """Write ``directory/node-<prefix>-<count>.xml`` (+ disk files); return its ``test:///`` URI."""
    directory = os.path.abspath(directory)
    disk_dir = os.path.join(directory, "disks")
    template = _disk_template(disk_dir)
    node = ET.Element("node")
    cpu = _sub(node, "cpu")
    for tag, val in (
        ("mhz", 2400),
        ("model", "bench-cpu"),
        ("active", cpus),
        ("max", cpus),
        ("nodes", 1),
        ("sockets", 1),
        ("cores", cpus),
        ("threads", 1),
    ):
        _sub(cpu, tag, val)
    _sub(node, "memory", mem_gib * 1024 * 1024)
    for i in range(count):
        path = os.path.join(disk_dir, f"{prefix}{i:05d}.qcow2")
        if not os.path.exists(path):
            os.link(template, path)
        node.append(domain(i, path, running=(i % 2 == 0), prefix=prefix))
    path = os.path.join(directory, f"node-{prefix}-{count}.xml")
    ET.ElementTree(node).write(path, encoding="unicode")
    return f"test://{path}"


if __name__ == "__main__":
    print(write_node(sys.argv[1], int(sys.argv[2])))
