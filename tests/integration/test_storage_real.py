"""Storage pools, volumes and VM disks on volumes on a real libvirtd (the lab hv1): dir, fs (ext4 on a loop
file), logical (LVM on a loop device) and disk (a loop device) pools end to end, and TCG guests booting
from volumes cloned from the test guest image. Pool types that need a server (netfs, iscsi, rbd, gluster,
zfs) are schema-checked and defined on the test driver in tests/unit/test_poolxml.py.

Loop devices and volume groups are made per test and removed in fixtures, also when a test fails."""

import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support import lab
from tests.support.saltloader import load_states, make_minion_mods


def sh(*cmd, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def has_device_mapper():
    """LVM logical volumes need the kernel's device-mapper; some kernels (this CI VM's) have none."""
    with open("/proc/misc") as fh:
        return any(line.split()[-1] == "device-mapper" for line in fh if line.strip())


@pytest.fixture
def loop_device(qemu_tmp):
    """Factory of loop devices on sparse files; detached (and any VG on them removed) afterwards."""
    made, vgs = [], []

    def make(size="192M", vg=None):
        backing = qemu_tmp / f"loop{len(made)}.img"
        sh("truncate", "-s", size, str(backing))
        dev = sh("losetup", "--find", "--show", str(backing)).stdout.strip()
        made.append(dev)
        if vg:
            vgs.append(vg)
        return dev

    yield make
    for vg in vgs:
        sh("vgremove", "-f", vg, check=False)
    for dev in made:
        sh("pvremove", "-ff", "-y", dev, check=False)
        sh("losetup", "-d", dev, check=False)


@pytest.fixture
def pools(hv1):
    """Pools a test defines on hv1 are stopped and undefined afterwards (volumes and builds are the
    test's business: the loop fixture removes the devices under them)."""
    import libvirt

    conn = libvirt.open(hv1.uri)
    before = {p.name() for p in conn.listAllStoragePools(0)}
    yield
    for dom in conn.listAllDomains(0):
        if dom.name().startswith("stv"):
            with contextlib.suppress(libvirt.libvirtError):
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
    for pool in conn.listAllStoragePools(0):
        if pool.name() not in before:
            with contextlib.suppress(libvirt.libvirtError):  # its device may be gone already
                if pool.isActive():
                    pool.destroy()
            with contextlib.suppress(libvirt.libvirtError):
                if pool.isPersistent():
                    pool.undefine()
    conn.close()


def dir_pool_with_an_overlay(v, pool, target, volumes):
    """A dir pool ``pool`` at ``target`` holding a raw 1 MiB ``<vol>.raw`` of each of ``volumes`` (one of them
    ``base``) and ``top.qcow2``, an overlay that backs onto ``base.raw``."""
    assert v["virt.pool_define"](pool, "dir", target=str(target)) is True
    for vol in volumes:
        sh("qemu-img", "create", "-q", "-f", "raw", str(target / f"{vol}.raw"), "1M")
    top = str(target / "top.qcow2")
    sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(target / "base.raw"), "-F", "raw", top)
    v["virt.pool_refresh"](pool)


def console(hv, name):
    return hv.path("log", "qemu", f"{name}-serial.log")


def test_dir_pool_vm_boots_from_cloned_volume_and_purge(virt_hv, hv1, pools, qemu_tmp, guest, boot_args):
    v = virt_hv
    target = str(qemu_tmp / "dirpool")
    assert v["virt.pool_define"]("stdir", "dir", target=target, permissions={"mode": "0755"}) is True
    assert os.path.isdir(target) and v["virt.pool_info"]("stdir")["stdir"]["state"] == "running"
    ret = v["virt.init"](
        "stv1",
        1,
        256,
        image=guest["qcow2"],
        boot=boot_args,
        disks=[{"name": "system", "pool": "stdir"}, {"name": "data", "pool": "stdir", "size": 16, "format": "raw"}],
    )
    assert [(d["volume"], d["format"]) for d in ret["disks"]] == [("stv1_system", "qcow2"), ("stv1_data", "raw")]
    log = lab.wait_for_text(
        console(hv1, "stv1"), "SALT-MINION-ID:", timeout=300
    )  # seeded in the volume, booted from it
    assert "SALT-MINION-ID: stv1" in log
    infos = v["virt.volume_infos"]("stdir")["stdir"]
    assert infos["stv1_system"]["used_by"] == ["stv1"] and infos["stv1_system"]["format"] == "qcow2"
    assert infos["stv1_system"]["capacity"] == 64 * 1024 * 1024  # the image's size
    purged = v["virt.purge"]("stv1")
    assert sorted(purged["volumes"]["removed"]) == ["stdir/stv1_data", "stdir/stv1_system"]
    assert v["virt.pool_list_volumes"]("stdir") == []


def test_purge_of_a_foreign_vm_takes_its_volumes_but_no_base_or_shared_one(virt_hv, pools, qemu_tmp):
    """A VM salt-virt did not make (virt.define_xml_str), its disks volumes of a dir pool: purge deletes its
    own volume, keeps the one another domain uses and the one an overlay in the pool backs onto."""
    v = virt_hv
    target = qemu_tmp / "fpool"
    dir_pool_with_an_overlay(v, "stfp", target, ("own", "base", "shared"))

    def domain(name, vols):
        disks = "".join(
            f"<disk type='volume' device='disk'><driver name='qemu' type='raw'/><source pool='stfp' volume='{vol}'/>"
            f"<target dev='vd{chr(97 + i)}' bus='virtio'/></disk>"
            for i, vol in enumerate(vols)
        )
        return (
            f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>"
            f"<devices>{disks}</devices></domain>"
        )

    assert v["virt.define_xml_str"](domain("stvf1", ["own.raw", "base.raw", "shared.raw"])) is True
    assert v["virt.define_xml_str"](domain("stvf2", ["shared.raw"])) is True
    ret = v["virt.purge"]("stvf1")
    assert ret["volumes"]["removed"] == ["stfp/own.raw"], ret
    assert ret["volumes"]["kept"]["stfp/shared.raw"] == "used by VM 'stvf2'"
    assert ret["volumes"]["kept"]["stfp/base.raw"].startswith(f"backing file of {target / 'top.qcow2'}")
    assert sorted(v["virt.pool_list_volumes"]("stfp")) == ["base.raw", "shared.raw", "top.qcow2"]
    assert v["virt.purge"]("stvf2")["volumes"]["removed"] == ["stfp/shared.raw"]  # nothing else uses it now


def test_fs_pool_on_ext4_loop_volumes_upload(virt_hv, hv1, loop_device, pools, qemu_tmp, tmp_path):
    v = virt_hv
    dev = loop_device("64M")
    sh("mkfs.ext4", "-q", dev)
    target = str(qemu_tmp / "fsmnt")
    assert v["virt.pool_define"]("stfs", "fs", target=target, source_devices=[{"path": dev}], source_format="ext4")
    assert v["virt.pool_info"]("stfs")["stfs"]["state"] == "running"
    mounted = hv1.ns_run(["findmnt", "-n", "-o", "SOURCE", target]).stdout.strip()  # in hv1's mount namespace
    assert mounted == dev
    assert v["virt.volume_define"]("stfs", "blob", 1, format="raw") is True
    payload = qemu_tmp / "payload"
    payload.write_bytes(b"A" * 4096 + b"B" * 4096)
    # offset/length: the first 4 KiB of the file (the A's) go to byte 64 KiB of the volume, nothing else;
    # an upload overwrites an existing volume: only in a pool the operator lists in virt:pools
    with pytest.raises(SaltInvocationError, match="pool 'stfs' is not one the operator made available"):
        v["virt.volume_upload"]("stfs", "blob", str(payload))
    listed = make_minion_mods(tmp_path / "m2", hv1.uri, **dict(v.opts["virt"], pools=["stfs"]))
    assert listed["virt.volume_upload"]("stfs", "blob", str(payload), offset=65536, length=4096) is True
    path = v["virt.volume_infos"]("stfs", "blob")["stfs"]["blob"]["path"]
    assert path == f"{target}/blob"
    dump = hv1.ns_run(["sh", "-c", f"dd if={path} bs=4096 skip=15 count=3 status=none | od -v -An -c | tr -d ' \\n'"])
    assert dump.stdout == "\\0" * 4096 + "A" * 4096 + "\\0" * 4096
    gone = load_states(v)["virt.pool_deleted"]("stfs", purge=True)
    assert gone["result"] is True and "blob" in gone["changes"]["deleted_volumes"]
    assert gone["changes"]["stopped"] is True and gone["changes"]["undefined"] is True
    assert hv1.ns_run(["findmnt", target], check=False).returncode != 0  # unmounted


def test_logical_pool_on_loop_device(virt_hv, loop_device, pools):
    v = virt_hv
    vg = f"stvg{lab.new_tag()}"
    dev = loop_device("64M", vg=vg)
    st = load_states(v)
    args = {"ptype": "logical", "source": {"devices": [{"path": dev}], "name": vg}, "autostart": False}
    made = st["virt.pool_running"](vg, **args)
    assert made["result"] is True and set(made["changes"]) == {"defined", "started"}
    assert sh("vgs", "--noheadings", "-o", "pv_name", vg).stdout.strip() == dev  # pool_build made the VG
    assert st["virt.pool_running"](vg, **args)["changes"] == {}
    info = v["virt.pool_info"](vg)[vg]
    assert info["state"] == "running" and info["target_path"] == f"/dev/{vg}" and info["capacity"] > 0
    if has_device_mapper():
        assert v["virt.volume_define"](vg, "lv1", 8) is True
        assert v["virt.volume_infos"](vg, "lv1")[vg]["lv1"]["capacity"] >= 8 * 1024 * 1024
    else:  # no device-mapper in this kernel (/proc/misc): the VG works, LVs cannot be activated
        with pytest.raises(CommandExecutionError, match="lvcreate"):
            v["virt.volume_define"](vg, "lv1", 8)
    assert v["virt.pool_list_volumes"](vg) in ([], ["lv1"])
    # a second pool on the same device: refused, nothing lost
    with pytest.raises(CommandExecutionError, match="Storage source conflict"):
        v["virt.pool_define"]("stvg2", "logical", source_devices=[dev], source_name="othervg")
    assert sh("vgs", "--noheadings", "-o", "pv_name", vg).stdout.strip() == dev
    gone = st["virt.pool_deleted"](vg, purge=True)
    assert gone["result"] is True and gone["changes"]["deleted"] is True
    assert sh("vgs", vg, check=False).returncode != 0  # pool_delete removed the VG


def test_disk_pool_on_loop_device_vm_boots_from_partition(virt_hv, hv1, loop_device, pools, guest, boot_args):
    v = virt_hv
    dev = loop_device("192M")
    assert v["virt.pool_define"](
        "stdisk", "disk", target="/dev", source_devices=[{"path": dev, "part_separator": True}], source_format="gpt"
    )
    assert "gpt" in sh("blkid", "-p", "-o", "value", "-s", "PTTYPE", dev, check=False).stdout  # built: labelled
    ret = v["virt.init"](
        "stv2", 1, 256, image=guest["raw"], boot=boot_args, disks=[{"name": "system", "pool": "stdisk"}]
    )
    part = os.path.basename(dev) + "p1"
    assert [(d["volume"], d["format"], d["path"]) for d in ret["disks"]] == [(part, "raw", f"/dev/{part}")]
    log = lab.wait_for_text(console(hv1, "stv2"), "SALT-MINION-ID:", timeout=300)
    assert "SALT-MINION-ID: stv2" in log
    purged = v["virt.purge"]("stv2")
    assert purged["volumes"]["removed"] == [f"stdisk/{part}"]
    assert v["virt.pool_list_volumes"]("stdisk") == []
    gone = load_states(v)["virt.pool_deleted"]("stdisk", purge=True)
    assert gone["changes"]["deleted"] is False and "deleting pool" in gone["comment"]  # libvirt cannot unlabel


def test_iscsi_pool_chap_password_goes_into_a_private_secret(virt_hv, hv1, pools):
    """No iSCSI target runs here (the pool is defined, not started): what is checked is the secret."""
    import libvirt

    v = virt_hv
    auth = {"username": "iqnuser", "password": "chap-s3cret"}
    args = {
        "source_hosts": ["192.0.2.10:3260"],
        "source_devices": ["iqn.2024-01.example:t1"],
        "target": "/dev/disk/by-path",
    }
    assert v["virt.pool_define"]("stiscsi", "iscsi", source_auth=auth, start=False, **args) is True
    xml = v["virt.pool_get_xml"]("stiscsi")
    assert "chap-s3cret" not in xml and "<secret usage='pool_stiscsi'/>" in xml
    conn = libvirt.open(hv1.uri)
    try:
        secret = conn.secretLookupByUsage(libvirt.VIR_SECRET_USAGE_TYPE_ISCSI, "pool_stiscsi")
        assert "<secret ephemeral='no' private='yes'>" in secret.XMLDesc(0)
        with pytest.raises(libvirt.libvirtError):  # private: nobody reads it back through the API
            secret.value(0)
        st = load_states(v)
        source = {"auth": auth, "hosts": args["source_hosts"]}
        same = st["virt.pool_defined"]("stiscsi", ptype="iscsi", source=source, autostart=False)
        assert same["result"] is True and same["changes"] == {} and "chap-s3cret" not in repr(same)
        assert v["virt.pool_undefine"]("stiscsi")["undefined"] is True
        with pytest.raises(libvirt.libvirtError):  # the secret pool_define made went with the pool
            conn.secretLookupByUsage(libvirt.VIR_SECRET_USAGE_TYPE_ISCSI, "pool_stiscsi")
    finally:
        conn.close()


def test_pool_and_volume_removal_never_takes_what_something_uses(virt_hv, hv1, pools, qemu_tmp, tmp_path):
    """On a real dir pool: a foreign domain's volume, a base an overlay backs onto and the pool around them
    are not deleted (running or stopped) until nothing uses them; an operator's pool outside
    virt:pool_paths starts but is never built (its directory is not made) until the operator allows it."""
    v = virt_hv
    target = qemu_tmp / "delpool"
    dir_pool_with_an_overlay(v, "stdel", target, ("own", "base"))
    disk = "<disk type='volume' device='disk'><source pool='stdel' volume='own.raw'/><target dev='vda'/></disk>"
    xml = (
        "<domain type='qemu'><name>stvdel</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>"
        f"<devices>{disk}</devices></domain>"
    )
    assert v["virt.define_xml_str"](xml) is True
    with pytest.raises(SaltInvocationError, match="volume stdel/own.raw is a disk of VM 'stvdel': refused"):
        v["virt.volume_delete"]("stdel", "own.raw")
    with pytest.raises(SaltInvocationError, match=f"volume stdel/base.raw is the backing file of {target}/top.qcow2"):
        v["virt.volume_delete"]("stdel", "base.raw")
    gone = load_states(v)["virt.pool_deleted"]("stdel", purge=True)
    assert gone["result"] is False and "is a disk of VM 'stvdel': refused" in gone["comment"], gone
    assert v["virt.pool_stop"]("stdel")["stopped"] is True
    with pytest.raises(SaltInvocationError, match="pool stdel: own.raw is a disk of VM 'stvdel': refused"):
        v["virt.pool_delete"]("stdel", fast=False)
    assert sorted(os.listdir(target)) == ["base.raw", "own.raw", "top.qcow2"]
    v["virt.undefine"]("stvdel")
    v["virt.pool_start"]("stdel")
    for vol in ("top.qcow2", "base.raw", "own.raw"):  # nothing uses them now
        assert v["virt.volume_delete"]("stdel", vol) is True
    v["virt.pool_stop"]("stdel")
    assert v["virt.pool_delete"]("stdel") is True and not target.exists()
    assert v["virt.pool_undefine"]("stdel")["undefined"] is True

    # the operator's pool, defined outside virt:pool_paths: started as it is, never built by a call
    elsewhere = tempfile.mkdtemp(prefix="svt-op-", dir="/var/tmp")
    try:
        optarget = os.path.join(elsewhere, "oppool")
        import libvirt  # the operator defines it: straight through libvirt

        conn = libvirt.open(hv1.uri)
        try:
            conn.storagePoolDefineXML(
                f"<pool type='dir'><name>stop</name><target><path>{optarget}</path></target></pool>", 0
            )
        finally:
            conn.close()
        with pytest.raises(
            CommandExecutionError, match="it was not built first: build pool stop refused .*virt:pool_paths"
        ):
            v["virt.pool_start"]("stop")
        with pytest.raises(SaltInvocationError, match="build pool stop refused .*virt:pool_paths"):
            v["virt.pool_build"]("stop")
        assert not os.path.exists(optarget)
        allowed = make_minion_mods(tmp_path / "m3", hv1.uri, **dict(v.opts["virt"], pool_paths=[elsewhere]))
        assert allowed["virt.pool_start"]("stop")["started"] is True and os.path.isdir(optarget)
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_pool_purge_takes_the_volumes_of_vms_undefined_outside_salt_virt(virt_hv, hv1, pools, qemu_tmp):
    """Issue #36 on a real dir pool: two salt-virt VMs' volumes, the VMs undefined with libvirt (virsh
    undefine), so their manifests still record them. While a domain salt-virt did not make uses one by its
    path, the purge is refused as for any used volume; once nothing uses them both go with the pool (their
    files too) and the return names each with its VM."""
    import libvirt

    v = virt_hv
    target = qemu_tmp / "orphpool"
    assert v["virt.pool_define"]("storph", "dir", target=str(target)) is True
    paths = {}
    conn = libvirt.open(hv1.uri)
    try:
        for vm in ("stvo1", "stvo2"):
            disks = [{"name": "d", "pool": "storph", "size": 1, "format": "raw"}]
            v["virt.init"](vm, 1, 64, nic=None, disk=None, start=False, disks=disks)
            conn.lookupByName(vm).undefine()
            paths[vm] = str(target / f"{vm}_d")
        assert all(os.path.isfile(p) for p in paths.values())
        keeper = (
            "<domain type='qemu'><name>stvkeep</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>"
            f"<devices><disk type='file' device='disk'><source file='{paths['stvo2']}'/><target dev='vda'/></disk>"
            "</devices></domain>"
        )
        conn.defineXML(keeper)
        used = f"pool storph: {paths['stvo2']} is a disk of VM 'stvkeep': refused (deleting it destroys what that"
        gone = load_states(v)["virt.pool_deleted"]("storph", purge=True)
        assert gone["result"] is False and used in gone["comment"], gone
        assert all(os.path.isfile(p) for p in paths.values())
        conn.lookupByName("stvkeep").undefine()
    finally:
        conn.close()
    gone = load_states(v)["virt.pool_deleted"]("storph", purge=True)
    why = "belonged to VM '{}', which no longer exists on this host"
    assert gone["result"] is True, gone
    assert gone["changes"]["deleted_orphans"] == {f"{vm}_d": why.format(vm) for vm in paths}, gone
    assert not target.exists() and "storph" not in v["virt.list_pools"]()
