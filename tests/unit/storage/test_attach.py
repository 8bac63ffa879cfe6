"""saltvirt.storage.attach (and intake.existing_disk, its format check): every existing disk a VM is given
goes through one door. Real qemu-img files in tmp dirs, libvirt's test:/// driver through the real Salt
loader (virt.init, virt.update, virt.running with Salt's ``disks=[{name, source_file, format}]``)."""

import os
import shutil

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.storage import attach
from tests.support import hostile
from tests.support.saltloader import SOURCES, load_states, make_minion_mods


@pytest.fixture
def files(tmp_path):
    """Existing disks in the loader's virt:allowed_paths (tmp_path/sources): a raw and a clean qcow2, and
    raw disks whose guest wrote an image header (backing file, data file, vmdk descriptor) naming a host file."""
    folder = tmp_path / SOURCES
    folder.mkdir(exist_ok=True)
    secret = hostile.secret_file(str(folder))
    raw = folder / "data.raw"
    raw.write_bytes(b"\0" * 65536)
    qcow2 = str(folder / "data.qcow2")
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", qcow2, "1M"])
    return {
        "secret": secret,
        "raw": str(raw),
        "qcow2": qcow2,
        "backing": hostile.backing_file_image(str(folder), secret),
        "data file": hostile.data_file_image(str(folder)),
        "vmdk descriptor": hostile.vmdk_descriptor_image(str(folder), secret),
    }


# through virt.init, virt.update and the states ----------------------------------------------------
def test_the_issue_attack_salt_spelling_refused_and_raw_attached_as_raw(virt_test, files):
    """A raw disk whose guest wrote a qcow2 header naming a host file, attached with Salt's spelling and no
    format: refused before anything is made; declared raw, the VM gets the disk's own bytes (driver raw)."""
    v = virt_test
    images = v["config.get"]("virt:images")
    disk = {"name": "data", "source_file": files["backing"]}
    with pytest.raises(SaltInvocationError, match="is a qcow2 with a backing file: refused"):
        v["virt.init"]("at1", 1, 64, nic=None, disk=None, start=False, disks=[disk])
    assert "at1" not in v["virt.list_domains"]() and not os.path.exists(os.path.join(images, "at1"))
    ret = v["virt.init"]("at1", 1, 64, nic=None, disk=None, start=False, disks=[dict(disk, format="raw")])
    assert ret["attached"] == [{"name": "data", "path": files["backing"], "format": "raw"}]
    assert v["virt.get_disks"]("at1")["vda"]["file format"] == "raw"
    assert v["virt.purge"]("at1")["removed"] == [] and os.path.exists(files["backing"])


def test_update_and_state_add_disks_through_the_same_door(virt_test, files):
    v = virt_test
    v["virt.init"]("at2", 1, 64, nic=None, disk=None, start=False)
    for test in (True, False):  # test=True says the same refusal, before anything is changed
        with pytest.raises(SaltInvocationError, match="looks like a vmdk descriptor image"):
            v["virt.update"]("at2", test=test, disks=[{"name": "d", "path": files["vmdk descriptor"]}])
    assert v["virt.get_disks"]("at2") == {}
    st = load_states(v)
    disks = [{"name": "data", "source_file": files["qcow2"], "format": "qcow2"}]  # Salt's spelling, a safe disk
    ret = st["virt.defined"]("at2", disks=disks)
    assert ret["result"] is True and ret["changes"]["disks"]["added"][0]["format"] == "qcow2"
    assert v["virt.get_disks"]("at2")["vda"]["file format"] == "qcow2"
    assert st["virt.defined"]("at2", disks=disks)["changes"] == {}


# ownership and use --------------------------------------------------------------------------------
def test_another_vms_disk_is_refused_and_a_gone_vms_needs_the_operators_switch(tmp_path, virt_test):
    v = virt_test
    images = v["config.get"]("virt:images")
    v["virt.init"]("own1", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "data", "size": 1}])
    theirs = os.path.join(images, "own1", "data.qcow2")
    v["virt.init"]("own2", 1, 64, nic=None, disk=None, start=False)
    grab = [{"name": "x", "path": theirs, "format": "qcow2"}]
    with pytest.raises(SaltInvocationError, match=f"{theirs} is a disk of VM 'own1': refused"):
        v["virt.update"]("own2", disks=grab)
    v["virt.undefine"]("own1")  # gone, its files (and manifest) left behind
    with pytest.raises(SaltInvocationError, match="belongs to VM 'own1', which no longer exists on this host"):
        v["virt.update"]("own2", disks=grab)
    with pytest.raises(SaltInvocationError, match="virt:adopt_orphan_disks: True"):
        v["virt.init"]("own3", 1, 64, nic=None, disk=None, start=False, disks=grab)
    adopting = make_minion_mods(tmp_path, "test:///default", adopt_orphan_disks=True)
    done = adopting["virt.update"]("own2", disk=None, disks=grab)
    assert done["changes"]["disks"]["added"][0]["path"] == theirs
    assert v["virt.purge"]("own2")["removed"] == [] and os.path.exists(theirs)  # adopted, never its to delete


def test_salt_virts_own_files_and_backing_files_are_never_a_vms_disk(virt_test, files, tmp_path):
    v = virt_test
    images = v["config.get"]("virt:images")
    base = os.path.join(files["qcow2"] + ".base")
    shutil.copyfile(files["qcow2"], base)
    # an overlay on a local image backs onto it in place: writing that image would change the overlay's disk
    v["virt.init"]("own4", 1, 64, image=base, enable_qcow=True, seed=False, nic=None, start=False)
    v["virt.init"]("own5", 1, 64, nic=None, disk=None, start=False)
    grab = [{"name": "x", "path": base, "format": "qcow2"}]
    with pytest.raises(SaltInvocationError, match=f"{base} is a disk of VM 'own4': refused"):  # its backing chain
        v["virt.update"]("own5", disk=None, disks=grab)
    v["virt.undefine"]("own4")  # its overlay is left in virt:images, still backing onto the image
    with pytest.raises(SaltInvocationError, match=f"{base} is the backing file of .*own4.*: refused"):
        v["virt.update"]("own5", disk=None, disks=grab)
    for where in (os.path.join(images, ".bases", "b.raw"), os.path.join(images, "golden.raw")):
        os.makedirs(os.path.dirname(where), exist_ok=True)
        shutil.copyfile(files["raw"], where)
        with pytest.raises(SaltInvocationError, match="in virt:images, not a VM's disk: refused"):
            v["virt.update"]("own5", disk=None, disks=[{"name": "x", "path": where, "format": "raw"}])
    assert v["virt.get_disks"]("own5") == {}


def test_the_operator_settings_are_no_call_argument(virt_test):
    """The switches come from the minion config only (saltvirt.base.switches): a call cannot pass them."""
    with pytest.raises(SaltInvocationError, match="operator= is not a call argument"):
        virt_test["virt.update"]("test", operator={"adopt_orphan_disks": True})
    with pytest.raises(SaltInvocationError, match="unknown argument"):
        virt_test["virt.init"]("at9", 1, 64, operator={"adopt_orphan_disks": True})


def test_kernel_initrd_and_serial_log_are_never_another_vms_disk(virt_test, guest):
    """boot:initrd is read into the guest's memory and serial_log is appended to (and rotated) by the host:
    another VM's disk there would be read or overwritten. The test guest's kernel, shared by every VM, and
    a new log file pass."""
    v = virt_test
    images = v["config.get"]("virt:images")
    v["virt.init"]("hf1", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "data", "size": 1}])
    theirs = os.path.join(images, "hf1", "data.qcow2")
    boot = {"kernel": guest["kernel"], "initrd": theirs}
    with pytest.raises(SaltInvocationError, match=f"boot:initrd: {theirs} is a file of VM 'hf1': refused"):
        v["virt.init"]("hf2", 1, 64, nic=None, disk=None, start=False, boot=boot)
    with pytest.raises(SaltInvocationError, match=f"serial_log: {theirs} is a file of VM 'hf1': refused"):
        v["virt.init"]("hf2", 1, 64, nic=None, disk=None, start=False, serial_log=theirs)
    assert "hf2" not in v["virt.list_domains"]() and not os.path.exists(os.path.join(images, "hf2"))
    own_log = os.path.join(images, "hf2.log")  # a new file: fine
    v["virt.init"]("hf2", 1, 64, nic=None, disk=None, start=False, serial_log=own_log, boot=dict(boot, initrd=None))
    with pytest.raises(SaltInvocationError, match=f"boot:initrd: {theirs} is a file of VM 'hf1': refused"):
        v["virt.update"]("hf2", boot=boot)
    assert v["virt.vm_info"]("hf2")["hf2"]["boot"].get("initrd") in (None, "")


def test_tcp_serial_ports_only_in_the_operators_range_and_addresses(tmp_path, virt_test):
    """A TCP serial port is the guest's console for whoever reaches it, on a port of the hypervisor: off by
    default; with virt:serial_tcp_ports only those ports, and only on virt:serial_tcp_listen (loopback)."""
    tcp = {"type": "tcp", "port": 4601, "protocol": "raw"}
    with pytest.raises(
        SaltInvocationError, match=r"TCP serial ports are off on this hypervisor: .*virt:serial_tcp_ports"
    ):
        virt_test["virt.init"]("ser1", 1, 64, nic=None, disk=None, start=False, serials=[tcp])
    assert "ser1" not in virt_test["virt.list_domains"]()

    v = make_minion_mods(tmp_path / "m", "test:///default", serial_tcp_ports="4600-4609")
    for chardevs, refusal in [
        ({"serials": [dict(tcp, port=22)]}, r"tcp:22 is outside the ports .* \(4600-4609\)"),
        ({"consoles": [dict(tcp, port=4610)]}, "tcp:4610 is outside the ports"),
        ({"serials": [dict(tcp, host="0.0.0.0")]}, "listening on 0.0.0.0 is not allowed .*virt:serial_tcp_listen"),
    ]:
        with pytest.raises(SaltInvocationError, match=refusal):
            v["virt.init"]("ser1", 1, 64, nic=None, disk=None, start=False, **chardevs)
    assert "ser1" not in v["virt.list_domains"]()
    try:
        v["virt.init"]("ser1", 1, 64, nic=None, disk=None, start=False, serials=[tcp])
        assert "<source mode='bind' host='127.0.0.1' service='4601'" in v["virt.get_xml"]("ser1")
        for test in (True, False):  # virt.update and the state: the same limits, also for test=True
            with pytest.raises(SaltInvocationError, match="tcp:5000 is outside the ports"):
                v["virt.update"]("ser1", test=test, serials=[dict(tcp, port=5000)])
        ret = load_states(v)["virt.defined"]("ser1", serials=[dict(tcp, host="192.0.2.1")])
        assert ret["result"] is False and "listening on 192.0.2.1 is not allowed" in ret["comment"], ret
        assert "service='4601'" in v["virt.get_xml"]("ser1")
    finally:
        v["virt.purge"]("ser1")


def test_check_serials_by_itself():
    settings = {"serial_tcp_ports": (5000, 5000), "serial_tcp_listen": ("192.0.2.1",)}
    attach.check_serials([{"type": "pty"}, {"type": "tcp", "port": 5000, "host": "192.0.2.1"}], settings)
    with pytest.raises(SaltInvocationError, match=r"listening on 127.0.0.1 is not allowed \(192.0.2.1\)"):
        attach.check_serials([{"type": "tcp", "port": 5000, "host": "127.0.0.1"}], settings)
    with pytest.raises(SaltInvocationError, match="TCP serial ports are off"):
        attach.check_serials([{"type": "tcp", "port": 5000, "host": "127.0.0.1"}], {})
