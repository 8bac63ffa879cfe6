"""saltvirt.storage.foreign through virt.purge: a VM salt-virt did not create loses its disk files as with
Salt's purge, but never a file outside the allowed roots, one another domain or image uses, one in another
salt-virt VM's directory, or anything that is not a regular file (libvirt's test driver, real qemu-img)."""

import os
import subprocess

import pytest

from saltvirt.storage import foreign

DISK = (
    "<disk type='file' device='{device}'><driver name='qemu' type='{fmt}'/><source file='{path}'/>"
    "<target dev='{dev}' bus='virtio'/></disk>"
)


def domain_xml(name, disks):
    devs = "".join(
        DISK.format(device=d.get("device", "disk"), fmt=d.get("fmt", "raw"), path=d["path"], dev=f"vd{chr(97 + i)}")
        for i, d in enumerate(disks)
    )
    return (
        f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os>"
        f"<devices>{devs}</devices></domain>"
    )


def raw(path, size="1M"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(path), size], check=True)
    return str(path)


def overlay(path, base):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", str(path)], check=True)
    return str(path)


@pytest.fixture
def roots(virt_test, tmp_path):
    images = virt_test["config.get"]("virt:images")
    outside = tmp_path / "elsewhere"
    return {"images": images, "sources": str(tmp_path / "sources"), "outside": str(outside)}


def test_a_foreign_vms_disks_go_what_others_use_stays(virt_test, roots):
    v, images = virt_test, roots["images"]
    own = raw(f"{images}/imported/own.raw")
    base = raw(f"{roots['sources']}/base.raw")  # in virt:allowed_paths
    top = overlay(f"{images}/imported/top.qcow2", base)  # a disk's backing file is not one of its disks: kept
    shared = raw(f"{images}/shared/shared.raw")
    outside = raw(f"{roots['outside']}/keep.raw")
    cdrom = raw(f"{images}/imported/install.iso")
    link = f"{images}/imported/link.raw"
    os.symlink(own, link)
    theirs = raw(f"{images}/other-vm/disk.raw")
    with open(f"{images}/other-vm/.salt-virt.json", "w", encoding="utf-8") as fh:
        fh.write('{"vm": "other-vm", "uuid": null, "files": []}')
    disks = [{"path": p} for p in (own, shared, outside, link, theirs)]
    disks += [{"path": top, "fmt": "qcow2"}, {"path": cdrom, "device": "cdrom"}]
    assert v["virt.define_xml_str"](domain_xml("imported", disks)) is True
    assert v["virt.define_xml_str"](domain_xml("neighbour", [{"path": shared}])) is True

    ret = v["virt.purge"]("imported")
    assert sorted(ret["removed"]) == sorted([own, top])  # Salt's purge: the disks' files, not their bases
    assert not any(os.path.exists(p) for p in (own, top)) and os.path.exists(base)
    assert "used by VM 'neighbour'" in ret["kept"][shared]
    assert "outside the directories VMs may use" in ret["kept"][outside]
    assert ret["kept"][link] == "not a regular file"
    assert "salt-virt VM 'other-vm'" in ret["kept"][theirs]
    assert cdrom not in ret["kept"] and os.path.exists(cdrom)  # removable media: never a candidate
    assert all(os.path.exists(p) for p in (shared, outside, theirs, cdrom))
    assert "imported" not in v["virt.list_domains"]()


def test_a_base_another_image_backs_onto_is_kept(virt_test, roots):
    v, images = virt_test, roots["images"]
    base = raw(f"{images}/golden/base.raw")
    mine = raw(f"{images}/fvm/disk.raw")
    overlay(f"{images}/somebody/top.qcow2", base)  # an image no domain names still needs the base
    assert v["virt.define_xml_str"](domain_xml("fvm", [{"path": base}, {"path": mine}])) is True
    ret = v["virt.purge"]("fvm")
    assert ret["removed"] == [mine] and "backing file of" in ret["kept"][base] and os.path.exists(base)


def test_salt_virts_own_vm_keeps_an_attached_file(virt_test, roots):
    """A VM salt-virt made has a manifest: an attached existing file is not its to delete."""
    v = virt_test
    attached = raw(f"{roots['sources']}/attached.raw")
    disks = [{"name": "a", "path": attached}]
    v["virt.init"]("ownvm", 1, 64, nic=None, disk=None, start=False, seed=False, disks=disks)
    ret = v["virt.purge"]("ownvm")
    assert attached in ret["kept"] and os.path.exists(attached)


def test_pool_directories_count_as_roots(virt_test):
    import libvirt

    conn = libvirt.open("test:///default")  # the driver's default-pool (a dir pool at /default-pool)
    try:
        assert "/default-pool" in foreign.pool_dirs(conn)
    finally:
        conn.close()


VOLDISK = (
    "<disk type='volume' device='{device}'><driver name='qemu' type='raw'/>"
    "<source pool='default-pool' volume='{volume}'/><target dev='{dev}' bus='virtio'/></disk>"
)


def volume_domain_xml(name, volumes, files=()):
    devs = "".join(
        VOLDISK.format(device=device, volume=vol, dev=f"vd{chr(97 + i)}") for i, (vol, device) in enumerate(volumes)
    )
    devs += "".join(
        DISK.format(device="disk", fmt="raw", path=p, dev=f"vd{chr(97 + len(volumes) + i)}")
        for i, p in enumerate(files)
    )
    return (
        f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os>"
        f"<devices>{devs}</devices></domain>"
    )


def test_a_foreign_vms_pool_volumes_go_what_others_use_stays(virt_test):
    """Salt's purge deletes a VM's volumes: a foreign VM's volume disks go unless another domain names the
    same volume or uses its file; a CD-ROM volume is never a candidate."""
    v = virt_test
    for vol in ("fv-own", "fv-named", "fv-byfile", "fv-cd"):
        v["virt.volume_define"]("default-pool", vol, 1)
    try:
        mine = [("fv-own", "disk"), ("fv-named", "disk"), ("fv-byfile", "disk"), ("fv-cd", "cdrom")]
        assert v["virt.define_xml_str"](volume_domain_xml("fvols", mine)) is True
        neighbour = volume_domain_xml("fvneigh", [("fv-named", "disk")], files=["/default-pool/fv-byfile"])
        assert v["virt.define_xml_str"](neighbour) is True

        ret = v["virt.purge"]("fvols")
        assert ret["volumes"]["removed"] == ["default-pool/fv-own"]
        assert ret["volumes"]["kept"] == {
            "default-pool/fv-named": "used by VM 'fvneigh'",
            "default-pool/fv-byfile": "used by VM 'fvneigh'",
        }
        left = v["virt.pool_list_volumes"]("default-pool")
        assert "fv-own" not in left and {"fv-named", "fv-byfile", "fv-cd"} <= set(left)
        assert "fvols" not in v["virt.list_domains"]()
    finally:
        v["virt.purge"]("fvneigh")
        for vol in ("fv-named", "fv-byfile", "fv-cd"):
            if vol in v["virt.pool_list_volumes"]("default-pool"):
                v["virt.volume_delete"]("default-pool", vol)
