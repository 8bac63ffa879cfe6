"""saltvirt.host.snapshot on libvirt's test:/// driver, through the real Salt loader with the argument names of
Salt's virt docstrings: snapshot, list_snapshots, revert_snapshot, delete_snapshots and the states
snapshot, saved, reverted. A running TCG guest: tests/integration/test_snapshot_real.py."""

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import snapshot
from tests.support.saltloader import load_states


def test_snapshot_xml_and_names():
    xml = snapshot.snapshot_xml("s1", "before <upgrade>")
    assert xml == "<domainsnapshot><name>s1</name><description>before &lt;upgrade&gt;</description></domainsnapshot>"
    assert snapshot.snapshot_name("web1", suffix="nightly", now=0).startswith("web1-19")
    assert snapshot.snapshot_name("web1", "x", "nightly") == "x-nightly"
    with pytest.raises(SaltInvocationError, match="invalid snapshot name"):
        snapshot.snapshot_name("web1", "a/b")


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
    from saltvirt.vm import migrate

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


def test_discard_checkpoints(virt_test, snapvm):
    """A revert calls this (after a revert the dirty bitmaps miss what the revert changed, so an incremental
    backup built on them would be wrong); a restore too, metadata only (the disks went). The test driver
    refuses a snapshot while a checkpoint exists (QEMU allows it): the revert itself is proven on the lab,
    tests/integration/test_backup_real.py."""
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName(snapvm)
    for name in ("salt-backup-a", "salt-backup-b"):
        dom.checkpointCreateXML(f"<domaincheckpoint><name>{name}</name></domaincheckpoint>", 0)
    assert sorted(snapshot.discard_checkpoints(dom)) == ["salt-backup-a", "salt-backup-b"]
    assert dom.listAllCheckpoints(0) == [] and snapshot.discard_checkpoints(dom) == []
    dom.checkpointCreateXML("<domaincheckpoint><name>c</name></domaincheckpoint>", 0)
    assert snapshot.discard_checkpoints(dom, metadata_only=True) == ["c"] and dom.listAllCheckpoints(0) == []
    conn.close()
