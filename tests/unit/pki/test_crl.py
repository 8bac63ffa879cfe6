"""saltvirt.pki.crl: the CRL kept given the CA's certificate and key (ca_dir-level: test_revocation.py).

gnutls' certtool judges the CRL: libvirtd reads it with gnutls."""

import subprocess

from cryptography import x509

from saltvirt.pki import ca as pki
from saltvirt.pki import crl
from tests.support.pkitools import K, mode


def _ca(tmp_path):
    ca_dir = str(tmp_path / "libvirt")
    cert, key = pki.ensure_ca(ca_dir, **K)
    return ca_dir, cert, key


def _leaf(ca_dir, minion="hv1", kind="client"):
    return pki.load_cert(pki.issue(ca_dir, minion, kind, **K)["cert"])


def test_revoke_lists_the_serial_once_and_skips_foreign_certificates(tmp_path):
    ca_dir, cert, key = _ca(tmp_path)
    leaf = _leaf(ca_dir)
    foreign_dir = str(tmp_path / "other")
    pki.ensure_ca(foreign_dir, **K)
    foreign = _leaf(foreign_dir)
    assert crl.revoke(ca_dir, cert, key, [leaf, foreign], "test") == [f"{leaf.serial_number:x}"]
    assert crl.revoke(ca_dir, cert, key, [leaf], "again") == []  # already listed
    [entry] = crl.revoked(ca_dir)
    assert entry["serial"] == f"{leaf.serial_number:x}" and entry["reason"] == "test"
    assert mode(tmp_path / "libvirt" / "crl" / "revoked.json") == 0o600
    listed = x509.load_pem_x509_crl(crl.current(ca_dir, cert, key).encode())
    assert {r.serial_number for r in listed} == {leaf.serial_number}
    assert listed.is_signature_valid(cert.public_key())


def test_current_is_rebuilt_when_missing_or_signed_by_another_ca(tmp_path):
    ca_dir, cert, key = _ca(tmp_path)
    pem = crl.current(ca_dir, cert, key)
    assert crl.current(ca_dir, cert, key) == pem  # fresh: reused as it is
    (tmp_path / "libvirt" / "crl" / "crl.pem").unlink()
    assert "BEGIN X509 CRL" in crl.current(ca_dir, cert, key)
    new_cert, new_key = pki.ensure_ca(str(tmp_path / "rotated"), **K)
    rebuilt = x509.load_pem_x509_crl(crl.current(ca_dir, new_cert, new_key).encode())
    assert rebuilt.is_signature_valid(new_cert.public_key())


def test_certtool_accepts_the_crl_and_rejects_the_revoked_certificate(tmp_path):
    ca_dir, cert, key = _ca(tmp_path)
    pem = pki.issue(ca_dir, "hv1", "client", **K)["cert"]
    crl.revoke(ca_dir, cert, key, [pki.load_cert(pem)], "test")
    (tmp_path / "ca.pem").write_text(pki.trusted_bundle(ca_dir))
    (tmp_path / "crl.pem").write_text(crl.current(ca_dir, cert, key))
    (tmp_path / "leaf.pem").write_text(pem)
    out = subprocess.run(
        ["certtool", "--verify", "--load-ca-certificate", str(tmp_path / "ca.pem"), "--load-crl",
         str(tmp_path / "crl.pem"), "--infile", str(tmp_path / "leaf.pem")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "revoked" in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
