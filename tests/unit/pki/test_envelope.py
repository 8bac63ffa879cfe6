"""saltvirt.pki.envelope: a secret sealed for one minion opens only with that minion's key."""

import json
import os

import pytest
import salt.crypt
import salt.payload
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.pki import envelope


def minion_pki(tmp_path, name):
    """A minion pki_dir exactly as Salt writes it (salt.crypt.gen_keys: minion.pem / minion.pub)."""
    pki = tmp_path / name
    pki.mkdir()
    priv, pub = salt.crypt.gen_keys(2048)
    (pki / "minion.pem").write_text(priv)
    (pki / "minion.pub").write_text(pub)
    return pki, pub


@pytest.fixture
def secret():
    return envelope.new_keypair()[1]  # a new VM minion's private key, what the runner seals


def test_only_the_recipient_opens_it(tmp_path, secret):
    hv1, hv1_pub = minion_pki(tmp_path, "hv1")
    hv2, _ = minion_pki(tmp_path, "hv2")
    sealed = envelope.seal(hv1_pub, secret, context="web1")
    assert envelope.unseal(sealed, str(hv1)) == secret
    with pytest.raises(CommandExecutionError, match="sealed for another minion"):
        envelope.unseal(sealed, str(hv2))


def test_envelope_is_plain_data_without_the_secret(tmp_path, secret):
    _pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret)
    # it travels through Salt's msgpack publication and lands in the JSON job cache
    assert salt.payload.loads(salt.payload.dumps(sealed)) == sealed
    text = json.dumps(sealed)
    assert "PRIVATE KEY" not in text
    body = "".join(secret.splitlines()[1:-1])
    assert body[:40] not in text and body[-40:] not in text
    assert sealed["alg"] == envelope.ALG and sealed["kid"] == envelope.fingerprint(pub)
    assert envelope.is_envelope(sealed) and not envelope.is_envelope({"ct": "x"})


def test_two_seals_of_the_same_secret_differ(tmp_path, secret):
    _pki, pub = minion_pki(tmp_path, "hv1")
    a, b = envelope.seal(pub, secret), envelope.seal(pub, secret)
    assert a["ct"] != b["ct"] and a["ek"] != b["ek"] and a["nonce"] != b["nonce"]


@pytest.mark.parametrize("field", ["ct", "nonce", "ek", "kid", "context"])
def test_tampering_is_detected(tmp_path, secret, field):
    pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret, context="web1")
    value = sealed[field]
    if field == "kid":  # claiming another recipient: refused before any decryption
        sealed[field] = "0" * 64
        with pytest.raises(CommandExecutionError, match="sealed for another minion"):
            envelope.unseal(sealed, str(pki))
        return
    if field == "context":
        sealed[field] = "web2"
    else:
        raw = bytearray(envelope._unb64(value, field))
        raw[len(raw) // 2] ^= 0x01
        sealed[field] = envelope._b64(bytes(raw))
    with pytest.raises(CommandExecutionError, match="corrupt or was tampered with"):
        envelope.unseal(sealed, str(pki))


def test_pkcs1_and_spki_spellings_have_one_fingerprint(tmp_path):
    from cryptography.hazmat.primitives import serialization

    _pki, spki = minion_pki(tmp_path, "hv1")
    key = serialization.load_pem_public_key(spki.encode())
    pkcs1 = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1).decode()
    assert "BEGIN RSA PUBLIC KEY" in pkcs1
    assert envelope.fingerprint(pkcs1) == envelope.fingerprint(spki)


def test_bad_inputs_have_clear_errors(tmp_path, secret):
    pki, pub = minion_pki(tmp_path, "hv1")
    with pytest.raises(SaltInvocationError, match="not a PEM public key"):
        envelope.seal("not a key", secret)
    with pytest.raises(SaltInvocationError, match="empty secret"):
        envelope.seal(pub, "")
    with pytest.raises(SaltInvocationError, match="not an envelope"):
        envelope.unseal({"ct": "abc"}, str(pki))
    sealed = envelope.seal(pub, secret)
    with pytest.raises(SaltInvocationError, match="unsupported envelope"):
        envelope.unseal(dict(sealed, v=99), str(pki))
    with pytest.raises(SaltInvocationError, match="not valid base64"):
        envelope.unseal(dict(sealed, ct="***"), str(pki))
    with pytest.raises(CommandExecutionError, match="minion.pem does not exist"):
        envelope.unseal(sealed, str(tmp_path / "nowhere"))


def test_new_keypair_is_a_salt_minion_keypair(tmp_path):
    pub, priv = envelope.new_keypair()
    assert pub.startswith("-----BEGIN PUBLIC KEY-----") and priv.startswith("-----BEGIN RSA PRIVATE KEY-----")
    path = tmp_path / "minion.pem"
    path.write_text(priv)
    os.chmod(path, 0o400)
    # Salt itself loads it (what the new minion will do at first start) and the halves match
    loaded = salt.crypt.get_rsa_key(str(path), None)
    assert envelope.fingerprint(loaded.public_key()) == envelope.fingerprint(pub)
    assert loaded.key_size == 2048
