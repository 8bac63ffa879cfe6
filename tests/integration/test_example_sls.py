"""salt-virt.example.sls: renders for Debian and RedHat grains; its package, config and keys parts
apply for real on this machine (into temp paths), the service and bridge parts in test=True."""
import json
import os
import shutil
import tempfile

import pytest

from conftest import ROOT, start_minion


@pytest.fixture(scope="module")
def hypervisor_sls(state_tree):
    shutil.copyfile(ROOT / "salt-virt.example.sls", state_tree / "hypervisor.sls")
    return "hypervisor"


@pytest.fixture(scope="module")
def redhat_minion(salt_master):
    factory = start_minion(salt_master, "rh1", {"grains": {"os_family": "RedHat", "os": "Rocky", "init": "systemd"}})
    with factory.started():
        yield factory


def states_by_id(data):
    return {v["__id__"]: v for v in data.values()}


def test_renders_for_debian_and_redhat(salt_cli, hyper1, redhat_minion, hypervisor_sls):
    deb = salt_cli.run("state.show_sls", hypervisor_sls, minion_tgt="hyper1").data
    rh = salt_cli.run("state.show_sls", hypervisor_sls, minion_tgt="rh1").data
    assert isinstance(deb, dict) and isinstance(rh, dict), (deb, rh)

    def pkgs(rendered):
        return next(arg["pkgs"] for arg in rendered["salt-virt-packages"]["pkg"] if isinstance(arg, dict) and "pkgs" in arg)

    assert "libvirt-daemon-system" in pkgs(deb) and "qemu-system-x86" in pkgs(deb)
    assert "libvirt" in pkgs(rh) and "qemu-kvm" in pkgs(rh)
    for rendered in (deb, rh):
        assert {"salt-virt-keys", "salt-virt-libvirtd-listen", "salt-virt-libvirtd", "salt-virt-bridge"} <= set(rendered)
    assert "salt-virt-libvirtd-tls-socket" in rh  # systemd hosts: socket activation for TLS


def test_packages_config_and_keys_apply_for_real(salt_cli, hyper1, hypervisor_sls):
    tmp = tempfile.mkdtemp(prefix="svsls-", dir="/var/tmp")
    try:
        conf = os.path.join(tmp, "libvirtd.conf")
        shutil.copyfile("/etc/libvirt/libvirtd.conf", conf)
        pillar = {"salt_virt": {"libvirtd_conf": conf, "pki_basepath": os.path.join(tmp, "pki"), "manage_service": False}}
        ret = salt_cli.run(
            "state.sls", hypervisor_sls, f"pillar={json.dumps(pillar)}", 'exclude=[{"id": "salt-virt-bridge"}]', minion_tgt="hyper1", _timeout=600
        )
        states = states_by_id(ret.data)
        assert all(s["result"] is True for s in states.values()), {k: s["comment"] for k, s in states.items()}
        assert set(states) == {"salt-virt-packages", "salt-virt-refresh-grains", "salt-virt-libvirtd-listen", "salt-virt-keys"}
        text = open(conf).read()
        assert "\nlisten_tls = 1" in text and f'ca_file = "{tmp}/pki/CA/cacert.pem"' in text
        assert oct(os.stat(os.path.join(tmp, "pki/libvirt/private/serverkey.pem")).st_mode & 0o777) == "0o600"
        again = states_by_id(
            salt_cli.run("state.sls", hypervisor_sls, f"pillar={json.dumps(pillar)}", 'exclude=[{"id": "salt-virt-bridge"}]', minion_tgt="hyper1").data
        )
        assert {k: s["changes"] for k, s in again.items() if s["changes"]} == {}

        pillar["salt_virt"]["manage_service"] = True
        preview = states_by_id(salt_cli.run("state.sls", hypervisor_sls, f"pillar={json.dumps(pillar)}", "test=True", minion_tgt="hyper1").data)
        assert preview["salt-virt-bridge"]["result"] is None  # network part: test mode only
        assert "salt-virt-libvirtd" in preview
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
