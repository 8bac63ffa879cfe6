"""Salt compatibility of the storage half: every pool_*/volume_* function and state called with the argument
names of Salt's virt docstrings (saltext-virt 0.1.0), return shapes checked, on libvirt's test:/// driver
through the real Salt loader. Real pools: tests/integration/test_storage_real.py."""

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.saltloader import load_states


@pytest.fixture
def conn():
    """test:///default (shared in this process: what the loader modules see too); cleaned up after."""
    c = libvirt.open("test:///default")
    pools = {p.name() for p in c.listAllStoragePools(0)}
    yield c
    for obj in c.listAllStoragePools(0):
        if obj.name() not in pools:
            if obj.isActive():
                obj.destroy()
            if obj.isPersistent():
                obj.undefine()
    c.close()


@pytest.fixture
def states(virt_test, conn):
    return lambda test=False: load_states(virt_test, test)


def test_pool_functions_with_salts_argument_names(virt_test, conn):
    v = virt_test
    caps = v["virt.pool_capabilities"](connection="test:///default")
    assert caps["computed"] is True  # the test driver cannot tell: every known type listed
    assert {"dir", "logical", "rbd", "iscsi-direct"} <= {t["name"] for t in caps["pool_types"]}
    assert (
        v["virt.pool_define"](
            "cp1",
            ptype="netfs",
            target="/mnt/cifs",
            permissions={"mode": "0770", "owner": 1000, "group": 100},
            source_dir="samba_share",
            source_hosts=["example.com"],
            source_format="cifs",
            transient=False,
            start=False,
        )
        is True
    )
    info = v["virt.pool_info"](name="cp1")["cp1"]
    assert {k: info[k] for k in ("state", "type", "target_path", "autostart", "persistent")} == {
        "state": "inactive",
        "type": "netfs",
        "target_path": "/mnt/cifs",
        "autostart": False,
        "persistent": True,
    }
    assert {"uuid", "capacity", "allocation", "free"} <= set(info)
    assert "<dir path='samba_share'/>" in v["virt.pool_get_xml"]("cp1")
    # pool_update: False when nothing declared differs, True (and done) when it does; test=True only tells
    assert v["virt.pool_update"]("cp1", ptype="netfs", target="/mnt/cifs", source_format="cifs") is False
    assert v["virt.pool_update"]("cp1", ptype="netfs", target="/mnt/other", test=True) is True
    assert info["uuid"] == v["virt.pool_info"]("cp1")["cp1"]["uuid"]
    assert v["virt.pool_info"]("cp1")["cp1"]["target_path"] == "/mnt/cifs"
    assert v["virt.pool_update"]("cp1", ptype="netfs", target="/mnt/other") is True
    assert v["virt.pool_info"]("cp1")["cp1"]["target_path"] == "/mnt/other"
    assert v["virt.pool_set_autostart"]("cp1", state="on") is True
    assert v["virt.pool_info"]("cp1")["cp1"]["autostart"] is True
    assert v["virt.pool_build"]("cp1") is True
    assert v["virt.pool_start"]("cp1")["started"] is True
    assert v["virt.pool_refresh"]("cp1") is True
    assert v["virt.pool_list_volumes"]("cp1") == []
    assert v["virt.pool_stop"]("cp1")["stopped"] is True
    assert v["virt.pool_delete"]("cp1") is True
    assert v["virt.pool_undefine"]("cp1")["undefined"] is True
    assert "cp1" not in v["virt.list_pools"]()
    # transient: running, gone once stopped
    assert v["virt.pool_define"]("cp2", "logical", source_devices=[{"path": "/dev/sdz"}], transient=True) is True
    assert v["virt.pool_info"]("cp2")["cp2"]["persistent"] is False
    v["virt.pool_stop"]("cp2")
    assert "cp2" not in v["virt.list_pools"]()


def test_pool_bad_input(virt_test, conn):
    v = virt_test
    with pytest.raises(SaltInvocationError, match="pool type must be one of"):
        v["virt.pool_define"]("bad", "lvm", target="/x")
    with pytest.raises(SaltInvocationError, match="a fs pool needs source_devices"):
        v["virt.pool_define"]("bad", "fs", target="/mnt")
    with pytest.raises(SaltInvocationError, match="already defined"):
        v["virt.pool_define"]("default-pool", "dir", target="/elsewhere")
    assert v["virt.pool_info"]("default-pool")["default-pool"]["target_path"] == "/default-pool"  # untouched
    with pytest.raises(SaltInvocationError, match="username/password connections are not supported"):
        v["virt.pool_info"](username="root", password="x")
    with pytest.raises(CommandExecutionError, match="pool 'nope' is not defined"):
        v["virt.pool_build"]("nope")
    with pytest.raises(CommandExecutionError, match="is running: stop it"):
        v["virt.pool_delete"]("default-pool")


def test_volume_functions_with_salts_argument_names(virt_test, conn, tmp_path):
    v = virt_test
    v["virt.pool_define"]("cv1", "dir", target="/cv1")
    assert (
        v["virt.volume_define"](
            "cv1",
            "vol1.qcow2",
            8,
            allocation=0,
            format="qcow2",
            type=None,
            permissions={"mode": "0640"},
            backing_store=None,
            nocow=False,
        )
        is True
    )
    infos = v["virt.volume_infos"](pool="cv1", volume="vol1.qcow2")
    assert set(infos["cv1"]["vol1.qcow2"]) >= {
        "type",
        "key",
        "path",
        "capacity",
        "allocation",
        "used_by",
        "backing_store",
        "format",
    }
    assert infos["cv1"]["vol1.qcow2"]["capacity"] == 8 * 1024 * 1024 and infos["cv1"]["vol1.qcow2"]["used_by"] == []
    with pytest.raises(SaltInvocationError, match="already exists in pool 'cv1'"):
        v["virt.volume_define"]("cv1", "vol1.qcow2", 16)
    assert v["virt.volume_infos"]("cv1", "vol1.qcow2")["cv1"]["vol1.qcow2"]["capacity"] == 8 * 1024 * 1024
    xml = "<volume><name>vol2</name><capacity>1048576</capacity></volume>"
    assert v["virt.define_vol_xml_str"](xml, pool="cv1") is True
    (tmp_path / "vol3.xml").write_text(xml.replace("vol2", "vol3"))
    assert v["virt.define_vol_xml_path"](str(tmp_path / "vol3.xml"), pool="cv1") is True
    assert sorted(v["virt.pool_list_volumes"]("cv1")) == ["vol1.qcow2", "vol2", "vol3"]
    with pytest.raises(SaltInvocationError, match="does not parse"):
        v["virt.define_vol_xml_str"]("<volume", pool="cv1")
    assert v["virt.volume_delete"]("cv1", "vol2") is True
    with pytest.raises(CommandExecutionError, match="volume 'vol2' does not exist in pool 'cv1'"):
        v["virt.volume_delete"](pool="cv1", volume="vol2")
    assert set(v["virt.volume_infos"]()) >= {"cv1"}


def test_pool_states_with_salts_argument_names(states, conn):
    st, preview = states(), states(test=True)
    args = {
        "ptype": "logical",
        "target": "/dev/cvg",
        "permissions": {"mode": "0755"},
        "source": {"devices": [{"path": "/dev/sdz"}], "name": "cvg", "format": "lvm2"},
        "transient": False,
        "autostart": True,
        "connection": "test:///default",
    }
    would = preview["virt.pool_running"]("cs1", **args)
    assert would["result"] is None and set(would["changes"]) == {"defined", "autostart", "started"}
    assert "cs1" not in [p.name() for p in conn.listAllStoragePools(0)]
    made = st["virt.pool_running"]("cs1", **args)
    assert made["result"] is True and made["changes"] == would["changes"]
    again = st["virt.pool_running"]("cs1", **args)
    assert again["changes"] == {} and again["result"] is True
    assert preview["virt.pool_defined"]("cs1", **args) == dict(again, comment="pool cs1 is as declared")
    moved = dict(args, source=dict(args["source"], devices=[{"path": "/dev/sdy"}]))
    changed = preview["virt.pool_defined"]("cs1", **moved)
    assert changed["result"] is None and set(changed["changes"]["redefined"]) == {"source_devices"}
    assert "after a restart" in changed["comment"]
    bad = st["virt.pool_defined"]("cs1", ptype="logical", source={"device": "/dev/sdy"})
    assert bad["result"] is False and "unknown source key(s) device" in bad["comment"]

    gone = preview["virt.pool_deleted"]("cs1", purge=True)
    assert gone["result"] is None and gone["changes"] == {
        "stopped": True,
        "deleted": True,
        "undefined": True,
        "deleted_volumes": [],
    }
    assert conn.storagePoolLookupByName("cs1").isActive()
    assert st["virt.pool_deleted"]("cs1", purge=True)["changes"] == gone["changes"]
    assert st["virt.pool_deleted"]("cs1")["comment"] == "Storage pool could not be found: cs1"
    assert "cs1" not in [p.name() for p in conn.listAllStoragePools(0)]


def test_pool_deleted_purges_volumes_and_names_unsupported(states, virt_test, conn):
    virt_test["virt.pool_define"]("cs2", "dir", target="/cs2")
    virt_test["virt.volume_define"]("cs2", "a", 1)
    done = states()["virt.pool_deleted"]("cs2", purge=True)
    assert done["changes"]["deleted_volumes"] == ["a"] and done["result"] is True
    virt_test["virt.pool_define"]("cs3", "disk", source_devices=["/dev/sdx"], target="/dev")
    done = states()["virt.pool_deleted"]("cs3", purge=True)
    assert done["changes"]["deleted"] is False and "unsupported for this pool type: deleting pool" in done["comment"]


def test_volume_defined_state(states, virt_test, conn):
    virt_test["virt.pool_define"]("cs4", "dir", target="/cs4")
    args = {"pool": "cs4", "size": 16, "format": "qcow2", "allocation": 0, "permissions": None, "nocow": False}
    would = states(test=True)["virt.volume_defined"](name="d1", **args)
    assert would["result"] is None and would["changes"] == {"cs4/d1": {"old": "", "new": "defined"}}
    assert virt_test["virt.pool_list_volumes"]("cs4") == []
    assert states()["virt.volume_defined"](name="d1", **args)["changes"] == would["changes"]
    assert states()["virt.volume_defined"](name="d1", **args) == {
        "name": "d1",
        "result": True,
        "changes": {},
        "comment": "volume is existing",
    }
    bigger = states()["virt.volume_defined"](name="d1", **dict(args, size=32))
    assert bigger["comment"] == "The capacity of the volume is different, but no resize performed"
    other = states()["virt.volume_defined"](name="d1", **dict(args, format="raw"))
    assert other["result"] is False and "different backing store or format" in other["comment"]
    missing = states()["virt.volume_defined"](name="d1", **dict(args, pool="nopool"))
    assert missing["result"] is False and "Storage pool nopool not existing" in missing["comment"]


def test_disks_on_pool_volumes_init_info_purge(virt_test, conn):
    """Salt's ``disks=[{name, pool, size}]``: the volume is made in the pool, attached as type='volume',
    owned by the VM (purge deletes it, never a volume it attached with source_file)."""
    v = virt_test
    v["virt.pool_define"]("cd1", "dir", target="/cd1")
    v["virt.volume_define"]("cd1", "shared", 4)
    ret = v["virt.init"](
        "pv1",
        1,
        128,
        disk=None,
        nic=None,
        start=False,
        disks=[{"name": "data", "pool": "cd1", "size": 16}, {"name": "old", "pool": "cd1", "source_file": "shared"}],
    )
    assert [(d["pool"], d["volume"], d["format"]) for d in ret["disks"]] == [("cd1", "pv1_data", "qcow2")]
    xml = v["virt.get_xml"]("pv1")
    assert "<source pool='cd1' volume='pv1_data'/>" in xml and "<source pool='cd1' volume='shared'/>" in xml
    assert v["virt.volume_infos"]("cd1", "pv1_data")["cd1"]["pv1_data"]["used_by"] == ["pv1"]
    v["virt.volume_define"]("cd1", "pv9_data", 1)  # not ours: a new VM must not take it over
    with pytest.raises(SaltInvocationError, match="volume 'pv9_data' already exists in pool cd1: refusing"):
        v["virt.init"](
            "pv9", 1, 128, disk=None, nic=None, start=False, disks=[{"name": "data", "pool": "cd1", "size": 1}]
        )
    assert "pv9" not in v["virt.list_domains"]()
    v["virt.pool_stop"]("cd1")  # Salt's #60132: VM queries read the XML, a stopped pool does not break them
    disks = v["virt.get_disks"]("pv1")
    assert disks["vda"]["pool"] == "cd1" and disks["vda"]["volume"] == "pv1_data"
    assert v["virt.vm_info"]("pv1")["pv1"]["disks"]["vdb"]["volume"] == "shared"
    v["virt.pool_start"]("cd1")
    purged = v["virt.purge"]("pv1")
    assert purged["volumes"]["removed"] == ["cd1/pv1_data"]
    assert purged["volumes"]["kept"] == {"cd1/shared": "not created by salt-virt for this VM (not in its manifest)"}
    assert v["virt.pool_list_volumes"]("cd1") == ["pv9_data", "shared"]


def test_disks_on_pool_volumes_bad_input(virt_test, conn):
    v = virt_test
    with pytest.raises(CommandExecutionError, match="pool 'nopool' is not defined"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=[{"name": "d", "pool": "nopool", "size": 1}])
    with pytest.raises(SaltInvocationError, match="needs a size"):
        v["virt.init"]("pv2", 1, 128, disk=None, nic=None, disks=[{"name": "d", "pool": "default-pool"}])
    with pytest.raises(SaltInvocationError, match="volume 'nope' does not exist in pool default-pool"):
        v["virt.init"](
            "pv2", 1, 128, disk=None, nic=None, disks=[{"name": "d", "pool": "default-pool", "source_file": "nope"}]
        )
    assert "pv2" not in v["virt.list_domains"]()


# snapshots --------------------------------------------------------------------------------------------
@pytest.fixture
def snapvm(virt_test):
    """A VM with one qcow2 disk on the test driver (running: its memory goes into snapshots)."""
    virt_test["virt.init"]("snap1", 1, 128, disk=None, nic=None, disks=[{"name": "system", "size": 8}])
    yield "snap1"
    conn = libvirt.open("test:///default")  # the shared fixture undefines VMs: drop the snapshots first
    for dom in conn.listAllDomains(0):
        if dom.name().startswith("snap"):
            for snap in dom.listAllSnapshots(0):
                snap.delete(0)
    conn.close()


def test_snapshot_functions_with_salts_argument_names(virt_test, snapvm):
    v = virt_test
    assert v["virt.list_snapshots"](domain=snapvm) == {snapvm: "N/A"}
    first = v["virt.snapshot"](snapvm, name="s1")
    assert first == {"name": "s1", "memory": True}
    auto = v["virt.snapshot"](domain=snapvm, suffix="periodic", connection="test:///default")
    assert auto["name"].startswith(f"{snapvm}-") and auto["name"].endswith("-periodic")
    v["virt.snapshot"](snapvm, name="s3")
    listed = v["virt.list_snapshots"](snapvm)[snapvm]
    assert [s["name"] for s in listed] == ["s1", auto["name"], "s3"]
    assert set(listed[0]) >= {"name", "created", "running", "current"} and listed[0]["running"] is True
    assert [s["current"] for s in listed] == [False, False, True]
    # previous (Salt): the one before the current snapshot
    assert v["virt.revert_snapshot"](snapvm) == {"reverted": auto["name"], "deleted": "N/A"}
    assert v["virt.revert_snapshot"](name=snapvm, vm_snapshot="s1", cleanup=True) == {
        "reverted": "s1",
        "deleted": [auto["name"], "s3"],
    }
    assert [s["name"] for s in v["virt.list_snapshots"](snapvm)[snapvm]] == ["s1"]
    assert v["virt.revert_snapshot"](snapvm, vm_snapshot="s1")["reverted"] == "s1"  # back to the current one: fine
    v["virt.snapshot"](snapvm, name="s4")
    gone = v["virt.delete_snapshots"](snapvm, "s4")
    assert list(gone["deleted"]) == ["s4"] and [s["name"] for s in gone["available"][snapvm]] == ["s1"]
    assert v["virt.delete_snapshots"](snapvm, all=True)["available"] == {snapvm: "N/A"}


def test_snapshot_bad_input_loses_nothing(virt_test, snapvm):
    v = virt_test
    v["virt.snapshot"](snapvm, name="keep")
    with pytest.raises(CommandExecutionError, match='Snapshot "nope" not found for VM snap1'):
        v["virt.revert_snapshot"](snapvm, vm_snapshot="nope")
    with pytest.raises(CommandExecutionError, match="No more previous snapshots available"):
        v["virt.revert_snapshot"](snapvm)
    with pytest.raises(SaltInvocationError, match="already has a snapshot named 'keep'"):
        v["virt.snapshot"](snapvm, name="keep")
    with pytest.raises(SaltInvocationError, match="cannot be named like its VM"):
        v["virt.snapshot"](snapvm, name="snap1")
    with pytest.raises(CommandExecutionError, match="has no snapshot nope .*nothing deleted"):
        v["virt.delete_snapshots"](snapvm, "keep", "nope")
    with pytest.raises(SaltInvocationError, match="pass all=True"):
        v["virt.delete_snapshots"](snapvm)
    assert [s["name"] for s in v["virt.list_snapshots"](snapvm)[snapvm]] == ["keep"]
    v["virt.init"]("snapraw", 1, 128, disk=None, nic=None, disks=[{"name": "system", "size": 8, "format": "raw"}])
    with pytest.raises(CommandExecutionError, match=r"vda \(raw: .*system.raw\) is not qcow2 and cannot hold one"):
        v["virt.snapshot"]("snapraw")
    assert v["virt.list_snapshots"]("snapraw") == {"snapraw": "N/A"}


def test_snapshot_states(virt_test, snapvm):
    st, preview = load_states(virt_test), load_states(virt_test, test=True)
    would = preview["virt.snapshot"]("snap*", suffix="periodic")
    assert would["result"] is None and would["changes"]["saved"][0]["domain"] == snapvm
    assert virt_test["virt.list_snapshots"](snapvm) == {snapvm: "N/A"}  # test: nothing taken
    done = st["virt.snapshot"]("snap*", suffix="periodic")
    assert done["result"] is True and done["comment"] == "Snapshot has been taken"
    assert st["virt.saved"](snapvm, suffix="other")["changes"]["saved"][0]["snapshot"].endswith("-other")
    first = done["changes"]["saved"][0]["snapshot"]
    plan = preview["virt.reverted"](snapvm, snapshot=first, cleanup=True)
    assert plan["result"] is None and plan["changes"]["reverted"] == [
        {
            "domain": snapvm,
            "current": first,
            "deleted": [n["name"] for n in virt_test["virt.list_snapshots"](snapvm)[snapvm]][1:],
        }
    ]
    assert len(virt_test["virt.list_snapshots"](snapvm)[snapvm]) == 2  # test: nothing reverted or deleted
    back = st["virt.reverted"](snapvm, snapshot=first, cleanup=True)
    assert back["result"] is True and back["changes"] == plan["changes"]
    again = st["virt.reverted"](snapvm, snapshot=first, cleanup=True)  # same end state; nothing left to clean
    assert again["changes"]["reverted"] == [{"domain": snapvm, "current": first, "deleted": []}]
    missing = st["virt.reverted"](snapvm, snapshot="nope")
    assert missing["result"] is False and 'Snapshot "nope" not found' in missing["comment"]
    assert st["virt.snapshot"]("nomatch*")["comment"] == 'No domains found for criteria "nomatch*"'


def test_migration_refuses_vm_with_snapshots(virt_test, snapvm):
    from saltvirt import migrate

    virt_test["virt.snapshot"](snapvm, name="before")
    conn = libvirt.open("test:///default")
    try:
        with pytest.raises(CommandExecutionError, match="libvirt cannot migrate a VM with internal snapshots"):
            migrate.migrate(conn, snapvm, "hyper2")
        with pytest.raises(CommandExecutionError, match=r"has 1 snapshot\(s\) \(before\)"):
            migrate.source_info(conn, snapvm, "/srv/salt-images", probe=False)
    finally:
        conn.close()
    assert virt_test["virt.vm_state"](snapvm) == {snapvm: "running"}  # nothing was done
    # purge of a VM with snapshots (the test driver cannot undefine one): tests/integration/test_snapshot_real.py
