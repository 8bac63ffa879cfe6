"""libvirt's lock manager as the last guard against one VM running twice: two lab hypervisors whose
libvirtds use ``lock_manager = "lockd"`` with one lockspace directory on the storage they share (what
``salt-virt.example.sls`` configures). Whatever salt-virt believes, QEMU is never started on a disk
another host holds: here recovery's own restart (``hostrecord.restart``) of a VM that still runs on its
first host is refused by libvirt, and its definition undone."""

import os
import pathlib
import shutil
import subprocess

import pytest
from salt.exceptions import CommandExecutionError

from tests.support import lab
from tests.support.paths import GUEST_DIR
from tests.support.saltloader import make_minion_mods

HVS = (13, 14)  # lab indexes no other module uses


@pytest.fixture(scope="module")
def shared(lab_dir, guest):
    root = pathlib.Path(lab_dir) / "lk-store"
    (root / "lockspace").mkdir(parents=True)
    shutil.copyfile(guest["qcow2"], root / "golden.qcow2")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def hvs(lab_dir, fabric, shared):
    started = []
    try:
        for i in HVS:
            started.append(lab.Hypervisor(lab_dir, i, fabric, lockspace=str(shared / "lockspace")).start())
        yield started
    finally:
        for hv in started:
            hv.stop()


def test_a_second_start_on_another_host_is_refused_by_libvirt(hvs, shared, tmp_path, boot_args):
    import libvirt

    from saltvirt.host import hostrecord

    first, second = hvs
    roots = [str(shared), str(GUEST_DIR)]  # the disks; the test guest's kernel and initrd
    conf = {"allowed_paths": roots, "insecure_trusted_images": [str(shared / "golden.qcow2")]}  # overlays on it
    mods = make_minion_mods(tmp_path / "m1", first.uri, images_dir=str(tmp_path / "img1"), **conf)
    disk = shared / "lk1.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(shared / "golden.qcow2"), str(disk)],
        check=True,
    )
    mods["virt.init"](
        "lk1", 1, 128, boot=boot_args, nic=None, disks=[{"name": "system", "path": str(disk), "format": "qcow2"}]
    )
    assert os.listdir(shared / "lockspace")  # its disk's lease, held by hv13's virtlockd
    with libvirt.open(first.uri) as conn:
        rec = hostrecord.record(conn, str(tmp_path / "img1"), roots)
    with libvirt.open(second.uri) as conn:
        with pytest.raises(CommandExecutionError, match="starting 'lk1' on hv14 failed: .*(lock|resource busy)"):
            hostrecord.restart(conn, "lk1", rec["vms"]["lk1"]["xml"], rec["storage"], str(tmp_path), roots)
        assert [d.name() for d in conn.listAllDomains(0)] == []  # its definition undone
    assert mods["virt.vm_state"]("lk1") == {"lk1": "running"}  # the first copy runs on, alone
    mods["virt.stop"]("lk1")
    with libvirt.open(second.uri) as conn:  # released: now it may start there
        out = hostrecord.restart(conn, "lk1", rec["vms"]["lk1"]["xml"], rec["storage"], str(tmp_path), roots)
        assert out["state"] == "running"
        dom = conn.lookupByName("lk1")
        dom.destroy()
        dom.undefine()
    mods["virt.purge"]("lk1")
