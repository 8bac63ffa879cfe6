"""Faults after ``defineXML`` in virt.init, and unreadable VMs in queries (libvirt's test driver).

The post-define faults are injected through init's own ``progress`` callback (the hook that sends the
progress events): raising there is a failure at exactly that step, with nothing mocked.
"""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt import provision, query

# a graphics listen that is not a string: libvirt stores it and then hands back XML that does not parse
BAD_LISTEN = {"listen": {"address": "1.2.3.4"}}


def _left(conn, tmp_path):
    names = sorted(d.name() for d in conn.listAllDomains(0))
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    return names, files


def test_bad_graphics_leaves_nothing_defined(test_conn, tmp_path):
    before = _left(test_conn, tmp_path)
    with pytest.raises(SaltInvocationError, match="graphics listen"):
        provision.init(test_conn, "gfx1", 1, 64, images_dir=str(tmp_path), nic=None, start=False, graphics=BAD_LISTEN)
    with pytest.raises(SaltInvocationError, match="graphics port"):
        provision.init(test_conn, "gfx1", 1, 64, images_dir=str(tmp_path), nic=None, graphics={"port": "x"})
    assert _left(test_conn, tmp_path) == before


@pytest.mark.parametrize("step", ["defined", "started"])
def test_failure_after_define_is_undone(test_conn, tmp_path, step):
    before = _left(test_conn, tmp_path)

    def progress(at, **_data):
        if at == step:
            raise CommandExecutionError(f"injected fault at {at}")

    with pytest.raises(CommandExecutionError, match=f"injected fault at {step}"):
        provision.init(test_conn, "late1", 1, 64, images_dir=str(tmp_path), nic=None, progress=progress)
    assert _left(test_conn, tmp_path) == before  # no domain, no disk, no manifest, no VM directory


def test_undo_that_cannot_finish_reports_the_vm_state(test_conn, tmp_path):
    """The undo cannot remove the domain (here: another one took its name meanwhile; on a real host:
    libvirtd died, see tests/integration/test_faults.py): the error says what is left and what to run."""
    xml = "<domain type='test'><name>late2</name><memory>65536</memory><os><type>hvm</type></os></domain>"

    def progress(at, **_data):
        if at == "defined":
            test_conn.lookupByName("late2").undefine()
            test_conn.defineXML(xml)
            raise CommandExecutionError("connection lost")

    with pytest.raises(CommandExecutionError) as err:
        provision.init(test_conn, "late2", 1, 64, images_dir=str(tmp_path), nic=None, progress=progress)
    msg = str(err.value)
    assert "connection lost" in msg and "cleanup incomplete: undefine late2" in msg, msg
    assert "VM 'late2' is still defined, state shutoff" in msg and "virt.cleanup late2" in msg, msg


def _define_unreadable(conn):
    """A domain whose XML libvirt hands back unparseable (what a bad graphics value used to leave)."""
    xml = (
        "<domain type='test'><name>broken1</name><memory>65536</memory><os><type>hvm</type></os>"
        "<devices><graphics type='vnc' port='-1' listen=\"{'address': '1.2.3.4'}\"/></devices></domain>"
    )
    return conn.defineXML(xml)


def test_one_unreadable_vm_is_its_own_error(test_conn):
    good = "<domain type='test'><name>good1</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    test_conn.defineXML(good).create()
    _define_unreadable(test_conn)
    full = query.full_info(test_conn)
    assert full["host"]["vms_defined"] == 2 and full["host"]["vms_active"] == 1
    assert full["vm_info"]["good1"]["state"] == "running" and "error" not in full["vm_info"]["good1"]
    broken = full["vm_info"]["broken1"]
    assert broken["state"] == "shutoff" and "cannot read" in broken["error"]
    assert query.host_info(test_conn)["vms_defined"] == 2
    assert query.vm_state(test_conn) == {"broken1": "shutoff", "good1": "running"}
    with pytest.raises(CommandExecutionError, match="cannot read VM 'broken1': ParseError"):
        query.vm_info(test_conn, "broken1")


def test_unreadable_vm_keeps_the_host_in_placement(test_conn):
    from saltvirt import placement

    _define_unreadable(test_conn)
    hosts = {"hyper1": dict(query.full_info(test_conn), status="up")}
    plan = placement.rank(hosts, placement.make_request(1, 64), placement.make_policy(mem_reserve_mib=0))
    assert plan["host"] == "hyper1", plan


def test_module_queries_survive_an_unreadable_vm(virt_test):
    import libvirt

    conn = libvirt.open("test:///default")
    _define_unreadable(conn)
    conn.close()
    full = virt_test["virt.full_info"]()
    assert "error" in full["vm_info"]["broken1"] and "error" not in full["vm_info"]["test"]
    assert virt_test["virt.vm_state"]() == {"broken1": "shutoff", "test": "running"}
    assert "broken1" in virt_test["virt.list_domains"]()


# virt.cleanup ---------------------------------------------------------------------------------------
def _interrupted(images_dir, name):
    """What a virt.init killed before it finished leaves: its init lock file, no longer held."""
    from saltvirt import cleanup

    path = cleanup._lock_path(str(images_dir), name)
    with open(path, "w") as fh:
        fh.write("virt.init pid 0\n")


def test_cleanup_removes_an_interrupted_init_and_keeps_foreign_files(virt_test, tmp_path):
    images_dir = tmp_path / "images"
    ret = virt_test["virt.init"]("half1", 1, 64, nic=None, start=False)
    disk = ret["disks"][0]["path"]
    foreign = images_dir / "half1" / "notes.txt"
    foreign.write_text("not salt-virt's")
    assert virt_test["virt.cleanup"]("half1")["domain"].startswith("kept: a complete VM")  # finished init
    _interrupted(images_dir, "half1")
    out = virt_test["virt.cleanup"]("half1")
    assert out["interrupted"] is True and out["domain"].startswith("undefined")
    assert out["removed"] == [disk] and out["errors"] == []
    assert "half1" not in virt_test["virt.list_domains"]() and foreign.read_text() == "not salt-virt's"
    assert not (images_dir / ".locks" / "init-half1").exists()
    assert virt_test["virt.cleanup"]("half1")["interrupted"] is False  # idempotent


def test_cleanup_removes_disks_with_a_manifest_but_no_domain(virt_test, tmp_path):
    ret = virt_test["virt.init"]("half2", 1, 64, nic=None, start=False)
    disk = ret["disks"][0]["path"]
    virt_test["virt.undefine"]("half2")
    assert virt_test["virt.cleanup"]("half2")["removed"] == [disk]
    assert not (tmp_path / "images" / "half2").exists()


def test_init_after_an_interrupted_init_cleans_up_first(virt_test, tmp_path):
    virt_test["virt.init"]("half3", 1, 64, nic=None, start=False)
    _interrupted(tmp_path / "images", "half3")
    ret = virt_test["virt.init"]("half3", 1, 64, nic=None, start=False)
    assert ret["cleaned_up"]["domain"].startswith("undefined") and ret["state"] == "shutoff"
    assert not (tmp_path / "images" / ".locks" / "init-half3").exists()
