"""saltvirt.pki.castore: the files, lock and signature check the CA and its CRL share."""

import threading

from saltvirt.pki import ca as pki
from saltvirt.pki import castore
from tests.support.pkitools import K, mode


def test_write_creates_private_parents_with_the_final_mode(tmp_path):
    path = tmp_path / "a" / "b" / "key.pem"
    castore.write(str(path), b"secret", 0o600)
    assert castore.read(str(path)) == b"secret"
    assert mode(path) == 0o600 and mode(tmp_path / "a" / "b") == 0o700
    (tmp_path / "loose").mkdir(mode=0o755)
    castore.mkdir_private(str(tmp_path / "loose"))
    assert mode(tmp_path / "loose") == 0o700  # an existing directory is tightened


def test_locked_excludes_a_second_holder(tmp_path):
    order = []
    with castore.locked(str(tmp_path / "d")):
        worker = threading.Thread(target=lambda: castore.locked(str(tmp_path / "d")).__enter__() or order.append("2"))
        worker.start()
        worker.join(0.3)
        order.append("1")  # the second holder cannot have entered yet
    worker.join(5)
    assert order == ["1", "2"] and mode(tmp_path / "d" / ".lock") == 0o600


def test_signed_by_checks_issuer_and_signature(tmp_path):
    ca_cert, _ = pki.ensure_ca(str(tmp_path / "one"), **K)
    other, _ = pki.ensure_ca(str(tmp_path / "two"), **K)  # same subject, another key
    leaf = pki.load_cert(pki.issue(str(tmp_path / "one"), "hv1", "client", **K)["cert"])
    assert castore.signed_by(leaf, ca_cert)
    assert not castore.signed_by(leaf, other)
    assert not castore.signed_by(ca_cert, leaf)
