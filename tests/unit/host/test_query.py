"""saltvirt.host.query: one VM that cannot be read is that VM's error, not the host's (test driver)."""

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.host import query


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
    from saltvirt.fleet import placement

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


def test_all_vms_answer_autostart_and_persistent_as_one_vm_does(test_conn):
    """vm_info of all VMs reads autostart/persistent from two filtered listAllDomains calls (not two round
    trips per VM): the same answer as asking each VM."""
    xml = "<domain type='test'><name>{}</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    test_conn.defineXML(xml.format("auto1")).setAutostart(1)
    test_conn.defineXML(xml.format("plain1"))
    test_conn.createXML(xml.format("transient1"), 0)  # running, not persistent
    every = query.vm_info(test_conn)
    flags = {n: (v["autostart"], v["persistent"]) for n, v in every.items() if n in ("auto1", "plain1", "transient1")}
    assert flags == {"auto1": (True, True), "plain1": (False, True), "transient1": (False, False)}

    def steady(info):  # the test driver's cputime of a running VM is the clock
        return {k: v for k, v in info.items() if k != "cputime"}

    for name in every:
        assert steady(every[name]) == steady(query.vm_info(test_conn, name)[name])


def test_vm_info_says_whether_a_console_has_a_password_never_which(test_conn):
    """Issue 23 #8: libvirt's plain XML drops passwd, so a console with a password read as "no password"."""
    xml = (
        "<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os>"
        "<devices><graphics type='vnc' port='-1' autoport='yes' {pw}listen='127.0.0.1'/></devices></domain>"
    )
    for name, pw, want in (("pw1", "passwd='s3cretpw' ", True), ("pw2", "", False)):
        dom = test_conn.defineXML(xml.format(name=name, pw=pw))
        try:
            info = query.vm_info(test_conn, name)[name]
            assert info["graphics"]["password"] is want, info["graphics"]
            assert "s3cretpw" not in repr(info)
        finally:
            dom.undefine()


def _domain_with_disk(conn, name, path):
    return conn.defineXML(
        f"<domain type='test'><name>{name}</name><memory>8192</memory><os><type>hvm</type></os><devices>"
        f"<disk type='file' device='disk'><source file='{path}'/><target dev='vda'/></disk></devices></domain>"
    )


def test_domain_disks_of_every_domain_but_one(test_conn):
    web = _domain_with_disk(test_conn, "web1", "/srv/web1.qcow2")
    _domain_with_disk(test_conn, "db1", "/srv/db1.qcow2")
    seen = sorted((vm, d["file"]) for vm, d in query.domain_disks(test_conn))
    assert seen == [("db1", "/srv/db1.qcow2"), ("web1", "/srv/web1.qcow2")]
    assert [vm for vm, _d in query.domain_disks(test_conn, but="web1")] == ["db1"]
    assert [vm for vm, _d in query.domain_disks(test_conn, but_uuid=web.UUIDString())] == ["db1"]
    web.create()  # running: its live definition counts too (a hot-plugged disk)
    assert sorted(vm for vm, _d in query.domain_disks(test_conn, but="db1")) == ["web1", "web1"]


def _steady(info):
    """A VM's facts but its cputime (the test driver's is the clock)."""
    return {k: v for k, v in info.items() if k != "cputime"}


def test_one_secure_read_per_vm_answers_as_the_plain_read_and_keeps_its_secrets(test_conn):
    """vm_info reads each VM's secure XML once (the console password's yes/no without a second round trip);
    the answer is the one the plain XML gives, and neither the password nor a disk's HTTP cookies leave."""
    dom = test_conn.defineXML(
        "<domain type='test'><name>sec1</name><memory>65536</memory><os><type>hvm</type></os><devices>"
        "<disk type='network' device='disk'><driver name='qemu' type='raw'/><source protocol='http' name='x.img'>"
        "<host name='example.com' port='80'/><cookies><cookie name='c'>c00kievalue</cookie></cookies></source>"
        "<target dev='vdb' bus='virtio'/></disk><graphics type='vnc' port='-1' autoport='yes' passwd='s3cretpw' "
        "passwdValidTo='2030-01-01T00:00:00' listen='127.0.0.1'/></devices></domain>"
    )
    assert "c00kievalue" in dom.XMLDesc(query.XML_SECURE) and "c00kievalue" not in dom.XMLDesc(0)
    hostname = test_conn.getHostname()
    one_read = query.describe(dom, hostname)
    plain_then_secure = query.describe(dom, hostname, xml=dom.XMLDesc(0))
    assert _steady(one_read) == _steady(plain_then_secure) and one_read["graphics"]["password"] is True
    assert "s3cretpw" not in repr(one_read) and "c00kievalue" not in repr(one_read)


def test_a_read_only_connection_gets_the_plain_xml():
    """libvirt refuses the secure XML on a read-only connection: a VM without a console is still described."""
    import libvirt

    rw = libvirt.open("test:///default")
    ro = libvirt.openReadOnly("test:///default")
    try:
        rw.defineXML("<domain type='test'><name>ro1</name><memory>65536</memory><os><type>hvm</type></os></domain>")
        with pytest.raises(libvirt.libvirtError):
            ro.lookupByName("ro1").XMLDesc(query.XML_SECURE)
        assert _steady(query.vm_info(ro, "ro1")["ro1"]) == _steady(query.vm_info(rw, "ro1")["ro1"])
    finally:
        rw.lookupByName("ro1").undefine()
        ro.close()
        rw.close()


def test_many_domains_read_in_threads_answer_as_one_by_one(test_conn):
    """Enough domains for vm_info to fetch their XML in threads: the same answer as asking each VM alone
    (consoles' password yes/no from the secure XML included), and a domain gone between the listing and
    its XML is that domain's own 'vanished' error, never another's."""
    for i in range(query.XML_THREADS * 8 + 3):
        gfx = "<graphics type='vnc' port='-1' passwd='s3cret'/>" if i % 3 == 0 else ""
        test_conn.defineXML(
            f"<domain type='test'><name>many{i:02d}</name><memory>65536</memory><os><type>hvm</type></os>"
            f"<devices>{gfx}</devices></domain>"
        )
    every = query.vm_info(test_conn)
    assert len([n for n in every if n.startswith("many")]) == query.XML_THREADS * 8 + 3
    for name, info in every.items():  # cputime: the test driver's is its clock, every read differs
        alone = query.vm_info(test_conn, name)[name]
        assert dict(info, cputime=0) == dict(alone, cputime=0), name
    assert every["many00"]["graphics"]["password"] is True and every["many01"]["graphics"]["password"] is False
    doms = test_conn.listAllDomains(0)
    test_conn.lookupByName("many05").undefine()
    xmls = query._all_xml(doms)
    assert query._vanished(xmls["many05"]) and all(isinstance(v, tuple) for n, v in xmls.items() if n != "many05")


def test_defined_uuids_are_every_domain_defined_or_running(test_conn):
    """What the master gathers from every hypervisor before deleting a leftover (saltvirt.fleet.leftovers)."""
    xml = "<domain type='test'><name>{}</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    test_conn.defineXML(xml.format("off1"))
    transient = test_conn.createXML(xml.format("tran1"), 0)
    got = query.defined_uuids(test_conn)
    assert got == {d.UUIDString(): d.name() for d in test_conn.listAllDomains(0)}
    assert sorted(got.values()) == ["off1", "tran1"] and got[transient.UUIDString()] == "tran1"


def test_a_running_vm_reports_its_definitions_sizes_too(test_conn):
    """A growth that waits for a restart (virt.update live=False, or past the running VM's maximum) is in the
    persistent definition only: ``defined`` reports it beside the running VM's ``cpu``/``mem``, alone and
    in the bulk answer alike; a stopped VM's definition is its own sizes."""
    import libvirt

    xml = (
        "<domain type='test'><name>{}</name><uuid>{}</uuid><memory unit='MiB'>{}</memory><vcpu>{}</vcpu>"
        "<os><type>hvm</type></os></domain>"
    )
    uuid = "5a1f6b0e-7d4e-4c55-9d9f-0c2b3e4f5a61"
    dom = test_conn.defineXML(xml.format("grow1", uuid, 64, 1))
    dom.create()
    test_conn.defineXML(xml.format("grow1", uuid, 128, 2))  # the next start's definition
    test_conn.defineXML(xml.format("idle1", "5a1f6b0e-7d4e-4c55-9d9f-0c2b3e4f5a62", 32, 1))
    assert dom.XMLDesc(0) != dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    for info in (query.vm_info(test_conn, "grow1")["grow1"], query.vm_info(test_conn)["grow1"]):
        assert (info["cpu"], info["mem"], info["defined"]) == (1, 64, {"cpu": 2, "mem": 128})
    assert query.vm_info(test_conn)["idle1"]["defined"] == {"cpu": 1, "mem": 32}


def test_vm_info_reports_the_image_virt_init_recorded_or_none(test_conn):
    """``image``: salt-virt's addition to Salt's vm_info keys, from the domain's <metadata> (the image grain)."""
    from saltvirt.xml.domain.metadata import METADATA_NS

    meta = f"<metadata><sv:vm xmlns:sv='{METADATA_NS}'><sv:image>debian12</sv:image></sv:vm></metadata>"
    for name, extra in (("img1", meta), ("byhand1", "")):
        test_conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory>65536</memory>{extra}<os><type>hvm</type></os></domain>"
        )
    test_conn.lookupByName("img1").create()  # running: described from its live XML and its definition
    info = query.vm_info(test_conn)
    assert info["img1"]["image"] == "debian12" and info["byhand1"]["image"] is None
    assert query.describe(test_conn.lookupByName("img1"), "h")["image"] == "debian12"


def test_describe_reports_the_ha_flag(test_conn):
    """``ha``: what virt.init/virt.update recorded in <metadata>, in every hypervisor's signed answer (automatic HA)."""
    from saltvirt.xml.domain.metadata import METADATA_NS

    meta = f"<metadata><sv:vm xmlns:sv='{METADATA_NS}'><sv:ha>true</sv:ha></sv:vm></metadata>"
    for name, extra in (("ha1", meta), ("plain1", "")):
        test_conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory>65536</memory>{extra}<os><type>hvm</type></os></domain>"
        )
    test_conn.lookupByName("ha1").create()
    info = query.vm_info(test_conn)
    assert info["ha1"]["ha"] is True and info["plain1"]["ha"] is False
    assert query.describe(test_conn.lookupByName("plain1"), "h")["ha"] is False


def test_condition_says_libvirts_reason_for_the_state(test_conn):
    """What the master's remediation believes (signed by the host): the state and libvirt's reason for it."""
    import libvirt

    xml = "<domain type='test'><name>test</name><memory>131072</memory><os><type>hvm</type></os></domain>"
    dom = test_conn.defineXML(xml)
    dom.create()
    cond = query.condition(test_conn, "test")
    assert (cond["name"], cond["uuid"], cond["state"]) == ("test", dom.UUIDString(), "running")
    assert cond["guest_agent"] is None and cond["disk_errors"] == {}
    dom.suspend()
    assert (query.condition(test_conn, "test")["state"], query.condition(test_conn, "test")["reason"]) == (
        "paused",
        "user",
    )
    dom.resume()
    dom.coreDump("/dev/null", libvirt.VIR_DUMP_CRASH)  # the test driver's crash: shut off, reason crashed
    cond = query.condition(test_conn, "test")
    assert (cond["state"], cond["reason"], cond["disk_errors"]) == ("shutoff", "crashed", {})
    dom.create()
    dom.destroy()
    assert query.condition(test_conn, "test")["reason"] == "destroyed"  # an operator's power-off is no crash
    with pytest.raises(CommandExecutionError, match="not defined"):
        query.condition(test_conn, "nosuchvm")


def test_reason_names_come_from_libvirts_constants():
    assert query.reason_name(3, 5) == "ioerror"  # VIR_DOMAIN_PAUSED_IOERROR
    assert query.reason_name(5, 6) == "failed"  # VIR_DOMAIN_SHUTOFF_FAILED: QEMU died
    assert query.reason_name(6, 1) == "panicked"
    assert query.reason_name(4, 1) == "unknown" and query.reason_name(5, 999) == "unknown"
