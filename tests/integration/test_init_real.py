"""virt.init / purge / VNC on a real libvirtd with TCG guests (the tiny test guest boots in seconds and
prints what seeding wrote into its disk on the serial console)."""

import hashlib
import json
import os
import shutil
import subprocess
import time

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from tests.support import lab


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def console(hv, name):
    return hv.path("log", "qemu", f"{name}-serial.log")


@pytest.fixture
def base_images(qemu_tmp, guest):
    """Private copies of the guest images (tests check that bases are never modified)."""
    out = {}
    for fmt in ("raw", "qcow2"):
        dst = qemu_tmp / f"base.{fmt}"
        shutil.copyfile(guest[fmt], dst)
        out[fmt] = str(dst)
    return out


def qemu_img_info(path):
    return json.loads(
        subprocess.run(
            ["qemu-img", "info", "-U", "--output=json", path], check=True, capture_output=True, text=True
        ).stdout
    )


def test_full_copy_is_seeded_before_first_boot(virt_hv, hv1, base_images, boot_args, qemu_tmp, monkeypatch):
    from saltvirt.base import fsutil
    from saltvirt.guest import keypool
    from saltvirt.pki import envelope

    before = sha256(base_images["raw"])
    # a pair made ahead (issue #40, the opt-in virt:insecure_seed_key_pool): the seeding takes it
    monkeypatch.setitem(virt_hv.pack["__opts__"]["virt"], "insecure_seed_key_pool", keypool.DEFAULT_SIZE)
    pool = os.path.join(virt_hv.opts["cachedir"], "saltvirt", "keypool")
    os.makedirs(pool, mode=0o700)
    keypool.fill(pool, 1, envelope.new_keypair)
    with open(os.path.join(pool, keypool.ready(pool)[0])) as fh:
        pooled = json.load(fh)["pub"]
    ret = virt_hv["virt.init"]("full1", 1, 256, image=base_images["raw"], boot=boot_args)
    assert ret["key"]["fingerprint"] == fsutil.sha256(pooled)
    deadline = time.monotonic() + 120  # refilled after it, by a process of its own
    while len(keypool.ready(pool)) < keypool.DEFAULT_SIZE:
        assert time.monotonic() < deadline, os.listdir(pool)
        time.sleep(0.1)
    assert ret["started"] is True and ret["state"] == "running"
    assert ret["type"] == "qemu"  # this host's nested KVM cannot boot guests: detected, not hard-coded
    disk = ret["disks"][0]
    assert disk["path"] == str(qemu_tmp / "images" / "full1" / "system.raw") and disk["overlay"] is False
    assert ret["seed"]["backend"] in ("libguestfs", "qemu-nbd", "qsd-fuse", "loop")
    log = lab.wait_for_text(console(hv1, "full1"), "SALT-MINION-KEY:")
    assert "SALT-MINION-ID: full1" in log
    assert "master: salt-master.example" in log
    assert f"SALT-MINION-KEY: {ret['key']['fingerprint']}" in log
    assert sha256(base_images["raw"]) == before
    purged = virt_hv["virt.purge"]("full1")
    assert purged["removed"] == [disk["path"]]
    assert not os.path.exists(os.path.dirname(disk["path"]))
    assert "full1" not in virt_hv["virt.list_domains"]()


def test_overlay_backs_onto_base_with_format_and_purge_keeps_base(virt_hv, hv1, base_images, boot_args):
    before = sha256(base_images["qcow2"])
    ret = virt_hv["virt.init"]("over1", 1, 256, image=base_images["qcow2"], enable_qcow=True, boot=boot_args)
    path = ret["disks"][0]["path"]
    info = qemu_img_info(path)
    assert info["format"] == "qcow2"
    assert info["backing-filename"] == base_images["qcow2"]
    assert info["backing-filename-format"] == "qcow2"
    log = lab.wait_for_text(console(hv1, "over1"), "SALT-MINION-ID:")
    assert "SALT-MINION-ID: over1" in log
    disks = virt_hv["virt.get_disks"]("over1")
    assert disks["vda"]["file"] == path and disks["vda"]["format"] == "qcow2"
    purged = virt_hv["virt.purge"]("over1")
    assert purged["removed"] == [path]
    assert os.path.exists(base_images["qcow2"]) and sha256(base_images["qcow2"]) == before


def test_vnc_port_answers_rfb(virt_hv, hv1, boot_args):
    virt_hv["virt.init"]("vnc1", 1, 128, disk=None, boot=boot_args, enable_vnc=True)
    try:
        gfx = virt_hv["virt.get_graphics"]("vnc1")
        # Salt's shape: the <graphics> attributes as strings (port "5900", autoport "yes")
        assert gfx["type"] == "vnc" and gfx["listen"] == "127.0.0.1" and gfx["autoport"] == "yes"
        assert gfx["port"].isdigit() and int(gfx["port"]) >= 5900
        assert gfx["password"] is True and "passwd" not in gfx  # generated, reported only as a yes/no
        # the console listens on the hypervisor's loopback: reported as such, with the ssh tunnel to it
        assert gfx["address"] == f"127.0.0.1:{gfx['port']}"
        assert gfx["tunnel"] == f"ssh -N -L {gfx['port']}:127.0.0.1:{gfx['port']} hv1"
        probe = f"import socket; s=socket.create_connection(('127.0.0.1', {gfx['port']}), 5); print(s.recv(12))"
        out = hv1.ns_run(["python3", "-c", probe]).stdout
        assert "RFB 003.00" in out
    finally:
        virt_hv["virt.purge"]("vnc1")


def test_no_vnc_unless_asked(virt_hv, boot_args):
    virt_hv["virt.init"]("novnc1", 1, 128, disk=None, boot=boot_args, start=False)
    try:
        # Salt's shape for a VM without a console: its keys, each the string "None"
        assert virt_hv["virt.get_graphics"]("novnc1") == {
            "autoport": "None",
            "keymap": "None",
            "listen": "None",
            "port": "None",
            "type": "None",
            "address": None,
            "tunnel": None,
            "password": False,
        }
    finally:
        virt_hv["virt.purge"]("novnc1")


def _nothing_left(virt_hv, qemu_tmp, name):
    assert name not in virt_hv["virt.list_domains"]()
    assert not os.path.exists(qemu_tmp / "images" / name)


@pytest.mark.parametrize(
    "name, kwargs, error, match",
    [
        ("bad/name", {}, SaltInvocationError, "invalid VM name"),
        ("bad name", {}, SaltInvocationError, "invalid VM name"),
        ("..", {}, SaltInvocationError, "invalid VM name"),
        ("zero", {"cpu": 0}, SaltInvocationError, "positive integer"),
        ("nomem", {"mem": "lots"}, SaltInvocationError, "positive integer"),
        ("missing", {"image": "/nonexistent/base.qcow2"}, SaltInvocationError, "/nonexistent/base.qcow2"),
        ("relimg", {"image": "images/../../etc/shadow"}, SaltInvocationError, "absolute"),
        ("scheme", {"image": "ftp://example.invalid/x.img"}, SaltInvocationError, "ftp"),
        ("badnic", {"nic": "nosuchprofile"}, SaltInvocationError, "nic profile"),
    ],
)
def test_bad_input_creates_nothing(virt_hv, qemu_tmp, name, kwargs, error, match):
    args = {"cpu": 1, "mem": 128}
    args.update(kwargs)
    cpu, mem = args.pop("cpu"), args.pop("mem")
    with pytest.raises(error, match=match):
        virt_hv["virt.init"](name, cpu, mem, **args)
    if "/" not in name and name != "..":
        _nothing_left(virt_hv, qemu_tmp, name)


def test_existing_disk_file_is_never_overwritten(virt_hv, qemu_tmp, base_images):
    vm_dir = qemu_tmp / "images" / "taken1"
    vm_dir.mkdir(parents=True)
    precious = vm_dir / "system.raw"
    precious.write_bytes(b"someone's data")
    with pytest.raises(SaltInvocationError, match="already exists: refusing to overwrite"):
        virt_hv["virt.init"]("taken1", 1, 128, image=base_images["raw"])
    assert precious.read_bytes() == b"someone's data"
    assert "taken1" not in virt_hv["virt.list_domains"]()


def test_failed_seed_fails_init_and_removes_what_it_created(virt_hv, qemu_tmp, base_images):
    with pytest.raises(CommandExecutionError, match="seeding .* failed"):
        virt_hv["virt.init"]("seedfail", 1, 128, image=base_images["qcow2"], seed_backend="loop")
    _nothing_left(virt_hv, qemu_tmp, "seedfail")


def test_missing_bridge_is_explained_and_cleaned_up(virt_hv, qemu_tmp, base_images, boot_args):
    with pytest.raises(CommandExecutionError, match="bridge 'nobr0' does not exist on hv1.*salt-virt.example.sls"):
        virt_hv["virt.init"](
            "nobridge",
            1,
            128,
            image=base_images["qcow2"],
            boot=boot_args,
            interfaces=[{"name": "eth0", "type": "bridge", "source": "nobr0"}],
        )
    _nothing_left(virt_hv, qemu_tmp, "nobridge")


def test_a_raw_disk_with_a_guest_written_qcow2_header_is_attached_as_raw(virt_hv, hv1, qemu_tmp, boot_args):
    """Issue 23's window: a raw data disk whose guest wrote a qcow2 header naming a host file. Attached
    without a format (Salt's spelling) it is refused and nothing is made; with format: raw the real qemu
    opens it as raw: libvirt's live definition of the running VM has no backing store for it."""
    import xml.etree.ElementTree as ET

    secret = qemu_tmp / "host-secret"
    secret.write_bytes(b"not for guests\n" * 256)
    disk = qemu_tmp / "sources" / "data.raw"
    disk.parent.mkdir(exist_ok=True)
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(secret), str(disk), "1M"], check=True
    )
    entry = {"name": "data", "source_file": str(disk)}
    with pytest.raises(SaltInvocationError, match="is a qcow2 with a backing file: refused"):
        virt_hv["virt.init"]("window1", 1, 128, disk=None, nic=None, boot=boot_args, disks=[entry])
    _nothing_left(virt_hv, qemu_tmp, "window1")
    ret = virt_hv["virt.init"](
        "window1", 1, 128, disk=None, nic=None, boot=boot_args, disks=[dict(entry, format="raw")]
    )
    assert ret["state"] == "running" and ret["attached"][0]["format"] == "raw"
    live = ET.fromstring(virt_hv["virt.get_xml"]("window1"))
    el = next(d for d in live.findall("devices/disk") if d.find("source").get("file") == str(disk))
    assert el.find("driver").get("type") == "raw"
    assert el.find("backingStore") is None or el.find("backingStore/source") is None  # qemu never opened the secret
    purged = virt_hv["virt.purge"]("window1")
    assert purged["removed"] == [] and disk.exists() and secret.exists()


def test_purge_keeps_disks_it_did_not_create(virt_hv, qemu_tmp, base_images, boot_args):
    foreign = qemu_tmp / "foreign.qcow2"
    shutil.copyfile(base_images["qcow2"], foreign)
    virt_hv["virt.init"](
        "foreign1",
        1,
        128,
        disk=None,
        boot=boot_args,
        start=False,
        disks=[{"name": "data", "path": str(foreign), "format": "qcow2"}],
    )
    purged = virt_hv["virt.purge"]("foreign1")
    assert purged["removed"] == []
    assert str(foreign) in purged["kept"]
    assert foreign.exists()
