"""saltvirt.storage.poolcalls: Salt's raw storage functions (virt.pool_define, pool_update, volume_define with a
backing_store, volume_upload, and the pool/volume states) stay within what the operator configured. Through
the real Salt loader on libvirt's test:/// driver, real files in tmp dirs; each refusal leaves libvirt as it was."""

import json
import os
import re

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.storage import images
from saltvirt.xml import poolxml
from tests.support import hostile
from tests.support.saltloader import SOURCES, load_states, make_minion_mods


@pytest.fixture
def conn(default_pools_conn):
    return default_pools_conn


@pytest.fixture
def strict(tmp_path, conn):
    """virt.* with an operator who made little available: pools only in tmp_path/pools, one device, one
    volume group, one NFS server; existing volumes from the pool 'rp-ok'."""
    (tmp_path / SOURCES).mkdir(exist_ok=True)
    sources = {"devices": ["/dev/vd-ok"], "names": ["vg_ok"], "hosts": ["nfs.example.com"], "adapters": ["host9"]}
    return make_minion_mods(
        tmp_path / "m",
        "test:///default",
        images_dir=tmp_path / "images",
        allowed_paths=[str(tmp_path / SOURCES)],
        pool_paths=[str(tmp_path / "pools")],
        pool_sources=sources,
        pools=["rp-ok"],
    )


def _pools(conn):
    return {p.name() for p in conn.listAllStoragePools(0)}


# pools --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ptype", "kwargs", "refusal"),
    [
        ("dir", {"target": "/etc"}, "target /etc is outside the directories pools may use .*virt:pool_paths"),
        ("dir", {"target": "{images}/vm1"}, "is inside virt:images, salt-virt's VM directories: refused"),
        ("dir", {"target": "{pools}/../../x"}, "must be an absolute path without '..'"),
        (
            "netfs",
            {"target": "{pools}/n", "source_hosts": ["evil.example.com"], "source_dir": "/export"},
            "source host evil.example.com is not one the operator made available .*virt:pool_sources:hosts",
        ),
        (
            "fs",
            {"target": "{pools}/f", "source_devices": [{"path": "/dev/sda"}]},
            "source device /dev/sda is not one .*virt:pool_sources:devices in the minion config",
        ),
        ("disk", {"source_devices": ["/dev/sda"]}, "source device /dev/sda is not one"),
        ("logical", {}, "volume group rp-bad is not one .*virt:pool_sources:names"),  # libvirt: VG named like it
        ("logical", {"source_name": "root_vg"}, "volume group root_vg is not one"),
        ("zfs", {"source_name": "rpool"}, "zpool rpool is not one"),
        ("scsi", {"source_adapter": {"type": "scsi_host", "name": "host0"}}, "SCSI adapter host0 is not one"),
        ("mpath", {}, "multipath .* is not one .*virt:pool_sources:adapters"),
    ],
)
def test_pool_define_refuses_what_the_operator_did_not_make_available(strict, conn, tmp_path, ptype, kwargs, refusal):
    where = {"images": str(tmp_path / "images"), "pools": str(tmp_path / "pools")}
    kwargs = {k: v.format(**where) if isinstance(v, str) else v for k, v in kwargs.items()}
    before = _pools(conn)
    with pytest.raises(SaltInvocationError, match=refusal):
        strict["virt.pool_define"]("rp-bad", ptype, start=False, **kwargs)
    source = {k.removeprefix("source_"): v for k, v in kwargs.items() if k != "target"}
    for test in (True, False):  # the states: the same refusal, also for test=True
        state = load_states(strict, test)["virt.pool_defined"]
        ret = state("rp-bad", ptype=ptype, target=kwargs.get("target"), source=source)
        assert ret["result"] is False and re.search(refusal, ret["comment"]), ret
    assert _pools(conn) == before


def test_pool_define_within_the_limits_and_symlinks_resolved(strict, conn, tmp_path):
    pools = tmp_path / "pools"
    pools.mkdir()
    assert strict["virt.pool_define"]("rp-ok", "dir", target=str(pools / "a"), start=False) is True
    sources = {"target": str(pools / "n"), "source_hosts": ["NFS.example.com:2049"], "source_dir": "/export"}
    assert strict["virt.pool_define"]("rp-nfs", "netfs", start=False, **sources) is True
    assert strict["virt.pool_define"]("vg_ok", "logical", source_devices=["/dev/vd-ok"], start=False) is True
    os.symlink("/etc", pools / "etc")  # inside pool_paths by name, /etc once resolved
    with pytest.raises(SaltInvocationError, match=r"target .*/etc/x \(resolves to /etc/x\)|is outside"):
        strict["virt.pool_define"]("rp-bad", "dir", target=str(pools / "etc" / "x"), start=False)
    assert "rp-bad" not in _pools(conn)


def test_an_existing_pool_is_checked_for_what_a_call_changes(strict, conn, tmp_path):
    """The operator's pool (defined outside these limits) keeps working: a call may change its permissions,
    not move its target or sources out of the limits."""
    spec = poolxml.pool_spec("rp-op", "dir", "/srv/operator-pool")
    conn.storagePoolDefineXML(poolxml.pool_xml(spec), 0)
    assert strict["virt.pool_update"]("rp-op", "dir", permissions={"mode": "0750"}) is True
    with pytest.raises(SaltInvocationError, match="target /etc is outside"):
        strict["virt.pool_update"]("rp-op", "dir", target="/etc")
    with pytest.raises(SaltInvocationError, match="source device /dev/sda is not one"):  # a type change: all of it
        strict["virt.pool_update"]("rp-op", "fs", target=str(tmp_path / "pools" / "f"), source_devices=["/dev/sda"])
    ret = load_states(strict)["virt.pool_defined"]("rp-op", ptype="dir", target="/etc")
    assert ret["result"] is False and "target /etc is outside" in ret["comment"]
    assert load_states(strict)["virt.pool_defined"]("rp-op", ptype="dir")["result"] is True  # nothing changes
    assert poolxml.parse_pool(conn.storagePoolLookupByName("rp-op").XMLDesc(0))["target"] == "/srv/operator-pool"


# volumes ------------------------------------------------------------------------------------------
@pytest.fixture
def pool(strict, conn, tmp_path):
    """A running dir pool 'rp-ok' (in virt:pools) and the files of the tests."""
    (tmp_path / "pools").mkdir(exist_ok=True)
    strict["virt.pool_define"]("rp-ok", "dir", target=str(tmp_path / "pools" / "rp-ok"))
    folder = tmp_path / SOURCES
    raw = folder / "base.raw"
    raw.write_bytes(b"\0" * 65536)
    qcow2 = str(folder / "base.qcow2")
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", qcow2, "1M"])
    secret = hostile.secret_file(str(folder))
    attached = folder / "attached.raw"
    attached.write_bytes(b"\0" * 65536)
    return {
        "raw": str(raw),
        "qcow2": qcow2,
        "secret": secret,
        "backing": hostile.backing_file_image(str(folder), secret),
        "attached": str(attached),
    }


@pytest.mark.parametrize(
    ("backing", "refusal"),
    [
        ({"path": "/etc/shadow", "format": "raw"}, "backing_store path /etc/shadow is outside the directories"),
        ({"path": "{backing}", "format": "qcow2"}, "is a qcow2 with a backing file: refused"),
        ({"path": "{raw}", "format": "qcow2"}, "is raw, not qcow2"),
        ({"path": "{qcow2}", "format": "vmdk"}, "format must be one of"),
        ({"path": "{theirs}", "format": "qcow2"}, "backing_store: .* is a disk of VM 'rv1': refused"),
        ({"path": "{attached}", "format": "raw"}, "backing_store: .* is a disk of VM 'rv2': refused"),
        ({"path": "{missing}", "format": "raw"}, "does not exist"),
    ],
)
def test_a_backing_store_goes_through_the_ownership_door(strict, conn, pool, tmp_path, backing, refusal):
    images = tmp_path / "images"
    strict["virt.init"]("rv1", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "data", "size": 1}])
    strict["virt.init"](
        "rv2", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "d", "path": pool["attached"], "format": "raw"}]
    )
    where = dict(pool, theirs=str(images / "rv1" / "data.qcow2"), missing=f"{pool['raw']}.x")
    backing = dict(backing, path=backing["path"].format(**where))
    try:
        with pytest.raises(SaltInvocationError, match=refusal):
            strict["virt.volume_define"]("rp-ok", "top.qcow2", 8, format="qcow2", backing_store=backing)
        ret = load_states(strict)["virt.volume_defined"]("rp-ok", "top.qcow2", 8, format="qcow2", backing_store=backing)
        assert ret["result"] is False and ret["changes"] == {}, ret
        assert strict["virt.pool_list_volumes"]("rp-ok") == []
    finally:
        for vm in ("rv1", "rv2"):
            strict["virt.purge"](vm)


def test_a_backing_store_the_operator_made_available(strict, conn, pool, tmp_path):
    base = {"path": pool["qcow2"], "format": "qcow2"}
    assert strict["virt.volume_define"]("rp-ok", "top.qcow2", 8, format="qcow2", backing_store=base) is True
    xml = conn.storagePoolLookupByName("rp-ok").storageVolLookupByName("top.qcow2").XMLDesc(0)
    assert poolxml.parse_volume(xml)["backing_store"] == base
    # a new volume in a pool the operator did not list (virt:pools set): refused
    conn.storagePoolCreateXML(poolxml.pool_xml(poolxml.pool_spec("rp-other", "dir", "/srv/rp-other")), 0)
    with pytest.raises(SaltInvocationError, match="pool 'rp-other' is not one the operator made available"):
        strict["virt.volume_define"]("rp-other", "v", 1)
    # a base the operator vouches for (virt:insecure_trusted_images) may be shared and lie anywhere
    trusted = make_minion_mods(
        tmp_path / "t",
        "test:///default",
        images_dir=tmp_path / "images",
        insecure_trusted_images=[pool["backing"]],
        allowed_paths=[],
    )
    chain = {"path": pool["backing"], "format": "raw"}
    assert trusted["virt.volume_define"]("rp-ok", "t2.qcow2", 8, format="qcow2", backing_store=chain) is True


def test_volume_upload_reads_only_allowed_files_into_free_volumes(strict, conn, pool, tmp_path):
    strict["virt.volume_define"]("rp-ok", "free", 1, format="raw")
    for path, refusal in [
        ("/etc/shadow", "file /etc/shadow is outside the directories salt-virt may use"),
        (str(tmp_path / "images" / "rv3" / "data.qcow2"), "file: .* is a disk of VM 'rv3': refused"),
    ]:
        strict["virt.init"]("rv3", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "data", "size": 1}])
        try:
            with pytest.raises(SaltInvocationError, match=refusal):
                strict["virt.volume_upload"]("rp-ok", "free", path)
        finally:
            strict["virt.purge"]("rv3")
    # the volume: in a pool VMs may attach from, and no VM's disk
    conn.storagePoolCreateXML(poolxml.pool_xml(poolxml.pool_spec("rp-host", "dir", "/srv/rp-host")), 0)
    with pytest.raises(SaltInvocationError, match="pool 'rp-host' is not one the operator made available"):
        strict["virt.volume_upload"]("rp-host", "root-lv", pool["raw"])
    strict["virt.init"](
        "rv4", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "d", "pool": "rp-ok", "size": 1}]
    )
    try:
        used = [v for v in strict["virt.pool_list_volumes"]("rp-ok") if v.startswith("rv4")][0]
        with pytest.raises(SaltInvocationError, match=f"volume rp-ok/{used} is a disk of VM 'rv4': refused"):
            strict["virt.volume_upload"]("rp-ok", used, pool["raw"])
    finally:
        strict["virt.purge"]("rv4")


def test_a_backing_store_volume_comes_from_a_pool_vms_may_attach_from(strict, conn, pool, tmp_path):
    """A volume is a backing store by its pool (virt:pools), wherever its pool keeps it; one of a pool the
    operator did not list is refused (a host's LV, another tenant's pool)."""
    strict["virt.volume_define"]("rp-ok", "base.raw", 1, format="raw")
    path = strict["virt.volume_infos"]("rp-ok", "base.raw")["rp-ok"]["base.raw"]["path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)  # the test driver keeps no file: put one where it says
    with open(path, "wb") as fh:
        fh.write(b"\0" * 65536)
    base = {"path": path, "format": "raw"}  # outside virt:allowed_paths and virt:images: by its pool
    assert strict["virt.volume_define"]("rp-ok", "top.qcow2", 8, format="qcow2", backing_store=base) is True
    conn.storagePoolCreateXML(poolxml.pool_xml(poolxml.pool_spec("rp-lvs", "dir", str(tmp_path / "lvs"))), 0)
    conn.storagePoolLookupByName("rp-lvs").createXML(
        "<volume><name>root</name><capacity>1048576</capacity></volume>", 0
    )
    root = {"path": str(tmp_path / "lvs" / "root"), "format": "raw"}
    with pytest.raises(SaltInvocationError, match="pool 'rp-lvs' is not one the operator made available"):
        strict["virt.volume_define"]("rp-ok", "t3.qcow2", 8, format="qcow2", backing_store=root)
    assert sorted(strict["virt.pool_list_volumes"]("rp-ok")) == ["base.raw", "top.qcow2"]


# what a call removes: only within the limits, never what something uses ----------------------------
OUTSIDE = "{action} pool {pool} refused \\(not within the operator's limits\\): pool {pool}: .*{key} in the minion"
USED = "{what} is {user}: refused \\(deleting it destroys what that holds\\)"


def _foreign_domain(conn, name, path):
    """A domain salt-virt did not make (virt-install, an older Salt), defined only, with the disk ``path``."""
    return conn.defineXML(
        f"<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os><devices>"
        f"<disk type='file' device='disk'><source file='{path}'/><target dev='vda'/></disk></devices></domain>"
    )


def test_pool_removal_and_building_only_within_the_limits(strict, conn, tmp_path):
    """The operator's pools (a directory outside virt:pool_paths, a volume group not in virt:pool_sources)
    are not built, deleted or undefined by a call; the refusal names the key that would allow it."""
    conn.storagePoolDefineXML(poolxml.pool_xml(poolxml.pool_spec("rp-op", "dir", "/srv/operator-pool")), 0)
    spec = poolxml.pool_spec("root_vg", "logical", source_devices=[{"path": "/dev/vd-ok"}])  # the VG is not
    conn.storagePoolDefineXML(poolxml.pool_xml(spec), 0)
    conn.storagePoolCreateXML(poolxml.pool_xml(poolxml.pool_spec("rp-tr", "dir", "/srv/operator-tr")), 0)
    dir_key, vg_key = "virt:pool_paths", "virt:pool_sources:names"
    for pool, key in (("rp-op", dir_key), ("root_vg", vg_key)):
        for action, call in [
            ("build", strict["virt.pool_build"]),
            ("delete", strict["virt.pool_delete"]),
            ("delete", lambda p: strict["virt.pool_delete"](p, fast=False)),
            ("undefine", strict["virt.pool_undefine"]),
        ]:
            with pytest.raises(SaltInvocationError, match=OUTSIDE.format(action=action, pool=pool, key=key)):
                call(pool)
        for test in (True, False):
            for purge, action in ((True, "delete"), (False, "undefine")):
                ret = load_states(strict, test)["virt.pool_deleted"](pool, purge=purge)
                refusal = OUTSIDE.format(action=action, pool=pool, key=key)
                assert ret["result"] is False and ret["changes"] == {} and re.search(refusal, ret["comment"]), ret
    with pytest.raises(SaltInvocationError, match=OUTSIDE.format(action=".*transient", pool="rp-tr", key=dir_key)):
        strict["virt.pool_stop"]("rp-tr")  # a transient pool is gone once stopped
    assert {"rp-op", "root_vg", "rp-tr"} <= _pools(conn) and conn.storagePoolLookupByName("rp-tr").isActive()
    # they still start (never built), stop and start again: what the operator set up stays usable
    assert strict["virt.pool_start"]("rp-op") == {"name": "rp-op", "started": True}
    assert strict["virt.pool_stop"]("rp-op") == {"name": "rp-op", "stopped": True}
    # within the limits: a call builds, deletes and undefines what it could define again
    target = str(tmp_path / "pools" / "rp-mine")
    strict["virt.pool_define"]("rp-mine", "dir", target=target, start=False)
    assert strict["virt.pool_build"]("rp-mine") is True
    assert strict["virt.pool_delete"]("rp-mine") is True
    assert strict["virt.pool_undefine"]("rp-mine") == {"name": "rp-mine", "undefined": True}


def test_volume_delete_never_takes_what_something_uses(strict, conn, pool, tmp_path):
    v = strict
    # a salt-virt VM's volume, defined only (never started)
    v["virt.init"]("rv5", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "d", "pool": "rp-ok", "size": 1}])
    # a foreign domain's disk, by the volume's path
    v["virt.volume_define"]("rp-ok", "theirs.raw", 1, format="raw")
    theirs = v["virt.volume_infos"]("rp-ok", "theirs.raw")["rp-ok"]["theirs.raw"]["path"]
    _foreign_domain(conn, "rp-foreign", theirs)
    # a base another volume backs onto (the test driver keeps no file: put one where it says)
    v["virt.volume_define"]("rp-ok", "base.raw", 1, format="raw")
    base = v["virt.volume_infos"]("rp-ok", "base.raw")["rp-ok"]["base.raw"]["path"]
    os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base, "wb") as fh:
        fh.write(b"\0" * 65536)
    v["virt.volume_define"]("rp-ok", "top.qcow2", 8, format="qcow2", backing_store={"path": base, "format": "raw"})
    try:
        mine = [vol for vol in v["virt.pool_list_volumes"]("rp-ok") if vol.startswith("rv5")][0]
        for volume, user in [
            (mine, "a disk of VM 'rv5'"),
            ("theirs.raw", "a disk of VM 'rp-foreign'"),
            ("base.raw", "the backing file of .*top.qcow2"),
        ]:
            with pytest.raises(SaltInvocationError, match=USED.format(what=f"volume rp-ok/{volume}", user=user)):
                v["virt.volume_delete"]("rp-ok", volume)
        # the whole pool neither, running (purge) or stopped
        for test in (True, False):
            ret = load_states(v, test)["virt.pool_deleted"]("rp-ok", purge=True)
            assert ret["result"] is False and re.search(USED.format(what="pool rp-ok: .*", user=".*"), ret["comment"])
        assert sorted(v["virt.pool_list_volumes"]("rp-ok")) == sorted([mine, "theirs.raw", "base.raw", "top.qcow2"])
        v["virt.pool_stop"]("rp-ok")
        with pytest.raises(SaltInvocationError, match=USED.format(what="pool rp-ok: .*", user="a disk of VM 'rv5'")):
            v["virt.pool_delete"]("rp-ok", fast=False)
        v["virt.pool_start"]("rp-ok")
        # once nothing uses them, they go
        assert v["virt.volume_delete"]("rp-ok", "top.qcow2") is True
        assert v["virt.volume_delete"]("rp-ok", "base.raw") is True
    finally:
        v["virt.purge"]("rv5")
        conn.lookupByName("rp-foreign").undefine()
    assert v["virt.volume_delete"]("rp-ok", "theirs.raw") is True
    assert load_states(v)["virt.pool_deleted"]("rp-ok", purge=True)["result"] is True
    # a pool neither in virt:pools nor within the limits: its volumes are not a call's to delete
    conn.storagePoolCreateXML(poolxml.pool_xml(poolxml.pool_spec("rp-host", "dir", "/srv/rp-host")), 0)
    conn.storagePoolLookupByName("rp-host").createXML("<volume><name>lv</name><capacity>1024</capacity></volume>", 0)
    refusal = "delete volume rp-host/lv refused: pool 'rp-host' is not one .* adds it to virt:pools"
    with pytest.raises(SaltInvocationError, match=refusal):
        v["virt.volume_delete"]("rp-host", "lv")


def test_a_stopped_pool_is_not_deleted_under_a_domain(strict, conn, tmp_path):
    """A stopped pool lists no volumes: a domain's disk below its target (here a volume group's
    /dev/<vg>, the operator listed) keeps it."""
    strict["virt.pool_define"]("vg_ok", "logical", source_devices=["/dev/vd-ok"], start=False)
    _foreign_domain(conn, "rp-lv-user", "/dev/vg_ok/data")
    try:
        used = USED.format(what="pool vg_ok: /dev/vg_ok/data", user="a disk of VM 'rp-lv-user'")
        with pytest.raises(SaltInvocationError, match=used):
            strict["virt.pool_delete"]("vg_ok")
    finally:
        conn.lookupByName("rp-lv-user").undefine()
    assert strict["virt.pool_delete"]("vg_ok") is True


def _orphan(v, conn, vm):
    """A salt-virt VM's pool volume in rp-ok, the VM then undefined outside salt-virt (virsh undefine): its
    manifest still records the volume. Returns (volume, its path)."""
    v["virt.init"](vm, 1, 64, nic=None, disk=None, start=False, disks=[{"name": "d", "pool": "rp-ok", "size": 1}])
    conn.lookupByName(vm).undefine()
    volume = [vol for vol in v["virt.pool_list_volumes"]("rp-ok") if vol.startswith(vm)][0]
    return volume, v["virt.volume_infos"]("rp-ok", volume)["rp-ok"][volume]["path"]


def test_pool_purge_deletes_the_volumes_of_a_vm_undefined_outside_salt_virt(strict, conn, pool, tmp_path):
    """Issue #36: the operator purges the pool; a volume whose VM is gone and that no domain uses goes with
    it, and the return says so and names the VM. virt:adopt_orphan_disks (off here) keeps its meaning."""
    v = strict
    volume, path = _orphan(v, conn, "rv6")
    v["virt.volume_define"]("rp-ok", "free.raw", 1, format="raw")
    os.makedirs(os.path.dirname(path), exist_ok=True)  # the test driver keeps no file: put one where it says
    with open(path, "wb") as fh:
        fh.write(b"\0" * 65536)
    refusal = "belongs to VM 'rv6', which no longer exists on this host: refused.*virt:adopt_orphan_disks"
    with pytest.raises(SaltInvocationError, match=refusal):  # given to a new VM: still the operator's switch
        v["virt.init"](
            "rv7",
            1,
            64,
            nic=None,
            disk=None,
            start=False,
            disks=[{"name": "d", "pool": "rp-ok", "source_file": volume}],
        )
    why = {volume: "belonged to VM 'rv6', which no longer exists on this host"}
    would = load_states(v, True)["virt.pool_deleted"]("rp-ok", purge=True)
    assert would["result"] is None and would["changes"]["deleted_orphans"] == why, would
    assert f"orphans deleted with it: {volume} ({why[volume]})" in would["comment"]
    assert sorted(v["virt.pool_list_volumes"]("rp-ok")) == sorted([volume, "free.raw"])
    done = load_states(v)["virt.pool_deleted"]("rp-ok", purge=True)
    assert done["result"] is True and done["changes"]["deleted_orphans"] == why, done
    assert sorted(done["changes"]["deleted_volumes"]) == sorted([volume, "free.raw"])
    assert "rp-ok" not in _pools(conn)
    manifest = images.load_manifest(str(tmp_path / "images" / "rv6"))  # the gone VM no longer records it
    assert not [r for r in manifest.get("volumes") or [] if r["volume"] == volume]


def test_pool_purge_still_refuses_an_orphan_a_defined_domain_uses(strict, conn, pool, tmp_path):
    """An orphan another domain (defined only, salt-virt did not make it) uses by its path keeps the pool,
    with the wording of any used volume."""
    v = strict
    volume, path = _orphan(v, conn, "rv8")
    _foreign_domain(conn, "rp-keeper", path)
    try:
        for test in (True, False):
            ret = load_states(v, test)["virt.pool_deleted"]("rp-ok", purge=True)
            used = USED.format(what=f"pool rp-ok: {re.escape(path)}", user="a disk of VM 'rp-keeper'")
            assert ret["result"] is False and ret["changes"] == {} and re.search(used, ret["comment"]), ret
    finally:
        conn.lookupByName("rp-keeper").undefine()
    assert volume in v["virt.pool_list_volumes"]("rp-ok")


def test_pool_purge_keeps_an_orphan_whose_vm_another_hypervisor_made(strict, conn, pool, tmp_path):
    """With virt:images shared, a VM another hypervisor made looks gone from here: its volume keeps the pool."""
    v = strict
    volume, _ = _orphan(v, conn, "rv8")
    vm_dir = str(tmp_path / "images" / "rv8")
    manifest = images.load_manifest(vm_dir)  # as a hypervisor sharing virt:images would have written it
    with open(os.path.join(vm_dir, images.MANIFEST), "w") as fh:
        json.dump(dict(manifest, host="hyper-other"), fh)
    ret = load_states(v)["virt.pool_deleted"]("rp-ok", purge=True)
    assert ret["result"] is False and "belongs to VM 'rv8', which hypervisor hyper-other made" in ret["comment"], ret
    assert volume in v["virt.pool_list_volumes"]("rp-ok")
