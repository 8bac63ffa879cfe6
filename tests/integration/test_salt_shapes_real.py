"""Salt's meanings on a real libvirtd (hv1, a booted TCG guest): every key of Salt's query returns has
Salt's type (tests/support/salt_shapes.py), a state given only the name leaves a VM with non-default
NICs, disks, console, boot order and kernel boot alone, and boot_dev goes with a direct kernel boot."""

import shutil

from saltvirt.xml.domain import definition
from tests.support import lab
from tests.support.salt_shapes import assert_all_conform
from tests.support.saltloader import load_states


def test_shapes_and_a_name_only_state_on_real_libvirt(virt_hv, hv1, guest, boot_args, qemu_tmp):
    v = virt_hv
    base = qemu_tmp / "base.qcow2"
    shutil.copyfile(guest["qcow2"], base)
    shape = {
        "nic": None,
        "interfaces": [{"name": "eth0", "type": "bridge", "source": "br0", "model": "e1000"}],
        "disks": [{"name": "data", "size": 16, "model": "scsi"}],
        "graphics": {"type": "vnc"},
        "boot_dev": "network hd",  # with the kernel below, as Salt takes both
        "stop_on_reboot": True,
        "serials": [{"type": "tcp", "port": 4556, "protocol": "raw"}],
    }
    ret = v["virt.init"](
        "rshape1", 1, 128, image=str(base), enable_qcow=True, seed=False, boot=boot_args, vm_type="qemu", **shape
    )
    v["virt.init"]("rshape2", 1, 64, seed=False, nic=None, disk=None, start=False)  # headless, nothing attached
    try:
        assert ret["state"] == "running"
        lab.wait_for_text(hv1.path("log", "qemu", "rshape1-serial.log"), "GUEST-BOOT-OK", timeout=300)
        feats = definition.feature_facts(v["virt.get_xml"]("rshape1", inactive=True))
        assert feats["boot_dev"] == ["network", "hd"] and feats["kernel_boot"]["kernel"] == boot_args["kernel"]

        # shapes, with a running VM (block stats: sizes known) and a headless stopped one
        assert_all_conform(v, ("rshape1", "rshape2"))
        info = v["virt.vm_info"]("rshape1")["rshape1"]
        nic = next(iter(info["nics"].values()))
        assert nic["source"]["bridge"] == "br0" and nic["model"] == "e1000"
        assert info["graphics"]["type"] == "vnc" and info["graphics"]["port"].isdigit()
        assert isinstance(info["disks"]["vda"]["virtual size"], int)  # running: libvirt's block stats
        assert v["virt.get_graphics"]("rshape2")["type"] == "None"
        assert v["virt.network_info"]("no-such-net") == {} and v["virt.pool_info"]("no-such-pool") == {}

        # a state given only the name changes nothing of either VM
        st = load_states(v, False)
        for name, state in (("rshape1", "virt.running"), ("rshape1", "virt.defined"), ("rshape2", "virt.defined")):
            before = v["virt.get_xml"](name, inactive=True)
            done = st[state](name)
            assert done["result"] is True and done["changes"] == {}, done
            assert v["virt.get_xml"](name, inactive=True) == before
        assert v["virt.vm_state"]("rshape2") == {"rshape2": "shutoff"}
    finally:
        v["virt.purge"]("rshape1")
        v["virt.purge"]("rshape2")
