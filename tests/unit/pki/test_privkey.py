"""saltvirt.pki.privkey: the host's own private keys, read back without cryptography's per-load check."""

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from saltvirt.pki import privkey


def _pem(key, password=None):
    algo = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, algo)


@pytest.mark.parametrize(
    "make", [lambda: rsa.generate_private_key(65537, 2048), lambda: ec.generate_private_key(ec.SECP256R1())]
)
def test_the_key_read_back_is_the_key_written_and_signs(make):
    key = make()
    loaded = privkey.load_own(_pem(key))
    assert loaded.public_key().public_numbers() == key.public_key().public_numbers()
    if isinstance(key, rsa.RSAPrivateKey):
        sig = loaded.sign(b"answer", padding.PKCS1v15(), hashes.SHA256())
        key.public_key().verify(sig, b"answer", padding.PKCS1v15(), hashes.SHA256())  # raises if wrong
    else:
        sig = loaded.sign(b"answer", ec.ECDSA(hashes.SHA256()))
        key.public_key().verify(sig, b"answer", ec.ECDSA(hashes.SHA256()))


def test_a_file_that_is_no_key_or_is_encrypted_is_refused():
    with pytest.raises(ValueError):
        privkey.load_own(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(TypeError):  # these keys are never encrypted: a password-protected one is not ours
        privkey.load_own(_pem(ec.generate_private_key(ec.SECP256R1()), b"secret"))
