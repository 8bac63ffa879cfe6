"""Every virt.* function the libvirt test driver supports, through the real Salt loader."""

import time

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support.saltloader import make_minion_mods


def test_module_loads_with_virtual_name(virt_test):
    assert "virt.init" in virt_test
    assert virt_test["virt.get_hypervisor"]() == {"type": "test", "reason": "libvirt test driver"}
    assert virt_test["virt.virt_type"]() == "test"


def test_queries(virt_test):
    v = virt_test
    assert "test" in v["virt.list_domains"]()
    assert v["virt.list_active_vms"]() == ["test"]
    assert v["virt.list_inactive_vms"]() == []
    assert v["virt.vm_state"]("test") == {"test": "running"}
    info = v["virt.vm_info"]("test")["test"]
    assert info["state"] == "running" and info["cpu"] >= 1 and info["mem"] > 0
    assert info["uuid"]
    assert v["virt.get_xml"]("test").startswith("<domain")
    assert isinstance(v["virt.get_nics"]("test"), dict)
    assert isinstance(v["virt.get_disks"]("test"), dict)
    assert v["virt.get_macs"]("test") == sorted(v["virt.get_nics"]("test"))
    assert v["virt.get_graphics"]("test")["type"] == "None"  # no console: Salt's mapping of "None"
    full = v["virt.full_info"]()
    assert set(full) == {"host", "vm_info", "freecpu", "freemem", "node_info"} and "test" in full["vm_info"]
    assert full["node_info"]["sockets"] == full["node_info"]["cpusockets"]


def test_host_functions(virt_test):
    v = virt_test
    node = v["virt.node_info"]()
    assert node["cpus"] > 0 and node["phymemory"] > 0
    host = v["virt.host_info"]()
    assert host["vms_active"] == 1 and host["mem_total"] == node["phymemory"]
    assert "disk_free" in host
    assert v["virt.freemem"]() == node["phymemory"] - host["mem_used_by_vms"]
    assert v["virt.freecpu"]() == node["cpus"] - host["vcpus_used_by_vms"]
    caps = v["virt.capabilities"]()
    assert set(caps) == {"host", "guests"} and caps["guests"][0]["os_type"]
    assert "<capabilities>" in v["virt.capabilities_xml"]()


def test_lifecycle_round_trip(virt_test):
    v = virt_test
    ret = v["virt.init"]("life1", 1, 128, disk=None, nic=None, start=False)
    assert ret["started"] is False and ret["state"] == "shutoff" and ret["type"] == "test"
    assert v["virt.start"]("life1") is True
    assert v["virt.vm_state"]("life1") == {"life1": "running"}
    assert v["virt.start"]("life1") is True  # already running: left as is
    assert v["virt.pause"]("life1") is True
    assert v["virt.vm_state"]("life1") == {"life1": "paused"}
    assert v["virt.resume"]("life1") is True
    assert v["virt.reset"]("life1") is True
    assert v["virt.reboot"]("life1") is True
    assert v["virt.vm_state"]("life1") == {"life1": "running"}
    assert v["virt.destroy"]("life1")["state"] == "shutoff"
    with pytest.raises(CommandExecutionError, match="it is shutoff"):
        v["virt.pause"]("life1")
    assert v["virt.set_autostart"]("life1", "on") is True
    assert v["virt.set_autostart"]("life1", "off") is True
    assert v["virt.setmem"]("life1", 256) is True
    assert v["virt.vm_info"]("life1")["life1"]["mem"] == 256
    assert v["virt.setvcpus"]("life1", 2) is True
    assert v["virt.vm_info"]("life1")["life1"]["cpu"] == 2
    assert v["virt.undefine"]("life1") is True
    assert "life1" not in v["virt.list_domains"]()


def test_define_xml_str(virt_test):
    xml = "<domain type='test'><name>fromxml</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    assert virt_test["virt.define_xml_str"](xml) is True
    with pytest.raises(SaltInvocationError, match="does not parse"):
        virt_test["virt.define_xml_str"]("<domain")


def test_occupied_name_and_unknown_vm(virt_test):
    with pytest.raises(SaltInvocationError, match="already defined"):
        virt_test["virt.init"]("test", 1, 128, disk=None, nic=None)
    with pytest.raises(CommandExecutionError, match="'nope' is not defined"):
        virt_test["virt.start"]("nope")


def test_unreachable_connection_is_a_clear_error(tmp_path):
    broken = {"broken": "qemu+unix:///system?socket=/nonexistent/sock"}  # an operator-named connection
    mods = make_minion_mods(tmp_path, "test:///default", connections=broken)
    with pytest.raises(CommandExecutionError, match="cannot connect to libvirt at qemu\\+unix.*Check that libvirtd"):
        mods["virt.list_domains"](connection="broken")


def test_init_without_image_creates_a_blank_system_disk_and_purge_removes_it(virt_test, tmp_path):
    ret = virt_test["virt.init"]("blank1", 1, 128, nic=None, start=False)
    path = tmp_path / "images" / "blank1" / "system.qcow2"
    assert [d["path"] for d in ret["disks"]] == [str(path)]
    assert ret["seed"] is None  # nothing to seed without an image
    from saltvirt.storage import images

    assert images.image_info(str(path))["virtual_size"] == 8192 * 1024 * 1024
    purged = virt_test["virt.purge"]("blank1")
    assert purged["removed"] == [str(path)] and not path.exists()


def test_vm_info_shows_guest_ips_and_init_adds_the_agent_channel(virt_test, tmp_path):
    nics = virt_test["virt.vm_info"]("test")["test"]["nics"]
    # the test driver's own VM: one NIC on network "default", its (made-up) address from the DHCP leases
    assert [ip["source"] for nic in nics.values() for ip in nic["ips"]] == ["lease"]
    assert virt_test["virt.get_nics"]("test") == nics
    virt_test["virt.init"]("ga1", 1, 128, nic=None, start=False)
    virt_test["virt.init"]("ga2", 1, 128, nic=None, start=False, guest_agent=False)
    assert "org.qemu.guest_agent.0" in virt_test["virt.get_xml"]("ga1")
    assert "guest_agent" not in virt_test["virt.get_xml"]("ga2")
    info = virt_test["virt.vm_info"]()
    assert info["ga1"]["guest_agent"] == "unknown" and info["ga2"]["guest_agent"] is None
    for name in ("ga1", "ga2"):
        virt_test["virt.purge"](name)


@pytest.mark.parametrize("value", ["soon", 0, -1, 61, True])
def test_bad_guest_agent_timeout_is_refused(tmp_path, value):
    mods = make_minion_mods(tmp_path, "test:///default", guest_agent_timeout=value)
    with pytest.raises(SaltInvocationError, match=r"timeout must be a number of seconds above 0 \(at most 60\)"):
        mods["virt.vm_info"]("test")


def test_init_without_a_minion_event_bus_does_not_try_the_bus(virt_test, monkeypatch, caplog):
    """This process runs no salt-minion (file_client local, no bus socket): virt.init's progress is
    decided once and Salt's event connect (~1 s of spinning per event) is never attempted."""
    import logging

    import salt.utils.event

    pulls = []
    real = salt.utils.event.SaltEvent.connect_pull
    monkeypatch.setattr(
        salt.utils.event.SaltEvent, "connect_pull", lambda s, timeout=1: pulls.append(1) or real(s, timeout)
    )
    with caplog.at_level(logging.DEBUG, logger="saltvirt.vm.progress"):
        ret = virt_test["virt.init"]("nobus1", 1, 64, nic=None, disk=None, start=True)
    assert ret["started"] is True and pulls == []
    skipped = [r.getMessage() for r in caplog.records if "progress events not sent" in r.getMessage()]
    assert len(skipped) == 1 and "no minion event bus" in skipped[0]


def test_init_with_a_minion_event_bus_sends_every_step(tmp_path):
    """The same call inside a 'running minion' (a real minion event bus): every step is on the bus."""
    import libvirt

    from tests.support.eventbus import minion_bus, short_sock_dir

    held = libvirt.open("test:///default")  # the driver's state lives while a connection is open
    with short_sock_dir() as sock_dir:
        mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"sock_dir": sock_dir})
        with minion_bus(mods.opts) as received:
            ret = mods["virt.init"]("bus1", 1, 64, nic=None, disk=None, start=True)
            try:
                deadline = time.monotonic() + 30  # a bound for a loaded machine, not a timing assert
                while len(received) < 3 and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                mods["virt.purge"]("bus1")
                held.close()
    assert ret["started"] is True
    steps = ["disks_ready", "defined", "started"]
    assert [t for t, _ in received] == [f"salt/virt/init/bus1/{step}" for step in steps]
    assert all(d["vm"] == "bus1" and d["host"] == "hyper-test" for _, d in received)


def test_image_warm_through_the_loader(virt_test, tmp_path, guest):
    """virt.image_warm with the minion's settings: a local image in virt:allowed_paths is checked and
    used in place (no base); libvirt is asked the domain type as virt.init asks it first (a libvirtd's
    first capabilities probe must not fall on the first virt.init); one outside them is refused;
    unknown arguments are refused."""
    import shutil

    from tests.support.saltloader import SOURCES

    (tmp_path / SOURCES).mkdir(exist_ok=True)
    local = tmp_path / SOURCES / "web.raw"
    shutil.copyfile(guest["raw"], local)
    ret = virt_test["virt.image_warm"](str(local))
    assert ret["path"] == str(local) and ret["format"] == "raw" and ret["base"] is None
    assert ret["type"] == "test"  # hosttype.detect on the minion's own connection: the test driver's answer
    with pytest.raises(SaltInvocationError, match="allowed_paths"):
        virt_test["virt.image_warm"]("/etc/hostname")
    with pytest.raises(SaltInvocationError, match="unknown argument"):
        virt_test["virt.image_warm"](str(local), overlay=True)


@pytest.mark.parametrize(
    ("fun", "arg", "key"),
    [
        ("virt.init", "allow_http", "virt:insecure_http_images: True"),
        ("virt.init", "trusted_image", "virt:insecure_trusted_images: [<absolute image path>, ...]"),
        ("virt.image_warm", "allow_http", "virt:insecure_http_images: True"),
        ("virt.image_warm", "trusted_image", "virt:insecure_trusted_images: [<absolute image path>, ...]"),
    ],
)
def test_operator_switches_are_refused_as_call_arguments(virt_test, guest, fun, arg, key):
    """Issue 23 #5: the "trust me" switches are the operator's (minion config), never a caller's."""
    args = ("sw1", 1, 64) if fun == "virt.init" else ()
    with pytest.raises(SaltInvocationError) as err:
        virt_test[fun](*args, image=guest["qcow2"], **{arg: True})
    assert str(err.value) == (
        f"{arg}= is an operator switch, not a call argument: the hypervisor's operator sets {key} in its minion config"
    )
    assert "sw1" not in virt_test["virt.list_domains"]()


def test_trusted_images_come_from_the_minion_config(tmp_path, guest):
    """virt:insecure_trusted_images lets exactly the listed local image through as it is."""
    import shutil

    from saltvirt.storage import images

    src = tmp_path / "sources"
    src.mkdir()
    base = src / "base.qcow2"
    shutil.copyfile(guest["qcow2"], base)
    backed = src / "backed.qcow2"
    images.clone(str(base), str(backed), overlay=True, fmt="qcow2", src_fmt="qcow2")
    plain = make_minion_mods(tmp_path / "a", "test:///default", allowed_paths=[str(src)])
    with pytest.raises(SaltInvocationError, match="backing file"):
        plain["virt.image_warm"](str(backed))
    trusting = make_minion_mods(
        tmp_path / "b", "test:///default", allowed_paths=[str(src)], insecure_trusted_images=[str(backed)]
    )
    assert trusting["virt.image_warm"](str(backed))["format"] == "qcow2"


def test_init_reads_its_settings_without_a_config_get_per_key(tmp_path, monkeypatch):
    """Issue 40: virt.init reads the operator's virt: settings from the minion config directly
    (``saltvirt.host.conn.opts_config``): no ``config.get`` through the loader (48 of Salt's key walks a
    define-only init, ~1 ms); the settings still count (here: virt:images, virt:type)."""
    import libvirt
    import salt.utils.data

    mods = make_minion_mods(tmp_path, "test:///default", images_dir=tmp_path / "imgs", type="qemu")
    assert "test" in mods["virt.list_domains"]()  # the module loaded (its __virtual__ reads the URI through Salt)
    real, walked = salt.utils.data.traverse_dict_and_list, []
    # what config.get walks every key with (looked up at each call): counted, then run
    monkeypatch.setattr(
        salt.utils.data, "traverse_dict_and_list", lambda *a, **kw: (walked.append(a[1]), real(*a, **kw))[1]
    )
    assert mods["config.get"]("virt:type") == "qemu" and walked == ["virt:type"]  # the count sees config.get
    held = libvirt.open("test:///default")  # the test driver keeps its domains while a connection is open
    try:
        ret = mods["virt.init"]("cfg1", 1, 64, nic=None, start=False, seed=False)
        assert walked == ["virt:type"], walked
        assert ret["type"] == "qemu" and ret["disks"][0]["path"].startswith(str(tmp_path / "imgs" / "cfg1"))
        assert mods["virt.purge"]("cfg1")["undefined"]
    finally:
        held.close()
