"""saltvirt.guest.cloudinit: the NoCloud documents and the cidata ISO, read back with pycdlib (what a guest's
kernel sees: Rock Ridge names, the volume label cloud-init looks for)."""

import base64
import email
import io
import os
import shutil

import pycdlib
import pytest
import yaml
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.guest import cloudinit
from saltvirt.model import checks, vmargs
from saltvirt.model import vmspec as spec
from tests.support.saltloader import load_states


def read_iso(path):
    """{Rock Ridge name: bytes} and the volume label of an ISO."""
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        label = iso.pvd.volume_identifier.decode().strip()
        out = {}
        for child in iso.list_children(rr_path="/"):
            if child.is_dot() or child.is_dotdot():
                continue
            name = child.rock_ridge.name().decode()
            buf = io.BytesIO()
            iso.get_file_from_iso_fp(buf, rr_path=f"/{name}")
            out[name] = buf.getvalue()
        children = iso.list_children(joliet_path="/")
        joliet = sorted(c.file_identifier().decode("utf-16-be") for c in children if not (c.is_dot() or c.is_dotdot()))
    finally:
        iso.close()
    return label, out, joliet


def docs_for(ci, additions=None):
    return cloudinit.documents(checks.cloud_init(ci), name="web1", instance_id="iid-web1-1", additions=additions)


def test_iso_round_trip_keeps_every_byte(tmp_path):
    user = "#cloud-config\npackages: [nginx]\n# ünïcode and 'quotes' <&>\n"
    network = "version: 2\nethernets:\n  e:\n    match: {name: 'e*'}\n    dhcp4: true\n"
    docs = docs_for({"user_data": user, "meta_data": "instance-id: mine\n", "network_config": network})
    iso = tmp_path / "cidata.iso"
    assert cloudinit.make_iso(str(iso), docs) == "pycdlib"
    assert oct(os.stat(iso).st_mode & 0o777) == "0o600"  # it may hold a minion key
    label, files, joliet = read_iso(iso)
    assert label == "cidata"
    assert files == {
        "user-data": user.encode(),
        "meta-data": b"instance-id: mine\n",
        "network-config": network.encode(),
    }
    assert joliet == ["meta-data", "network-config", "user-data"]


def test_iso_with_xorriso_reads_the_same(tmp_path, monkeypatch):
    """Without pycdlib (a hypervisor without it) xorriso writes the same volume."""
    if not shutil.which("xorriso"):
        pytest.fail("xorriso is installed by scripts/setup.sh")
    monkeypatch.setitem(__import__("sys").modules, "pycdlib", None)  # the import fails as if not installed
    docs = docs_for(True)
    iso = tmp_path / "x.iso"
    assert cloudinit.make_iso(str(iso), docs) == "xorriso"
    monkeypatch.undo()
    label, files, _ = read_iso(iso)
    assert label == "cidata" and files == docs


def test_never_overwrites(tmp_path):
    iso = tmp_path / "cidata.iso"
    iso.write_bytes(b"someone's")
    with pytest.raises(CommandExecutionError, match="refusing to overwrite"):
        cloudinit.make_iso(str(iso), docs_for(True))
    assert iso.read_bytes() == b"someone's"
    assert os.listdir(tmp_path) == ["cidata.iso"]


def test_short_forms_build_the_documents():
    docs = docs_for(
        {
            "users": ["admin", {"name": "ops", "groups": ["adm"], "shell": "/bin/bash"}],
            "ssh_authorized_keys": ["ssh-ed25519 AAAAC3Nza test@x"],
            "hostname": "web1.example.net",
            "ip": "10.0.0.5/24",
            "gateway": "10.0.0.1",
            "dns": "10.0.0.2",
        }
    )
    user = docs["user-data"].decode()
    assert user.startswith("#cloud-config\n")
    assert yaml.safe_load(user) == {
        "users": ["default", {"name": "admin"}, {"name": "ops", "groups": ["adm"], "shell": "/bin/bash"}],
        "ssh_authorized_keys": ["ssh-ed25519 AAAAC3Nza test@x"],
    }
    assert yaml.safe_load(docs["meta-data"]) == {"instance-id": "iid-web1-1", "local-hostname": "web1.example.net"}
    assert yaml.safe_load(docs["network-config"]) == {
        "version": 2,
        "ethernets": {
            "primary": {
                "match": {"name": "e*"},
                "addresses": ["10.0.0.5/24"],
                "routes": [{"to": "default", "via": "10.0.0.1"}],
                "nameservers": {"addresses": ["10.0.0.2"]},
            }
        },
    }


def test_true_gives_minimal_documents_and_dhcp():
    docs = docs_for(True)
    assert docs["user-data"] == b"#cloud-config\n"
    assert yaml.safe_load(docs["meta-data"]) == {"instance-id": "iid-web1-1", "local-hostname": "web1"}
    assert "network-config" not in docs  # cloud-init's default: DHCP on the first NIC


def test_meta_data_mapping_keeps_its_values_and_gets_an_instance_id():
    docs = docs_for({"meta_data": {"local-hostname": "h1", "x": 1}})
    assert yaml.safe_load(docs["meta-data"]) == {"local-hostname": "h1", "x": 1, "instance-id": "iid-web1-1"}


def test_our_additions_are_a_second_part_and_the_users_part_is_unchanged():
    user = "#!/bin/sh\necho hello from the user\n"
    files = {"/etc/salt/minion_id": {"content": b"web1", "mode": 0o644}}
    docs = docs_for({"user_data": user}, additions={"write_files": cloudinit.write_files(files)})
    msg = email.message_from_bytes(docs["user-data"])
    assert msg.is_multipart()
    first, ours = msg.get_payload()
    assert first.get_content_type() == "text/x-shellscript" and first.get_payload(decode=True) == user.encode()
    assert ours.get_content_type() == "text/cloud-config"
    cfg = yaml.safe_load(ours.get_payload(decode=True))
    assert cfg["merge_how"] == cloudinit.MERGE_HOW
    (entry,) = cfg["write_files"]
    assert entry["path"] == "/etc/salt/minion_id" and entry["permissions"] == "0644"
    assert base64.b64decode(entry["content"]) == b"web1"


def test_without_additions_user_data_goes_byte_for_byte():
    user = "#cloud-config\nruncmd: [[touch, /x]]\n"
    assert docs_for({"user_data": user})["user-data"] == user.encode()


def test_seed_volume_in_the_spec_and_leftover(tmp_path):
    vm = spec.build(
        vmargs.InitRequest("web1", 1, 64, image="/i.qcow2", cloud_init=True),
        images_dir=str(tmp_path),
        image_format="qcow2",
    )
    cd = spec.cidata_disk(vm)
    assert (cd.device, cd.bus, cd.format, cd.target, cd.path) == ("cdrom", "sata", "raw", "sda", cd.path)
    assert cd.path == str(tmp_path / "web1" / "cidata.iso") and vm.disks[0].name == "system"
    assert spec.cidata_disk(spec.build(vmargs.InitRequest("web1", 1, 64, disk=None), images_dir=str(tmp_path))) is None
    assert cloudinit.leftover(str(tmp_path / "web1")) == []
    (tmp_path / "web1").mkdir()
    (tmp_path / "web1" / "cidata.iso").write_bytes(b"x")
    assert cloudinit.leftover(str(tmp_path / "web1")) == [cd.path]


def test_write_seed_reports_hashes_not_content(tmp_path):
    vm = spec.build(
        vmargs.InitRequest("web1", 1, 64, disk=None, cloud_init={"hostname": "h"}), images_dir=str(tmp_path)
    )
    (tmp_path / "web1").mkdir()
    made = cloudinit.write_seed(vm, {"runcmd": [["true"]]})
    assert made["iso"] == str(tmp_path / "web1" / "cidata.iso") and made["tool"] == "pycdlib"
    _, files, _ = read_iso(made["iso"])
    assert set(made["documents"]) == {"user-data", "meta-data"}
    assert made["instance_id"] in files["meta-data"].decode()
    assert yaml.safe_load(files["user-data"]) == {"runcmd": [["true"]]}


def test_virt_init_on_the_test_driver_keeps_the_seed_of_a_vm_not_started(virt_test):
    """Through the real loader (libvirt's test driver cannot detach devices: the detach once started is
    proven on a real libvirtd, tests/integration/test_cloudinit.py): not started, the CD stays in the
    definition and its ISO in the VM's directory until virt.purge removes it."""
    ret = virt_test["virt.init"]("cit2", 1, 64, disk=None, nic=None, cloud_init=True, seed=False, start=False)
    iso = ret["cloud_init"]["iso"]
    assert "minion" not in ret  # not seeded: nothing looked into, nothing to install
    assert "cidata.iso" in virt_test["virt.get_xml"]("cit2", inactive=True)
    assert os.path.isfile(iso) and set(ret["cloud_init"]["documents"]) == {"user-data", "meta-data"}
    assert virt_test["virt.purge"]("cit2")["removed"] == [iso]
    assert not os.path.exists(os.path.dirname(iso))


def test_state_preview_shows_the_seed_volume(virt_test):
    """virt.running test=True: the exact disks virt.init will create, the seed CD-ROM among them."""
    states = load_states(virt_test, test=True)
    ret = states["virt.running"]("cit3", cpu=1, mem=64, disk=None, cloud_init={"ip": "10.0.0.5/24"})
    assert ret["result"] is None
    images = virt_test["config.get"]("virt:images")
    cd = ret["changes"]["created"]["disks"]["sda"]
    assert cd["path"] == os.path.join(images, "cit3", "cidata.iso") and cd["device"] == "cdrom"
    bad = states["virt.running"]("cit3", cpu=1, mem=64, disk=None, cloud_init={"ip": "nope"})
    assert bad["result"] is False and "cloud_init:ip" in bad["comment"]


def test_an_existing_seed_file_is_never_overwritten(virt_test):
    images = virt_test["config.get"]("virt:images")
    os.makedirs(os.path.join(images, "cit4"))
    precious = os.path.join(images, "cit4", "cidata.iso")
    with open(precious, "wb") as fh:
        fh.write(b"someone's")
    with pytest.raises(SaltInvocationError, match="already exists: refusing to overwrite"):
        virt_test["virt.init"]("cit4", 1, 64, disk=None, nic=None, cloud_init=True, seed=False)
    with open(precious, "rb") as fh:
        assert fh.read() == b"someone's"
    assert "cit4" not in virt_test["virt.list_domains"]()
