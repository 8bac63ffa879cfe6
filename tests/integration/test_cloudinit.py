"""cloud-init seed volumes and the first-boot minion install, on a real libvirtd with TCG guests.

The busybox test guest stands in for a cloud image (no real one can be downloaded here): its /init reads
a NoCloud ``cidata`` CD on SATA and prints what it holds (``CIDATA-USER/META/NET/WRITE``), and runs the
disk's enabled ``salt-virt-*.service`` one-shot units once the network is up, like systemd would
(``BOOT-HOOK``): see scripts/build-guest.sh. The guests get DHCP on the lab fabric and a route to the
root namespace (``Fabric.master_link``), where this module serves the "minion installer" over HTTP.
Two guest boots; the other VMs (images with a minion, one through ``salt-run virt.init`` on the session's
master and hyper1) are only created, never started.
"""

import base64
import hashlib
import http.server
import io
import json
import os
import pathlib
import shutil
import threading
import xml.etree.ElementTree as ET

import pycdlib
import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from saltvirt.guest import firstboot
from saltvirt.guest import seed as seeding
from saltvirt.pki import envelope
from tests.support import lab, signedfleet
from tests.support.paths import guest_boot
from tests.support.saltloader import make_minion_mods

DEBIAN = os.path.join(os.environ.get("SALT_VIRT_DEBIAN", "/var/cache/salt-virt/debian"), "debian-minion.qcow2")
INSTALLER = b'#!/bin/sh\necho "MINION-INSTALLER-RAN args=$*"\n'
USER_DATA = "#cloud-config\n# written by test_cloudinit\nruncmd:\n- [sh, -c, 'echo user <&> \"quoted\"']\n"
META_DATA = "instance-id: iid-ci1-test\nlocal-hostname: ci1.example.net\n"
NETWORK = "version: 2\nethernets:\n  primary:\n    match: {name: 'e*'}\n    dhcp4: true\n"


def sha(data):
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


@pytest.fixture(scope="module")
def ci_lab(lab_dir):
    """A fabric with DHCP and a link to the root namespace, one hypervisor, an HTTP server there."""
    fabric = lab.Fabric(lab.new_tag()).start()
    hv = server = None
    try:
        address = fabric.master_link()
        fabric.dhcp()
        hv = lab.Hypervisor(lab_dir, 5, fabric).start()
        fetched = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                fetched.append((self.path, self.headers.get("Authorization")))
                body = INSTALLER if self.path == "/install.sh" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer((address, 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield {"hv": hv, "url": f"http://{address}:{server.server_address[1]}", "fetched": fetched}
    finally:
        if server:
            server.shutdown()
        if hv:
            hv.stop()
        fabric.stop()


@pytest.fixture
def ci_virt(tmp_path, ci_lab, qemu_tmp, guest):
    """virt.* on the lab's hypervisor; virt:minion_install points at the lab's HTTP server (with
    credentials in the URL: they must reach the guest and nowhere else)."""
    url = ci_lab["url"].replace("http://", "http://ops:pw-s3cret@") + "/install.sh"
    install = {"url": url, "checksum": f"sha256:{sha(INSTALLER)}", "args": ["-X", "stable"]}
    return make_minion_mods(
        tmp_path,
        ci_lab["hv"].uri,
        images_dir=qemu_tmp / "images",
        allowed_paths=[guest["dir"], str(qemu_tmp), os.path.dirname(DEBIAN)],
        minion_install=install,
    )


def boot(guest):
    return guest_boot(guest, "guest.ip=dhcp")


def console(hv, name):
    return hv.path("log", "qemu", f"{name}-serial.log")


def base_copy(guest, qemu_tmp, fmt):
    dst = qemu_tmp / f"base.{fmt}"
    shutil.copyfile(guest[fmt], dst)
    return str(dst)


def cdroms(virt, name, inactive):
    root = ET.fromstring(virt["virt.get_xml"](name, inactive=inactive))
    return [d.find("source").get("file") for d in root.findall("devices/disk[@device='cdrom']")]


def read_iso(path):
    iso = pycdlib.PyCdlib()
    iso.open(path)
    try:
        out = {}
        for name in ("user-data", "meta-data"):
            buf = io.BytesIO()
            iso.get_file_from_iso_fp(buf, rr_path=f"/{name}")
            out[name] = buf.getvalue()
        return out
    finally:
        iso.close()


def test_documents_arrive_intact_seed_is_single_use_and_minion_installed_at_first_boot(
    ci_virt, ci_lab, guest, qemu_tmp
):
    hv = ci_lab["hv"]
    cloud = {"user_data": USER_DATA, "meta_data": META_DATA, "network_config": NETWORK}
    image = base_copy(guest, qemu_tmp, "qcow2")
    ret = ci_virt["virt.init"]("ci1", 1, 256, image=image, boot=boot(guest), cloud_init=cloud)
    try:
        assert ret["started"] is True
        assert ret["seed"]["backend"] in ("libguestfs", "qemu-nbd", "qsd-fuse")  # the disk was mounted
        ci = ret["cloud_init"]
        assert ci["documents"] == {
            "user-data": sha(USER_DATA),
            "meta-data": sha(META_DATA),
            "network-config": sha(NETWORK),
        }
        assert (ci["detached"], ci["iso_removed"], ci["target"]) == (True, True, "sda")
        # what the guest read from the CD: byte for byte what was given (nothing of ours added: the
        # image has no cloud-init, so the installer went in as a boot hook)
        log = lab.wait_for_text(console(hv, "ci1"), "CIDATA-NET:")
        assert f"CIDATA-USER: sha256={sha(USER_DATA)} first=#cloud-config" in log
        assert "CIDATA-META: instance-id: iid-ci1-test | local-hostname: ci1.example.net | " in log
        assert f"CIDATA-NET: sha256={sha(NETWORK)} first=version: 2" in log
        assert "SALT-MINION-ID: ci1" in log  # disk seeding as before
        # the seed is single-use: gone from the definition and the disk, still in the running VM
        assert cdroms(ci_virt, "ci1", inactive=True) == []
        assert cdroms(ci_virt, "ci1", inactive=False) == [ci["iso"]]
        assert not os.path.exists(ci["iso"])
        # no minion in the image: a seeded one-shot unit fetched the installer, checked it and ran it
        url = f"{ci_lab['url']}/install.sh"
        assert ret["minion"] == {
            "found": False,
            "path": None,
            "cloud_init_in_image": False,
            "install": f"seeded boot hook ({firstboot.UNIT_NAME}) from {url}",
        }
        assert "pw-s3cret" not in str(ret)
        log = lab.wait_for_text(console(hv, "ci1"), "BOOT-HOOK:", timeout=120)
        assert f"salt-virt-install-minion: fetched {url} (sha256 ok), running it" in log
        assert "MINION-INSTALLER-RAN args=-X stable" in log
        assert f"BOOT-HOOK: {firstboot.UNIT_NAME} rc=0" in log
        assert ("/install.sh", "Basic b3BzOnB3LXMzY3JldA==") in ci_lab["fetched"]  # ops:pw-s3cret, from the guest
    finally:
        purged = ci_virt["virt.purge"]("ci1")
    assert not os.path.exists(os.path.dirname(ci["iso"])), purged


def test_unmountable_image_gets_minion_files_through_cloud_init(ci_virt, ci_lab, guest, qemu_tmp):
    """No seeding backend can write the image (here: the loop backend on a qcow2): with cloud_init the
    minion's config and key go on the cidata volume instead, written on the hypervisor."""
    hv = ci_lab["hv"]
    image = base_copy(guest, qemu_tmp, "qcow2")
    ret = ci_virt["virt.init"](
        "ci2", 1, 256, image=image, boot=boot(guest), cloud_init=True, seed_backend="loop", start=False
    )
    try:
        assert ret["seed"]["backend"] == "cloud-init"
        assert [(a["backend"], a["ok"]) for a in ret["seed"]["attempts"]] == [("loop", False), ("cloud-init", True)]
        assert ret["minion"]["found"] is None and ret["minion"]["install"].startswith("cloud-init runcmd from http")
        assert "PRIVATE KEY" not in str(ret)
        # not started: the CD stays in the definition, the ISO in the VM's directory (0600)
        iso = ret["cloud_init"]["iso"]
        assert cdroms(ci_virt, "ci2", inactive=True) == [iso]
        docs = read_iso(iso)
        assert sha(docs["user-data"]) == ret["cloud_init"]["documents"]["user-data"]
        cfg = yaml.safe_load(docs["user-data"])
        files = {f["path"]: f for f in cfg["write_files"]}
        assert base64.b64decode(files["/etc/salt/minion_id"]["content"]) == b"ci2"
        pub = base64.b64decode(files["/etc/salt/pki/minion/minion.pub"]["content"])
        assert sha(pub) == ret["key"]["fingerprint"]
        assert files["/etc/salt/pki/minion/minion.pem"]["permissions"] == "0400"
        assert cfg["runcmd"][0] == ["sh", firstboot.SCRIPT]
        ci_virt["virt.start"]("ci2")
        log = lab.wait_for_text(console(hv, "ci2"), "CIDATA-NET:")
        assert f"CIDATA-USER: sha256={ret['cloud_init']['documents']['user-data']} first=#cloud-config" in log
        for path in ("/etc/salt/minion_id", "/etc/salt/pki/minion/minion.pem", firstboot.SCRIPT):
            assert f"CIDATA-WRITE: {path}" in log
        assert "SALT-MINION-ID:" not in log  # the disk itself was not written
        assert "CIDATA-NET: none" in log
    finally:
        purged = ci_virt["virt.purge"]("ci2")
    assert iso in purged["removed"] and not os.path.exists(os.path.dirname(iso))


def test_images_with_a_minion_are_left_alone(ci_virt, guest, qemu_tmp):
    """Found by looking at the mounted filesystem (symlinks resolved inside the guest); nothing is added.
    Created only, not started."""
    raw = base_copy(guest, qemu_tmp, "raw")
    seeding.seed(raw, {"/opt/saltstack/salt/bin/salt-minion": {"content": "#!/bin/sh\n", "mode": 0o755},
                       "/usr/bin/salt-minion": {"symlink": "../../opt/saltstack/salt/bin/salt-minion"}})  # fmt: skip
    if not os.path.isfile(DEBIAN):
        pytest.fail(f"{DEBIAN} is missing: run scripts/setup.sh (it builds the Debian guest images)")
    for name, image, path in (("ci3", raw, "/usr/bin/salt-minion"), ("ci4", DEBIAN, "/usr/bin/salt-minion")):
        ret = ci_virt["virt.init"](name, 1, 256, image=image, enable_qcow=True, cloud_init=True, start=False)
        try:
            assert ret["minion"]["found"] is True and ret["minion"]["path"] == path
            assert ret["minion"]["install"] is None
            assert not any("salt-virt-install-minion" in f for f in ret["seed"]["files"])
            docs = read_iso(ret["cloud_init"]["iso"])
            assert docs["user-data"] == b"#cloud-config\n"  # nothing of ours to add
        finally:
            ci_virt["virt.purge"](name)


def test_runner_passes_cloud_init_and_the_key_reaches_the_iso_sealed(salt_run_cli, salt_master, hyper1):
    """salt-run virt.init: cloud_init flows through to the hypervisor's virt.init; the minion key the
    master pre-accepted travels sealed to hyper1, which writes it into the ISO itself. Not started."""
    ret = salt_run_cli.run(
        "virt.init",
        "cirun1",
        "1",
        "128",
        "salt://images/guest.qcow2",
        "host=hyper1",
        'cloud_init={"hostname": "cirun1.example.net"}',
        "seed_backend=cloud-init",
        "start=False",
    )
    assert ret.returncode == 0, ret
    res = ret.data
    try:
        assert res["init"]["seed"]["backend"] == "cloud-init" and res["key"]["state"] == "accepted"
        docs = read_iso(res["init"]["cloud_init"]["iso"])
        assert b"local-hostname: cirun1.example.net" in docs["meta-data"]
        files = {f["path"]: f for f in yaml.safe_load(docs["user-data"])["write_files"]}
        pem = base64.b64decode(files["/etc/salt/pki/minion/minion.pem"]["content"])
        guest_key = serialization.load_pem_private_key(pem, password=None)
        master_pub = (pathlib.Path(salt_master.config["pki_dir"]) / "minions" / "cirun1").read_text()
        assert envelope.fingerprint(guest_key.public_key()) == envelope.fingerprint(master_pub)
        job = salt_run_cli.run("jobs.list_job", res["jid"]).data
        kwargs = signedfleet.published_kwargs(job)
        assert kwargs["cloud_init"] == {"hostname": "cirun1.example.net"}
        assert envelope.is_envelope(kwargs["priv_key"]) and "PRIVATE KEY" not in json.dumps(job)
        assert "PRIVATE KEY" not in ret.stdout
    finally:
        purged = salt_run_cli.run("virt.purge", "cirun1")
    assert purged.returncode == 0 and purged.data["key_deleted"] == "accepted", purged
    assert not os.path.exists(res["init"]["cloud_init"]["iso"])
