"""saltvirt.storage.firmware: boot:loader / boot:nvram are firmware the host ships, the operator's
virt:firmware, or (nvram) the VM's own file. The host's real QEMU firmware descriptors, descriptors written
to tmp dirs, libvirt's test:/// driver through the real Salt loader (virt.init, virt.update, the states)."""

import json
import os

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.model import vmspec
from saltvirt.storage import firmware
from tests.support.saltloader import SOURCES, load_states, make_minion_mods

CODE, VARS = "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"
needs_ovmf = pytest.mark.skipif(not os.path.isfile(CODE), reason="the host's OVMF (scripts/setup.sh installs it)")


def _descriptor(folder, name, mapping):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"description": name, "mapping": mapping}))


def test_shipped_reads_the_descriptors_and_the_operators_override(tmp_path):
    dist, etc = tmp_path / "usr", tmp_path / "etc"
    flash = {"device": "flash", "executable": {"filename": "/fw/CODE.fd"}, "nvram-template": {"filename": "/fw/V.fd"}}
    _descriptor(dist, "50-flash.json", flash)
    _descriptor(dist, "60-memory.json", {"device": "memory", "filename": "/fw/bios.bin"})
    _descriptor(dist, "70-gone.json", {"device": "flash", "executable": {"filename": "/fw/OLD.fd"}})
    etc.mkdir()
    (etc / "70-gone.json").write_text("")  # the operator hides a descriptor of the distribution
    (dist / "80-broken.json").write_text("{not json")
    assert firmware.shipped([str(dist), str(etc)]) == {"loader": {"/fw/CODE.fd", "/fw/bios.bin"}, "nvram": {"/fw/V.fd"}}
    assert firmware.shipped([str(tmp_path / "none")]) == {"loader": set(), "nvram": set()}


@needs_ovmf
def test_the_hosts_descriptors_name_its_ovmf():
    found = firmware.shipped()
    assert CODE in found["loader"] and VARS in found["nvram"]


@pytest.fixture
def mods(tmp_path, virt_test):
    """virt.* on the test driver (virt_test keeps it and cleans up); the operator lists one firmware file of its
    own in virt:firmware."""
    own = tmp_path / SOURCES / "OWN_CODE.fd"
    own.parent.mkdir()
    own.write_bytes(b"\0" * 4096)
    return make_minion_mods(tmp_path, "test:///default", firmware=[str(own)]), str(own)


@pytest.mark.parametrize(
    ("boot", "refusal"),
    [
        ({"loader": "/etc/shadow"}, "boot:loader: /etc/shadow is not firmware this host ships"),
        ({"loader": "{source}"}, "boot:loader: .*/sources/data.raw is not firmware this host ships"),  # allowed_paths
        ({"loader": CODE, "nvram": "/root/vars.fd"}, r"boot:nvram: /root/vars.fd is .*, nor a file of this VM"),
        ({"loader": CODE, "nvram": "{theirs}"}, "boot:nvram: .*/fw1/data.raw is not firmware"),
        ({"loader": "/usr/share/OVMF/../../../etc/shadow"}, "boot:loader must be an absolute path without '..'"),
    ],
)
def test_virt_init_refuses_firmware_the_host_does_not_ship(mods, tmp_path, boot, refusal):
    v, _ = mods
    source = tmp_path / SOURCES / "data.raw"
    source.write_bytes(b"\0" * 4096)
    v["virt.init"]("fw1", 1, 64, nic=None, disk=None, start=False, disks=[{"name": "data", "size": 1, "format": "raw"}])
    theirs = os.path.join(v["config.get"]("virt:images"), "fw1", "data.raw")
    boot = {k: p.format(source=source, theirs=theirs) for k, p in boot.items()}
    v["virt.init"]("fw0", 1, 64, nic=None, disk=None, start=False)
    try:
        with pytest.raises(SaltInvocationError, match=refusal):
            v["virt.init"]("fw2", 1, 64, nic=None, disk=None, start=False, boot=boot)
        assert "fw2" not in v["virt.list_domains"]()
        for test in (True, False):  # virt.update: the same, also for test=True
            with pytest.raises(SaltInvocationError, match=refusal):
                v["virt.update"]("fw0", test=test, boot=boot)
        ret = load_states(v)["virt.defined"]("fw0", boot=boot)
        assert ret["result"] is False and ret["changes"] == {}, ret
        assert "<loader" not in v["virt.get_xml"]("fw0")
    finally:
        v["virt.purge"]("fw0")
        v["virt.purge"]("fw1")


@needs_ovmf
def test_the_hosts_the_operators_and_the_vms_own_firmware_pass(mods, tmp_path):
    v, own = mods
    try:
        v["virt.init"]("fw3", 1, 64, nic=None, disk=None, start=False, boot={"loader": CODE, "nvram": VARS})
        assert f"<nvram template='{VARS}'" in v["virt.get_xml"]("fw3")
        v["virt.init"]("fw4", 1, 64, nic=None, disk=None, start=False, boot={"loader": own})  # virt:firmware
        assert f">{own}</loader>" in v["virt.get_xml"]("fw4")
        legacy = "/usr/share/OVMF/OVMF_CODE.fd"  # the distribution's firmware directory, in no descriptor
        if os.path.isfile(legacy):
            assert v["virt.update"]("fw4", boot={"loader": legacy})["changes"]
        # the VM's own variables store (in its directory of virt:images): a raw file passes, a qcow2 does not
        mine = os.path.join(v["config.get"]("virt:images"), "fw3", "VARS.fd")
        with open(mine, "wb") as fh:
            fh.write(b"\0" * 4096)
        assert v["virt.update"]("fw3", boot={"loader": CODE, "nvram": mine})["changes"]
        assert f"<nvram template='{mine}'" in v["virt.get_xml"]("fw3")
        with pytest.raises(SaltInvocationError, match="boot:nvram: .*fw3/VARS.fd is not firmware"):
            v["virt.update"]("fw4", boot={"loader": CODE, "nvram": mine})  # fw3's, not fw4's
    finally:
        v["virt.purge"]("fw3")
        v["virt.purge"]("fw4")


def test_check_by_itself_without_descriptors(tmp_path):
    boot = vmspec.Boot(loader="/srv/fw/CODE.fd")
    with pytest.raises(SaltInvocationError, match=r"descriptors in /nowhere, or /usr/share/OVMF"):
        firmware.check(None, boot, vm="x", uuid=None, images_dir=str(tmp_path), dirs=["/nowhere"])
    firmware.check(None, boot, vm="x", uuid=None, images_dir=str(tmp_path), settings={"firmware": ["/srv/fw/CODE.fd"]})
    firmware.check(None, None, vm="x", uuid=None, images_dir=str(tmp_path))  # no boot: nothing to check
