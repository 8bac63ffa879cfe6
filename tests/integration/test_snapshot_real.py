"""Snapshots of a running TCG guest on the real libvirtd hv1: snapshot (memory included), write a marker
into the guest's disk while it runs, revert, the marker is gone and the guest runs on from the
snapshot's memory; states; purge of a VM with snapshots.

The test guest's /init only prints (no shell on its console, no writable mount), so the marker is
written by the guest's own QEMU through its block layer: the HMP ``qemu-io`` command on the running
disk device, which is exactly what a guest write does, and read back the same way."""

import os
import re
import time

import pytest

from tests.support import lab
from tests.support.saltloader import load_states

MARK = "write -P 0x5a 48M 64k"  # 64 KiB of 0x5a at 48 MiB: unused space of the 64 MiB test image


def hmp(hv, vm, command):
    import libvirt
    import libvirt_qemu

    conn = libvirt.open(hv.uri)
    try:
        dom = conn.lookupByName(vm)
        return libvirt_qemu.qemuMonitorCommand(dom, command, libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)
    finally:
        conn.close()


def qemu_io(hv, vm, command):
    """HMP qemu-io through the guest's disk device (``-d <qdev id>``: the same permissions as the guest's
    own writes). A SATA disk: its device has an id of its own (virtio's backend has none)."""
    device = re.search(r"Attached to:\s+(\S+)", hmp(hv, vm, "info block")).group(1)
    log = hv.path("log", "qemu", f"{vm}.log")  # qemu-io prints to QEMU's stdout: libvirt's log of the VM
    before = os.path.getsize(log)
    out = hmp(hv, vm, f'qemu-io -d {device} "{command}"')
    time.sleep(0.5)
    with open(log, errors="replace") as fh:
        fh.seek(before)
        return out + fh.read()


def has_marker(hv, vm):
    out = qemu_io(hv, vm, "read -P 0x5a 48M 64k")
    return "Pattern verification failed" not in out and "read 65536/65536" in out


def heartbeats(hv, vm):
    with open(hv.path("log", "qemu", f"{vm}-serial.log"), errors="replace") as fh:
        return [int(n) for n in re.findall(r"^HB (\d+)", fh.read(), re.M)]


def wait_heartbeat(hv, vm, above, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beats = heartbeats(hv, vm)
        if beats and beats[-1] > above:
            return beats
        time.sleep(0.5)
    raise AssertionError(f"{vm}: no heartbeat above {above} within {timeout}s (last: {heartbeats(hv, vm)[-3:]})")


@pytest.fixture
def running_vm(virt_hv, hv1, guest, boot_args):
    disks = [{"name": "system", "bus": "sata"}]  # the guest mounts sda1 as it would vda1
    virt_hv["virt.init"]("snapr1", 1, 256, image=guest["qcow2"], boot=boot_args, seed=False, disks=disks)
    lab.wait_for_text(hv1.path("log", "qemu", "snapr1-serial.log"), "HB 2", timeout=300)
    yield "snapr1"
    if "snapr1" in virt_hv["virt.list_domains"]():
        virt_hv["virt.purge"]("snapr1")


def test_snapshot_marker_revert_running_guest(virt_hv, hv1, running_vm):
    v, vm = virt_hv, running_vm
    taken = v["virt.snapshot"](vm, name="clean")
    assert taken == {"name": "clean", "memory": True}
    at_snapshot = heartbeats(hv1, vm)[-1]
    assert not has_marker(hv1, vm)
    assert "wrote 65536/65536" in qemu_io(hv1, vm, MARK)
    assert has_marker(hv1, vm)
    later = wait_heartbeat(hv1, vm, at_snapshot + 3)[-1]
    assert v["virt.revert_snapshot"](vm, vm_snapshot="clean") == {"reverted": "clean", "deleted": "N/A"}
    assert v["virt.vm_state"](vm) == {vm: "running"}  # the snapshot was of a running VM: it runs again
    assert not has_marker(hv1, vm)  # the disk is back as it was
    # the memory too: the guest's counter goes on from where it was at the snapshot, not from `later`
    beats = wait_heartbeat(hv1, vm, later + 2, timeout=300)
    restart = next(i for i in range(1, len(beats)) if beats[i] <= beats[i - 1])
    assert at_snapshot <= beats[restart] <= at_snapshot + 3

    st, preview = load_states(v), load_states(v, test=True)
    v["virt.snapshot"](vm, name="second")
    plan = preview["virt.reverted"](vm, snapshot="clean", cleanup=True)
    assert plan["result"] is None and plan["changes"] == {
        "reverted": [{"domain": vm, "current": "clean", "deleted": ["second"]}]
    }
    done = st["virt.reverted"](vm, snapshot="clean", cleanup=True)
    assert done["result"] is True and done["changes"] == plan["changes"]
    again = st["virt.reverted"](vm, snapshot="clean", cleanup=True)
    assert again["changes"]["reverted"] == [{"domain": vm, "current": "clean", "deleted": []}]
    assert [s["name"] for s in v["virt.list_snapshots"](vm)[vm]] == ["clean"]

    purged = v["virt.purge"](vm)
    assert purged["snapshots_discarded"] == ["clean"] and len(purged["removed"]) == 1


def test_raw_disk_vm_cannot_snapshot(virt_hv, guest, boot_args):
    v = virt_hv
    v["virt.init"]("snapr2", 1, 128, image=guest["raw"], boot=boot_args, seed=False, start=False)
    try:
        with pytest.raises(Exception, match="is not qcow2 and cannot hold one"):
            v["virt.snapshot"]("snapr2")
        assert v["virt.list_snapshots"]("snapr2") == {"snapr2": "N/A"}
    finally:
        v["virt.purge"]("snapr2")
