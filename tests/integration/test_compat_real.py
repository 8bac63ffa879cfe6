"""Salt's meanings on a real libvirtd with a TCG guest: ``virt.stop`` powers off a guest that ignores
ACPI (the test guest has no ACPI handler) while ``virt.shutdown`` only asks; per-VM statistics move
while the guest runs."""

import shutil

from tests.support import lab


def console(hv, name):
    return hv.path("log", "qemu", f"{name}-serial.log")


def test_stop_is_a_hard_power_off_and_stats_move(virt_hv, hv1, guest, boot_args, qemu_tmp):
    v = virt_hv
    base = qemu_tmp / "base.qcow2"
    shutil.copyfile(guest["qcow2"], base)
    ret = v["virt.init"]("cstop1", 1, 128, image=str(base), enable_qcow=True, seed=False, nic=None, boot=boot_args)
    assert ret["state"] == "running"
    try:
        lab.wait_for_text(console(hv1, "cstop1"), "GUEST-BOOT-OK", timeout=300)  # TCG on a busy host
        first_cpu = v["virt.vm_cputime"]("cstop1")["cstop1"]["cputime"]
        disk = v["virt.vm_diskstats"]("cstop1")["cstop1"]
        assert disk["rd_req"] > 0 and disk["rd_bytes"] > 0 and set(disk["devices"]) == {"vda"}  # it booted from vda
        # the guest ignores ACPI: virt.shutdown delivers the request (True) and the guest keeps running
        assert v["virt.shutdown"]("cstop1", timeout=3) is True
        assert v["virt.vm_state"]("cstop1") == {"cstop1": "running"}
        assert v["virt.vm_cputime"]("cstop1")["cstop1"]["cputime"] > first_cpu  # CPU time moved meanwhile
        # Salt's virt.stop pulls the plug
        assert v["virt.stop"]("cstop1") is True
        assert v["virt.vm_state"]("cstop1") == {"cstop1": "shutoff"}
        assert v["virt.vm_netstats"]("cstop1")["cstop1"]["rx_bytes"] == 0  # stopped: zeros, not an error
    finally:
        v["virt.purge"]("cstop1")
