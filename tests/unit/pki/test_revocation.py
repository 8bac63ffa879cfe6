"""saltvirt.pki.revocation: the CRL of one ca_dir, retiring minions that are no longer hypervisors
(the ext_pillar that runs it: loaders/test_pillar_libvirt.py)."""

import os

from cryptography import x509

from saltvirt.pki import ca as pki
from saltvirt.pki import crl, revocation
from tests.support.pkitools import K


def test_reissued_certificate_is_on_the_crl(tmp_path):
    ca_dir = str(tmp_path / "libvirt")
    first = pki.load_cert(pki.issue(ca_dir, "hv1", "client", **K)["cert"])
    pki.issue(ca_dir, "hv1", "client", force=True, **K)
    listed = x509.load_pem_x509_crl(revocation.crl_pem(ca_dir).encode())
    assert [r.serial_number for r in listed] == [first.serial_number]
    assert "reissued (forced)" in crl.revoked(ca_dir)[0]["reason"]


def test_sweep_retires_only_former_hypervisors(tmp_path):
    ca_dir = str(tmp_path / "libvirt")
    serials = {}
    for minion in ("hv1", "hv2"):
        serials[minion] = {
            f"{pki.load_cert(pki.issue(ca_dir, minion, kind, **K)['cert']).serial_number:x}"
            for kind in ("server", "client")
        }
    swept = revocation.sweep(ca_dir, lambda mid: mid == "hv1")
    assert set(swept) == {"hv2"} and set(swept["hv2"]) == serials["hv2"]
    assert sorted(os.listdir(os.path.join(ca_dir, "minions"))) == ["hv1"]
    [retired] = os.listdir(os.path.join(ca_dir, "retired"))
    assert retired.startswith("hv2-") and "servercert.pem" in os.listdir(os.path.join(ca_dir, "retired", retired))
    assert revocation.sweep(ca_dir, lambda mid: mid == "hv1") == {}  # nothing left to retire
    assert revocation.retire_minion(ca_dir, "gone", "test") == []


def test_revoke_loads_the_ca_of_the_directory(tmp_path):
    ca_dir = str(tmp_path / "libvirt")
    leaf = pki.load_cert(pki.issue(ca_dir, "hv1", "client", **K)["cert"])
    assert revocation.revoke(ca_dir, [leaf], "test") == [f"{leaf.serial_number:x}"]
