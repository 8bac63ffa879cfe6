"""saltvirt.vm.migrate without a second hypervisor: URIs, flags, XML rewriting, and the target-side
preparation (real files, real qemu-img, libvirt's test driver). The test driver cannot migrate, which
makes it a real failure case for virt.migrate's error path."""

import json
import os
import pathlib
import subprocess

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil
from saltvirt.storage import images
from saltvirt.vm import migrate, migrate_tls
from tests.support.paths import TEST_NODE_XML
from tests.support.saltloader import make_minion_mods

F = libvirt


# URIs, flags, settings ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, uri",
    [
        ({}, "qemu+tcp://hv2/system"),
        ({"tunnel": True}, "qemu+tls://hv2/system"),
        ({"transport": "tls"}, "qemu+tls://hv2/system"),
        ({"tunnel": True, "transport": "tcp"}, "qemu+tcp://hv2/system"),
        (
            {"tunnel": True, "pkipath": "/etc/pki/libvirt migrate"},
            "qemu+tls://hv2/system?pkipath=/etc/pki/libvirt%20migrate",
        ),
        ({"pkipath": "/etc/pki/x"}, "qemu+tcp://hv2/system"),  # no TLS, no certificates
        (
            {"uri_template": "qemu+{transport}://{target}:16600/system?x=1", "tunnel": True, "pkipath": "/p"},
            "qemu+tls://hv2:16600/system?x=1&pkipath=/p",
        ),
    ],
)
def test_destination_uri(kwargs, uri):
    assert migrate.destination_uri("hv2", **kwargs) == uri


def test_destination_uri_ipv6_and_data_uri():
    uri = migrate.destination_uri("fd00::12")
    assert uri == "qemu+tcp://[fd00::12]/system"
    assert migrate.data_uri(uri) == "tcp://[fd00::12]"
    assert migrate.data_uri("qemu+tls://hv2/system?pkipath=/x") == "tcp://hv2"
    assert migrate.data_uri("qemu:///system") is None


@pytest.mark.parametrize("target", ["", "hv2/system", "hv2 ; rm", "hv2?pkipath=/tmp", None, "qemu+tcp://hv2/system"])
def test_destination_uri_refuses_what_is_not_a_host(target):
    with pytest.raises(SaltInvocationError, match="host name or address"):
        migrate.destination_uri(target)


def test_destination_uri_bad_settings():
    with pytest.raises(SaltInvocationError, match="transport must be one of tcp, tls"):
        migrate.destination_uri("hv2", transport="ssh")
    with pytest.raises(SaltInvocationError, match="uri_template"):
        migrate.destination_uri("hv2", uri_template="qemu+{proto}://{target}/system")
    with pytest.raises(SaltInvocationError, match="pkipath"):
        migrate.destination_uri("hv2", tunnel=True, pkipath="relative/dir")


def test_flags():
    base = F.VIR_MIGRATE_PEER2PEER | F.VIR_MIGRATE_PERSIST_DEST | F.VIR_MIGRATE_UNDEFINE_SOURCE
    assert migrate.migration_flags(True) == base | F.VIR_MIGRATE_LIVE
    assert migrate.migration_flags(True, live=False) == base
    assert migrate.migration_flags(False) == base | F.VIR_MIGRATE_OFFLINE
    assert migrate.migration_flags(True, tunnel=True) == base | F.VIR_MIGRATE_LIVE | F.VIR_MIGRATE_TUNNELLED
    assert (
        migrate.migration_flags(True, copy_storage="all") == base | F.VIR_MIGRATE_LIVE | F.VIR_MIGRATE_NON_SHARED_DISK
    )
    assert migrate.migration_flags(True, copy_storage="inc") == base | F.VIR_MIGRATE_LIVE | F.VIR_MIGRATE_NON_SHARED_INC
    assert migrate.migration_flags(True, unsafe=True) & F.VIR_MIGRATE_UNSAFE
    assert migrate.migration_flags(True, qemu_tls=True) & F.VIR_MIGRATE_TLS
    assert not migrate.migration_flags(True, tunnel=True, qemu_tls=True) & F.VIR_MIGRATE_TLS


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"active": True, "tunnel": True, "copy_storage": "all"}, "cannot copy disks through a tunnelled"),
        ({"active": False, "copy_storage": "all"}, "not running"),
        ({"active": True, "copy_storage": "some"}, "copy_storage must be"),
    ],
)
def test_flags_refused(kwargs, match):
    with pytest.raises(SaltInvocationError, match=match):
        migrate.migration_flags(**kwargs)


def test_settings_from_config():
    conf = {
        "virt:tunnel": "yes",
        "virt:migration": {"transport": "tls", "pkipath": "/etc/pki/x", "hosts": {"hyper2": "hv2"}},
    }
    got = migrate.settings(lambda key, default=None: conf.get(key, default))
    assert got["tunnel"] is True and got["transport"] == "tls" and got["pkipath"] == "/etc/pki/x"
    assert got["hosts"] == {"hyper2": "hv2"} and got["qemu_tls"] is None and got["address"] is None
    assert got["allow_cleartext"] is False and got["qemu_tls_dir"] is None  # QEMU's TLS when its files are there
    assert got["stall_timeout"] == migrate.STALL_TIMEOUT == 60.0
    conf["virt:migration"] = {"stall_timeout": "15"}
    assert migrate.settings(lambda key, default=None: conf.get(key, default))["stall_timeout"] == 15.0
    for bad in ("soon", 0, -3):
        conf["virt:migration"] = {"stall_timeout": bad}
        with pytest.raises(SaltInvocationError, match="virt:migration:stall_timeout must be"):
            migrate.settings(lambda key, default=None: conf.get(key, default))
    with pytest.raises(SaltInvocationError, match="unknown key.*tunel"):
        migrate.settings(lambda key, default=None: {"tunel": True} if key == "virt:migration" else default)


def test_map_path():
    assert migrate.map_path("/srv/a/web1/system.qcow2", "/srv/a", "/srv/b") == "/srv/b/web1/system.qcow2"
    assert migrate.map_path("/srv/a/.bases/x-img.qcow2", "/srv/a/", "/srv/b") == "/srv/b/.bases/x-img.qcow2"
    assert migrate.map_path("/nfs/web1.qcow2", "/srv/a", "/srv/b") == "/nfs/web1.qcow2"
    assert migrate.map_path("/srv/ab/web1.qcow2", "/srv/a", "/srv/b") == "/srv/ab/web1.qcow2"


# source side on the test driver ---------------------------------------------------------------------
def qemu_img(*args):
    subprocess.run(["qemu-img", *args], check=True, capture_output=True)


def img_info(path):
    return json.loads(
        subprocess.run(
            ["qemu-img", "info", "-U", "--output=json", path], check=True, capture_output=True, text=True
        ).stdout
    )


def define(conn, name, disks, cache="none"):
    devs = "".join(
        f"<disk type='file' device='disk'><driver name='qemu' type='{fmt}' cache='{cache}'/><source file='{path}'/>"
        f"<target dev='vd{chr(97 + i)}' bus='virtio'/></disk>"
        for i, (path, fmt) in enumerate(disks)
    )
    xml = (
        f"<domain type='test'><name>{name}</name><memory unit='MiB'>256</memory><vcpu>2</vcpu>"
        f"<os><type arch='x86_64'>hvm</type></os><devices>{devs}</devices></domain>"
    )
    return conn.defineXML(xml)


@pytest.fixture
def src_vm(test_conn, tmp_path):
    """VM 'm' with an overlay system disk (onto <images>/.bases) and a raw data disk, in <tmp>/a."""
    a = tmp_path / "a"
    (a / ".bases").mkdir(parents=True)
    (a / "m").mkdir()
    base = a / ".bases" / "0123456789abcdef-guest.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", str(base), "64M")
    qemu_img("create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(a / "m" / "system.qcow2"))
    qemu_img("create", "-q", "-f", "raw", str(a / "m" / "data.raw"), "32M")
    dom = define(test_conn, "m", [(str(a / "m" / "system.qcow2"), "qcow2"), (str(a / "m" / "data.raw"), "raw")])
    dom.create()
    return {"images": str(a), "base": str(base), "dom": dom}


def test_source_info_describes_disks_and_leaves_probes(test_conn, src_vm):
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    assert (
        info["active"] is True
        and info["cpu"] == 2
        and info["mem"] == 256
        and info["uuid"] == src_vm["dom"].UUIDString()
    )
    vda, vdb = info["disks"]
    assert vda["virtual_size"] == 64 << 20 and vda["format"] == "qcow2" and vda["cache"] == "none"
    assert vda["backing"] == {"path": src_vm["base"], "format": "qcow2", "size": os.path.getsize(src_vm["base"])}
    assert vdb["virtual_size"] == 32 << 20 and vdb["format"] == "raw" and vdb["backing"] is None
    ((folder, probe),) = info["probes"].items()
    assert folder == os.path.join(src_vm["images"], "m")
    assert os.path.basename(probe["path"]).startswith(".salt-virt-probe-m-")
    assert pathlib.Path(probe["path"]).read_text() == probe["token"]
    # the probe files are removed by abort_cleanup (the runner calls it on the source after prepare)
    out = migrate.abort_cleanup(test_conn, "m", [probe["path"]], src_vm["images"])
    assert out["removed"] == [probe["path"]] and not os.path.exists(probe["path"])


def test_migrate_failure_says_where_the_vm_is(test_conn, src_vm):
    # the test driver has no migration support: a real libvirt failure, and the VM really stays
    with pytest.raises(CommandExecutionError) as err:
        migrate.migrate(test_conn, "m", "hv2", transport="tcp", allow_cleartext=True)  # no TLS files here
    msg = str(err.value)
    assert msg.startswith(f"migrating VM 'm' from {test_conn.getHostname()} to hv2 failed: ")
    assert msg.endswith(f"VM 'm' is still running on {test_conn.getHostname()}")
    assert src_vm["dom"].isActive()


def test_migrate_refuses_before_touching_libvirt(test_conn, src_vm, tmp_path):
    host = test_conn.getHostname()
    with pytest.raises(SaltInvocationError, match="already on"):
        migrate.migrate(test_conn, "m", host)
    with pytest.raises(SaltInvocationError, match="offline=True moves stopped VMs only"):
        migrate.migrate(test_conn, "m", "hv2", offline=True)
    with pytest.raises(SaltInvocationError, match="host name or address"):
        migrate.migrate(test_conn, "m", "hv2/system")
    with pytest.raises(CommandExecutionError, match="VM 'nosuch' is not defined"):
        migrate.migrate(test_conn, "nosuch", "hv2")
    other = tmp_path / "other.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", str(other), "64M")
    wrong = {src_vm["base"]: fsutil.file_digest(str(other)) + "0"}
    with pytest.raises(CommandExecutionError, match="backing image .* differs on the target: nothing was migrated"):
        migrate.migrate(
            test_conn, "m", "hv2", copy_storage="inc", verify_backing=wrong, transport="tcp", allow_cleartext=True
        )
    assert src_vm["dom"].isActive()


# target side: prepare / abort_cleanup / finish ------------------------------------------------------
@pytest.fixture
def target(tmp_path):
    """A second libvirt test driver connection and images dir, as the target hypervisor."""
    conn = libvirt.open(f"test://{TEST_NODE_XML}")
    b = tmp_path / "b"
    b.mkdir()
    yield {"conn": conn, "images": str(b)}
    conn.close()


def test_prepare_different_images_dirs_copies_and_maps_paths(test_conn, src_vm, target):
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    plan = migrate.prepare(target["conn"], info, target["images"])
    b = target["images"]
    vda, vdb = plan["disks"]
    # the backing image is not on the target: full copy of the overlay (flattened), raw stays raw
    assert plan["copy_storage"] == "all" and vda["mode"] == "copy" and "backing image not on the target" in vda["note"]
    assert plan["disk_map"] == {vda["source"]: f"{b}/m/system.qcow2", vdb["source"]: f"{b}/m/data.raw"}
    assert plan["migrate_disks"] == ["vda", "vdb"] and plan["unsafe"] is False
    sys_img, data_img = img_info(f"{b}/m/system.qcow2"), img_info(f"{b}/m/data.raw")
    assert sys_img["format"] == "qcow2" and sys_img["virtual-size"] == 64 << 20 and "backing-filename" not in sys_img
    assert data_img["format"] == "raw" and data_img["virtual-size"] == 32 << 20
    # the target's ownership manifest lets virt.purge remove them there later
    assert images.owned_files(f"{b}/m", "m", info["uuid"]) == [f"{b}/m/system.qcow2", f"{b}/m/data.raw"]
    # after a failure, abort_cleanup removes exactly that and leaves nothing behind
    out = migrate.abort_cleanup(target["conn"], "m", plan["created"], b)
    assert sorted(out["removed"]) == sorted(plan["created"]) and out["kept"] == []
    assert os.listdir(b) == []


def test_prepare_overlay_onto_the_targets_copy_of_the_backing_image(test_conn, src_vm, target):
    bases = os.path.join(target["images"], ".bases")
    os.mkdir(bases)
    theirs = os.path.join(bases, "fedcba9876543210-guest.qcow2")  # cached there by an earlier virt.init
    subprocess.run(["cp", src_vm["base"], theirs], check=True)
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    plan = migrate.prepare(target["conn"], info, target["images"])
    vda, vdb = plan["disks"]
    assert plan["copy_storage"] == "inc" and vda["mode"] == "overlay" and vdb["mode"] == "copy"
    made = img_info(vda["dest"])
    assert made["backing-filename"] == theirs and made["backing-filename-format"] == "qcow2"
    assert plan["verify_backing"] == {src_vm["base"]: fsutil.file_digest(theirs)}
    assert plan["needed_mib"] < 100  # the top layers only, not the 96 MiB of virtual disk


def test_prepare_shared_storage_proven_by_probe_creates_nothing(test_conn, tmp_path, target):
    shared = tmp_path / "nfs"
    shared.mkdir()
    qemu_img("create", "-q", "-f", "qcow2", str(shared / "s.qcow2"), "16M")
    define(test_conn, "s", [(str(shared / "s.qcow2"), "qcow2")]).create()
    info = migrate.source_info(test_conn, "s", str(tmp_path / "a"))
    plan = migrate.prepare(target["conn"], info, target["images"])
    assert [d["mode"] for d in plan["disks"]] == ["shared"]
    assert plan["copy_storage"] is None and plan["disk_map"] == {} and plan["created"] == []
    assert plan["unsafe"] is True  # proven shared and cache=none: libvirt's local-filesystem check may be skipped
    # without the probe (another host that merely has a file there) it is not shared: a copy would have to
    # be created there, outside the target's virt:images -> refused
    os.unlink(next(iter(info["probes"].values()))["path"])
    with pytest.raises(SaltInvocationError, match="is outside the directories salt-virt may use"):
        migrate.prepare(target["conn"], info, target["images"])
    with pytest.raises(CommandExecutionError, match="already exists on the target: refusing to overwrite"):
        migrate.prepare(target["conn"], info, target["images"], allowed_paths=[str(shared)])


def test_prepare_shared_but_host_page_cache_is_not_unsafe_ok(test_conn, tmp_path, target):
    qemu_img("create", "-q", "-f", "raw", str(tmp_path / "w.raw"), "16M")
    define(test_conn, "w", [(str(tmp_path / "w.raw"), "raw")], cache="writeback").create()
    plan = migrate.prepare(target["conn"], migrate.source_info(test_conn, "w", str(tmp_path / "a")), target["images"])
    assert plan["disks"][0]["mode"] == "shared" and plan["unsafe"] is False


def test_prepare_refusals_create_nothing(test_conn, src_vm, target):
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    b = target["images"]
    with pytest.raises(CommandExecutionError, match="copy_storage=inc needs the backing image"):
        migrate.prepare(target["conn"], info, b, copy_storage="inc")
    assert os.listdir(b) == []
    huge = json.loads(json.dumps(info))
    huge["disks"][1]["chain_allocation"] = huge["disks"][1]["virtual_size"] = 1 << 60  # a 1 EiB disk
    with pytest.raises(CommandExecutionError, match=r"not enough room on .* for VM 'm': .* Nothing was created"):
        migrate.prepare(target["conn"], huge, b)
    assert os.listdir(b) == []
    os.makedirs(f"{b}/m")
    with open(f"{b}/m/data.raw", "w") as fh:
        fh.write("precious")
    with pytest.raises(CommandExecutionError, match="data.raw already exists on the target: refusing to overwrite"):
        migrate.prepare(target["conn"], info, b)
    assert pathlib.Path(f"{b}/m/data.raw").read_text() == "precious" and sorted(os.listdir(f"{b}/m")) == ["data.raw"]
    define(target["conn"], "m", [])
    with pytest.raises(CommandExecutionError, match="a VM named 'm' is already defined"):
        migrate.prepare(target["conn"], info, b)


def test_abort_cleanup_only_removes_what_prepare_created(test_conn, src_vm, target):
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    plan = migrate.prepare(target["conn"], info, target["images"])
    b = target["images"]
    stranger = os.path.join(b, "m", "notes.txt")
    with open(stranger, "w") as fh:
        fh.write("mine")
    in_use = f"{b}/m/data.raw"
    define(target["conn"], "other", [(in_use, "raw")])
    out = migrate.abort_cleanup(target["conn"], "m", plan["created"] + [stranger, "/etc/passwd"], b)
    kept = {k["path"]: k["reason"] for k in out["kept"]}
    assert kept[stranger] == kept["/etc/passwd"] == "not created by virt.migrate_prepare for this VM"
    assert kept[in_use].startswith("used by a VM on")
    assert kept[f"{b}/m"] == "Directory not empty"
    assert os.path.exists(stranger) and os.path.exists(in_use) and not os.path.exists(f"{b}/m/system.qcow2")


def test_finish_keeps_the_files_and_drops_the_record(test_conn, src_vm, target):
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    plan = migrate.prepare(target["conn"], info, target["images"])
    b = target["images"]
    define(target["conn"], "m", [(d["dest"], "qcow2") for d in plan["disks"]])  # what libvirt does on success
    done = migrate.finish(target["conn"], "m", b)
    assert done["persistent"] is True and done["disks"] == [f"{b}/m/system.qcow2", f"{b}/m/data.raw"]
    assert not os.path.exists(os.path.join(b, "m", migrate.RECORD))
    # no record, so a late abort_cleanup cannot delete the migrated VM's disks
    out = migrate.abort_cleanup(target["conn"], "m", plan["created"], b)
    assert out["removed"] == [] and os.path.exists(f"{b}/m/system.qcow2")


# the execution module, through the real Salt loader ----------------------------------------------
def test_module_functions_load(virt_test):
    for fun in ("migrate", "migrate_source_info", "migrate_prepare", "migrate_finish", "migrate_abort_cleanup"):
        assert f"virt.{fun}" in virt_test
    assert "salt 'hyper1' virt.migrate web1 hv2" in virt_test["virt.migrate"].__doc__


def test_module_migrate_error_on_test_driver(virt_test, tmp_path):
    with pytest.raises(CommandExecutionError, match="would send the libvirtd connection .* in clear: refused"):
        virt_test["virt.migrate"]("test", "hv2", transport="tcp")  # plaintext asked for, not allowed here
    clear = make_minion_mods(tmp_path, "test:///default", migration={"allow_cleartext": True})
    with pytest.raises(
        CommandExecutionError, match="migrating VM 'test' from .* to hv2 failed: .* VM 'test' is still running on"
    ):
        clear["virt.migrate"]("test", "hv2", transport="tcp")
    assert virt_test["virt.vm_state"]("test") == {"test": "running"}
    with pytest.raises(SaltInvocationError, match="cannot copy disks through a tunnelled"):
        virt_test["virt.migrate"]("test", "hv2", tunnel=True, copy_storage="all")
    with pytest.raises(SaltInvocationError, match="source must be virt.migrate_source_info's answer for 'test'"):
        virt_test["virt.migrate_prepare"]("test", {"name": "other"})


def test_module_maps_target_names_from_config(tmp_path):
    pkipath = tmp_path / "client"
    pkipath.mkdir()
    for name in migrate_tls.DEFAULT_PKI:  # TLS is checked for its client files before libvirt is asked
        (pkipath / name).write_text("x")
    qemu = tmp_path / "qemu"  # QEMU's own TLS files (virt.keys qemu: True): its stream is encrypted too
    qemu.mkdir()
    for name in ("ca-cert.pem", "client-cert.pem", "client-key.pem"):
        (qemu / name).write_text("x")
    migration = {"hosts": {"hyper2": "hv2.example.com"}, "transport": "tls", "pkipath": str(pkipath)}
    migration["qemu_tls_dir"] = str(qemu)
    mods = make_minion_mods(tmp_path, "test:///default", migration=migration)
    with pytest.raises(
        CommandExecutionError, match=r"from .* to hv2\.example\.com failed: .* VM 'test' is still running"
    ):
        mods["virt.migrate"]("test", "hyper2")


def test_prepare_creates_only_inside_its_own_images_or_allowlist(test_conn, src_vm, target, tmp_path):
    """The source's answer names the paths; the target creates only below its own virt:images or its
    virt:allowed_paths, exclusively: a forged path elsewhere (or a symlink out) creates nothing."""
    info = migrate.source_info(test_conn, "m", src_vm["images"])
    b = target["images"]
    elsewhere = tmp_path / "host"
    elsewhere.mkdir()
    forged = json.loads(json.dumps(info))
    forged["images_dir"] = None  # disks are no longer below the source's images: same absolute path
    forged["disks"][1]["path"] = str(elsewhere / "authorized_keys")
    with pytest.raises(
        SaltInvocationError, match=r"disk vdb of VM 'm' on the target .* is outside .*virt:allowed_paths"
    ):
        migrate.prepare(target["conn"], forged, b)
    assert os.listdir(b) == [] and os.listdir(elsewhere) == []
    os.makedirs(f"{b}/m")
    os.symlink(str(elsewhere / "x.raw"), f"{b}/m/data.raw")  # inside by name, outside in fact
    with pytest.raises(SaltInvocationError, match=r"data.raw. escapes"):
        migrate.prepare(target["conn"], info, b)
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(f"{b}/m")) == ["data.raw"]
    os.unlink(f"{b}/m/data.raw")
    plan = migrate.prepare(target["conn"], forged, b, allowed_paths=[str(elsewhere)])  # the operator allows it
    assert str(elsewhere / "authorized_keys") in plan["created"]
    assert img_info(str(elsewhere / "authorized_keys"))["virtual-size"] == 32 << 20


def test_qemu_img_on_the_target_runs_through_tools_run(tmp_path):
    """One runner for host tools (timeout, the tool's own message naming the step)."""
    with pytest.raises(CommandExecutionError, match=r"^qemu-img create -q -f qcow2 .*/no/such/dir/d.qcow2 1M failed: "):
        migrate._qemu_img("create", "-q", "-f", "qcow2", str(tmp_path / "no/such/dir/d.qcow2"), "1M")
    assert migrate._qemu_img("create", "-q", "-f", "qcow2", str(tmp_path / "d.qcow2"), "1M") == ""
