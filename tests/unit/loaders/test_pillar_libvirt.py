"""_pillar/libvirt.py: the ``libvirt`` ext_pillar, compiled by salt.pillar.Pillar in-process (no daemons)."""

import os

import pytest

from saltvirt.pki import ca as pki
from saltvirt.pki import crl
from tests.support import keystore
from tests.support.paths import ROOT
from tests.support.pkitools import QUICK_KEYS, mode

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

    def compile_(minion_id, grains, ext_pillar_conf=None, ext=None, virt=None, accepted=("hv1", "hv2"), raw=None):
        opts = salt.config.master_config(None)
        opts.update(
            {
                "pki_dir": str(tmp_path / "pki"),
                "cachedir": str(tmp_path / "cache"),
                "pillar_roots": {"base": [str(tmp_path / "pillar")]},
                "file_roots": {"base": [str(tmp_path / "files")]},
                "pillar_dirs": [str(ROOT / "_pillar")],
                "extension_modules": str(tmp_path / "ext"),
                # quick EC keys: RSA generation was most of these tests' CPU (key types: tests/unit/pki/test_ca.py)
                "ext_pillar": raw or [{"libvirt": dict(QUICK_KEYS, **(ext_pillar_conf or {}))}],
                "virt": {"hypervisors": ["hv1", "hv2"]} if virt is None else virt,
            }
        )
        keys = tmp_path / "pki" / "minions"  # the master's accepted keys (what the sweep checks)
        keys.mkdir(parents=True, exist_ok=True)
        for gone in set(os.listdir(keys)) - set(accepted):
            (keys / gone).unlink()
        for mid in accepted:
            (keys / mid).write_text(keystore.keypair(mid)[0])  # only its presence counts (the sweep)
        return salt.pillar.Pillar(opts, grains, minion_id, "base", ext=ext).compile_pillar()

    return compile_


def test_ext_pillar_sans_from_master_side_data_only_by_default(compile_pillar, tmp_path):
    grains = dict(GRAINS, virt={"tls": {"extra_sans": ["hv2.lab"]}}, fqdn="hv2.example.com")
    out = compile_pillar("hv1", grains, {"extra_sans": {"hv1": ["10.9.9.9", "hv1.lan"], "hv2": ["nope"]}})["libvirt"]
    assert out["server"]["san_dns"] == ["hv1", "hv1.lan"] and out["server"]["san_ip"] == ["10.9.9.9"]
    assert out["server"]["subject"] == "CN=hv1,O=salt-virt"  # not the fqdn grain
    assert out["client"]["subject"] == "CN=hv1 libvirt client,O=salt-virt"
    assert out["ca"]["subject"] == "CN=salt-virt libvirt CA,O=salt-virt"
    assert out["tls_allowed_dn_list"] == ["O=salt-virt,CN=* libvirt client"]
    # libvirt-formula's pillar for libvirtd.conf (issue 36): the CRL virt.keys writes, the same allow list
    assert out["libvirtd"] == {"crl_file": "/etc/pki/CA/cacrl.pem", "tls_allowed_dn_list": out["tls_allowed_dn_list"]}
    elsewhere = compile_pillar("hv1", GRAINS, {"basepath": "/srv/pki"})["libvirt"]["libvirtd"]
    assert elsewhere["crl_file"] == "/srv/pki/CA/cacrl.pem"
    assert pki.load_cert(out["cacert"]).subject == pki.load_cert(out["servercert"]).issuer
    qemu = pki.load_cert(out["qemu_clientcert"])
    assert qemu.subject.rfc4514_string() == "CN=hv1 qemu migration client,O=salt-virt"
    assert out["qemu_clientkey"] != out["clientkey"] and out["qemu_serverkey"] != out["serverkey"]
    assert "BEGIN X509 CRL" in out["crl"]
    assert mode(tmp_path / "pki" / "libvirt" / "cakey.pem") == 0o600
    assert mode(tmp_path / "pki" / "libvirt" / "minions" / "hv1" / "serverkey.pem") == 0o600
    # the grains, only with the explicit opt-in
    opted = compile_pillar("hv1", dict(GRAINS, virt={"tls": {"extra_sans": ["hv1.lab"]}}), {"san_from_grains": True})
    assert opted["libvirt"]["server"]["san_dns"] == ["hv1", "hv1.example.com", "hv1.lab"]
    assert opted["libvirt"]["server"]["san_ip"] == ["10.0.0.5", "fd00::5"]  # no loopback / link-local
    assert opted["libvirt"]["server"]["subject"] == "CN=hv1.example.com,O=salt-virt"


def test_ext_pillar_refuses_a_san_another_minions_certificate_holds(compile_pillar):
    conf = {"extra_sans": {"hv1": ["shared.lan", "hv1.lan"], "hv2": ["shared.lan", "hv1", "hv2.lan"]}}
    first = compile_pillar("hv1", {}, conf)["libvirt"]["server"]
    second = compile_pillar("hv2", {}, conf)["libvirt"]["server"]
    assert first["san_dns"] == ["hv1", "hv1.lan", "shared.lan"]
    assert second["san_dns"] == ["hv2", "hv2.lan"]  # neither hv1's id nor the name hv1 already holds


def test_ext_pillar_only_for_configured_hypervisors(compile_pillar):
    assert "libvirt" not in compile_pillar("web1", GRAINS)  # the virt_hypervisor grain decides nothing
    assert "libvirt" in compile_pillar("hv2", {})
    assert "libvirt" in compile_pillar("hv1", {}, virt={"hypervisors": "hv*"})
    assert "libvirt" not in compile_pillar("web1", GRAINS, virt={"hypervisors": {"tgt": "hv1,hv2"}})
    refused = compile_pillar("hv1", GRAINS, virt={"hypervisors": {"tgt": "G@virt_hypervisor:True"}})
    assert "servercert" not in refused["libvirt"] and "virt_hypervisors_trust" not in refused["libvirt"]["error"]
    assert "hypervisors_trust_minion_data" in refused["libvirt"]["error"]
    opted = {"hypervisors": {"tgt": "G@virt_hypervisor:True"}, "hypervisors_trust_minion_data": True}
    assert "servercert" in compile_pillar("web1", GRAINS, virt=opted, accepted=("web1",))["libvirt"]
    # nothing configured / the old ext_pillar target: every minion is told what to add, nobody gets keys
    for ret in (compile_pillar("hv1", GRAINS, virt={}), compile_pillar("hv1", GRAINS, {"target": "hv*"})):
        assert list(ret["libvirt"]) == ["error"] and "virt:" in ret["libvirt"]["error"]
        assert "hypervisors" in ret["libvirt"]["error"]


def test_ext_pillar_revokes_when_reissued_and_when_the_key_is_gone(compile_pillar, tmp_path):
    from cryptography import x509

    ca_dir = str(tmp_path / "pki" / "libvirt")
    old = compile_pillar("hv2", {}, {"extra_sans": {"hv2": ["a.lan"]}})["libvirt"]
    new = compile_pillar("hv2", {}, {"extra_sans": {"hv2": ["b.lan"]}})["libvirt"]  # SANs changed: reissued
    revoked = {f"{r.serial_number:x}" for r in x509.load_pem_x509_crl(new["crl"].encode())}
    assert new["server"]["serial"] != old["server"]["serial"] and old["server"]["serial"] in revoked
    assert new["server"]["serial"] not in revoked and new["client"]["serial"] not in revoked
    # hv2's key deleted on the master: the next compile (any minion) revokes all of hv2's certificates
    after = compile_pillar("hv1", {}, accepted=("hv1",))["libvirt"]
    revoked = {f"{r.serial_number:x}" for r in x509.load_pem_x509_crl(after["crl"].encode())}
    assert {new["server"]["serial"], new["client"]["serial"]} <= revoked
    assert not os.path.exists(os.path.join(ca_dir, "minions", "hv2"))
    assert [e for e in crl.revoked(ca_dir) if "no longer a hypervisor" in e["reason"]]


def test_ext_pillar_refuses_a_minions_own_configuration(compile_pillar):
    """Salt's default on_demand_ext_pillar lists 'libvirt': a minion's pillar.ext must not get certs
    for names or targets of its choosing."""
    ask = {"libvirt": {"target": "*", "extra_sans": {"web1": ["hv1.example.com"], "hv1": ["bank.example.com"]}}}
    assert "libvirt" not in compile_pillar("web1", dict(GRAINS, virt_hypervisor=False), ext=ask)
    out = compile_pillar("hv1", GRAINS, ext=ask)["libvirt"]  # the master's own entry still answers
    assert "bank.example.com" not in out["server"]["san_dns"]


def test_ext_pillar_old_placeholder_config_is_accepted(compile_pillar):
    # Salt's tutorial: "ext_pillar: [- libvirt: _]"
    assert "servercert" in compile_pillar("hv1", {}, raw=[{"libvirt": "_"}])["libvirt"]
    assert "libvirt" not in compile_pillar("web1", {}, raw=[{"libvirt": "_"}])
    # anything else that is not a mapping: every minion is told why (not only the master log)
    bad = compile_pillar("hv1", {}, raw=[{"libvirt": ["a", "b"]}])
    assert list(bad["libvirt"]) == ["error"] and "configure it with a mapping" in bad["libvirt"]["error"]


def test_a_recorded_vm_id_gets_no_certificates_even_if_the_glob_matches(compile_pillar, tmp_path):
    """Issue 23 #3: a minion id the runner pre-accepted for a VM is recorded; the ext_pillar never gives it
    libvirt certificates, even when virt:hypervisors (here 'hv*') matches it."""
    import salt.config

    from saltvirt.fleet import hypervisors

    virt = {"hypervisors": "hv*"}
    assert "libvirt" in compile_pillar("hv7", GRAINS, virt=virt, accepted=("hv1", "hv7"))
    master = dict(salt.config.master_config(None), cachedir=str(tmp_path / "cache"))
    hypervisors.record_vm_id(master, "hv-vm1", "hv-vm1")
    out = compile_pillar("hv-vm1", GRAINS, virt=virt, accepted=("hv1", "hv-vm1"))
    assert "libvirt" not in out, sorted(out)


def test_hypervisors_get_the_tenant_membership_other_minions_do_not(compile_pillar):
    """The virt_vm resources' tenant gate reads who belongs to which tenant from the hypervisor's pillar: the
    master config's virt:tenants, resolved on the master; a guest's minion gets none of it, and a broken
    virt:tenants gives the hypervisors an empty map (no tenant let in) with their certificates."""
    from saltvirt.model import tenancy

    tenants = {"acme": {"members": ["alice"]}, "beta": {"members": ["bob"]}}
    virt = {"hypervisors": ["hv1", "hv2"], "operators": ["ops"], "tenants": tenants}
    assert compile_pillar("hv1", GRAINS, virt=virt)[tenancy.MEMBERS_PILLAR] == {"alice": "acme", "bob": "beta"}
    assert tenancy.MEMBERS_PILLAR not in compile_pillar("web1", GRAINS, virt=virt)
    assert compile_pillar("hv2", {})[tenancy.MEMBERS_PILLAR] == {}  # no tenants configured
    broken = dict(virt, tenants={"acme": {"members": ["alice"], "colour": "red"}})
    got = compile_pillar("hv1", GRAINS, virt=broken)
    assert got[tenancy.MEMBERS_PILLAR] == {} and "servercert" in got["libvirt"]
