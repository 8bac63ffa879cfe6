"""_pillar/libvirt.py: the ``libvirt`` ext_pillar, compiled by salt.pillar.Pillar in-process (no daemons)."""

import pytest

from saltvirt import pki
from tests.support.paths import ROOT
from tests.support.pkitools import mode

GRAINS = {
    "virt_hypervisor": True,
    "fqdn": "hv1.example.com",
    "host": "hv1",
    "ipv4": ["127.0.0.1", "10.0.0.5", "169.254.1.1"],
    "ipv6": ["::1", "fe80::1", "fd00::5"],
}


@pytest.fixture
def compile_pillar(tmp_path):
    import salt.config
    import salt.pillar

    def compile_(minion_id, grains, ext_pillar_conf=None, ext=None):
        opts = salt.config.master_config(None)
        opts.update(
            {
                "pki_dir": str(tmp_path / "pki"),
                "cachedir": str(tmp_path / "cache"),
                "pillar_roots": {"base": [str(tmp_path / "pillar")]},
                "file_roots": {"base": [str(tmp_path / "files")]},
                "pillar_dirs": [str(ROOT / "_pillar")],
                "extension_modules": str(tmp_path / "ext"),
                "ext_pillar": [{"libvirt": dict({"key_size": 2048}, **(ext_pillar_conf or {}))}],
            }
        )
        return salt.pillar.Pillar(opts, grains, minion_id, "base", ext=ext).compile_pillar()

    return compile_


def test_ext_pillar_gives_hypervisors_sans_from_grains_and_config(compile_pillar, tmp_path):
    grains = dict(GRAINS, virt={"tls": {"extra_sans": ["hv1.lab"]}})
    out = compile_pillar("hv1", grains, {"extra_sans": {"hv1": ["10.9.9.9"], "hv2": ["nope"]}})["libvirt"]
    assert out["server"]["san_dns"] == ["hv1", "hv1.example.com", "hv1.lab"]
    assert out["server"]["san_ip"] == ["10.0.0.5", "10.9.9.9", "fd00::5"]  # no loopback / link-local
    assert out["server"]["subject"] == "CN=hv1.example.com,O=salt-virt"
    assert out["client"]["subject"] == "CN=hv1 libvirt client,O=salt-virt"
    assert out["ca"]["subject"] == "CN=salt-virt libvirt CA,O=salt-virt"
    assert pki.load_cert(out["cacert"]).subject == pki.load_cert(out["servercert"]).issuer
    assert mode(tmp_path / "pki" / "libvirt" / "cakey.pem") == 0o600
    assert mode(tmp_path / "pki" / "libvirt" / "minions" / "hv1" / "serverkey.pem") == 0o600
    trusted = compile_pillar(
        "hv1", dict(grains, fqdn="evil.example.com"), {"san_from_grains": False, "extra_sans": {"hv1": ["hv1.lan"]}}
    )
    assert (
        trusted["libvirt"]["server"]["san_dns"] == ["hv1", "hv1.lan"] and trusted["libvirt"]["server"]["san_ip"] == []
    )
    assert trusted["libvirt"]["server"]["subject"] == "CN=hv1,O=salt-virt"


def test_ext_pillar_only_for_the_target(compile_pillar):
    assert "libvirt" not in compile_pillar("web1", dict(GRAINS, virt_hypervisor=False))
    assert "libvirt" not in compile_pillar("web1", {k: v for k, v in GRAINS.items() if k != "virt_hypervisor"})
    conf = {"target": "hv* and G@virt_hypervisor:True"}
    assert "libvirt" in compile_pillar("hv1", GRAINS, conf)
    assert "libvirt" not in compile_pillar("web1", GRAINS, conf)
    assert "libvirt" in compile_pillar("hv2", {}, {"target": "hv1,hv2", "tgt_type": "list"})
    broken = compile_pillar("hv1", GRAINS, {"tgt_type": "nosuch"})
    assert "libvirt" not in broken and "unknown tgt_type" in str(broken["_errors"])


def test_ext_pillar_refuses_a_minions_own_configuration(compile_pillar):
    """Salt's default on_demand_ext_pillar lists 'libvirt': a minion's pillar.ext must not get certs
    for names or targets of its choosing."""
    ask = {"libvirt": {"target": "*", "extra_sans": {"web1": ["hv1.example.com"], "hv1": ["bank.example.com"]}}}
    assert "libvirt" not in compile_pillar("web1", dict(GRAINS, virt_hypervisor=False), ext=ask)
    out = compile_pillar("hv1", GRAINS, ext=ask)["libvirt"]  # the master's own entry still answers
    assert "bank.example.com" not in out["server"]["san_dns"]
