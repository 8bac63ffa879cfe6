"""saltvirt.vm.resolve: the one step from the spec asked for to the spec a host makes, which returns a copy
and never writes into the desired spec (issue 35: provision, attach and voldisks used to fill it in)."""

import copy

import libvirt
import pytest

from saltvirt.model import vmargs, vmspec
from saltvirt.vm import resolve


@pytest.fixture
def conn():
    c = libvirt.open("test:///default")
    yield c
    c.close()


def desired(tmp_path, **given):
    req = vmargs.InitRequest("rs1", 1, 64, **{"nic": None, "disk": None, "enable_vnc": True, **given})
    return vmspec.build(req, images_dir=str(tmp_path))


def test_for_init_returns_a_resolved_copy(conn, tmp_path):
    asked = desired(tmp_path, disks=[{"data": {"size": 16}}])
    before = copy.deepcopy(asked)
    done = resolve.for_init(
        conn,
        asked,
        images_dir=str(tmp_path),
        operator=None,
        tb_cache_mib=128,
        image_origin="debian12",
        image=None,
        fetched=None,
        accept=lambda source: pytest.fail(f"no image to accept: {source}"),
    )
    assert asked == before  # nobody writes into the desired spec
    spec = done.spec
    assert spec.uuid and spec.graphics.password and spec.tb_cache_mib == 128 and spec.image_origin == "debian12"
    assert spec.hostdevs == [] and done.attached == [] and done.sources == {}
    assert [d.path for d in spec.disks] == [d.path for d in asked.disks]


def test_for_update_keeps_the_vms_console_password_in_a_copy(conn, tmp_path):
    asked = desired(tmp_path)
    before = copy.deepcopy(asked)
    config = {"graphics": [{"type": "vnc", "passwd": "kept"}], "disks": []}
    got = resolve.for_update(conn, asked, config, ("graphics",), uuid="u", images_dir=str(tmp_path), operator=None)
    assert got.graphics.password == "kept" and asked == before
    assert resolve.for_update(conn, asked, config, (), uuid="u", images_dir=str(tmp_path), operator=None) == asked


def test_disk_paths_learnt_while_making_go_into_a_copy(tmp_path):
    asked = desired(tmp_path, disks=[{"data": {"size": 16}}])
    made = resolve.with_disk_paths(asked, {"data": "/dev/vg/rs1_data"})
    assert [d.path for d in made.disks] == ["/dev/vg/rs1_data"]
    assert asked.disks[0].path == str(tmp_path / "rs1" / "data.qcow2")
