"""Salt compatibility of the storage half: every pool_*/volume_* function and state called with the argument
names of Salt's virt docstrings (saltext-virt 0.1.0), return shapes checked, on libvirt's test:/// driver
through the real Salt loader. Real pools: tests/integration/test_storage_real.py. Disks on volumes:
tests/unit/storage/test_volumes.py; snapshots: tests/unit/test_snapshot.py (also with Salt's argument names)."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.saltloader import load_states


@pytest.fixture
def conn(default_pools_conn):
    return default_pools_conn


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
            target="/srv/test-pools/cifs",
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
        "target_path": "/srv/test-pools/cifs",
        "autostart": False,
        "persistent": True,
    }
    assert {"uuid", "capacity", "allocation", "free"} <= set(info)
    assert "<dir path='samba_share'/>" in v["virt.pool_get_xml"]("cp1")
    # pool_update: False when nothing declared differs, True (and done) when it does; test=True only tells
    assert v["virt.pool_update"]("cp1", ptype="netfs", target="/srv/test-pools/cifs", source_format="cifs") is False
    assert v["virt.pool_update"]("cp1", ptype="netfs", target="/srv/test-pools/other", test=True) is True
    assert info["uuid"] == v["virt.pool_info"]("cp1")["cp1"]["uuid"]
    assert v["virt.pool_info"]("cp1")["cp1"]["target_path"] == "/srv/test-pools/cifs"
    assert v["virt.pool_update"]("cp1", ptype="netfs", target="/srv/test-pools/other") is True
    assert v["virt.pool_info"]("cp1")["cp1"]["target_path"] == "/srv/test-pools/other"
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
    v["virt.pool_define"]("cp-run", "dir", target="/srv/test-pools/cp-run")
    with pytest.raises(CommandExecutionError, match="is running: stop it"):
        v["virt.pool_delete"]("cp-run")
    v["virt.pool_undefine"]("cp-run")


def test_volume_functions_with_salts_argument_names(virt_test, conn, tmp_path):
    v = virt_test
    v["virt.pool_define"]("cv1", "dir", target="/srv/test-pools/cv1")
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
    virt_test["virt.pool_define"]("cs2", "dir", target="/srv/test-pools/cs2")
    virt_test["virt.volume_define"]("cs2", "a", 1)
    done = states()["virt.pool_deleted"]("cs2", purge=True)
    assert done["changes"]["deleted_volumes"] == ["a"] and done["result"] is True
    virt_test["virt.pool_define"]("cs3", "disk", source_devices=["/dev/sdx"], target="/dev")
    done = states()["virt.pool_deleted"]("cs3", purge=True)
    assert done["changes"]["deleted"] is False and "unsupported for this pool type: deleting pool" in done["comment"]


def test_volume_defined_state(states, virt_test, conn):
    virt_test["virt.pool_define"]("cs4", "dir", target="/srv/test-pools/cs4")
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
