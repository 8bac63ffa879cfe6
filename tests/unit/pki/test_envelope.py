"""saltvirt.pki.envelope: a secret sealed for one minion opens only with that minion's key, only for the
purpose (context) and job it was sealed for, and only once."""

import json
import os

import pytest
import salt.crypt
import salt.payload
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.pki import envelope
from tests.support import keystore


def minion_pki(tmp_path, name):
    """A minion pki_dir exactly as Salt writes it (salt.crypt.gen_keys: minion.pem / minion.pub)."""
    pki = tmp_path / name
    pki.mkdir()
    priv, pub = salt.crypt.gen_keys(2048)
    (pki / "minion.pem").write_text(priv)
    (pki / "minion.pub").write_text(pub)
    return pki, pub


CTX, JOB = "web1/priv_key", "20261125203000123456"


@pytest.fixture
def secret():
    return keystore.keypair("sealed VM minion")[1]  # a new VM minion's private key, what the runner seals


def test_only_the_recipient_opens_it(tmp_path, secret):
    hv1, hv1_pub = minion_pki(tmp_path, "hv1")
    hv2, _ = minion_pki(tmp_path, "hv2")
    sealed = envelope.seal(hv1_pub, secret, CTX, JOB)
    assert envelope.unseal(sealed, str(hv1), CTX, JOB) == secret
    with pytest.raises(CommandExecutionError, match="sealed for another minion"):
        envelope.unseal(sealed, str(hv2), CTX, JOB)


def test_envelope_is_plain_data_without_the_secret(tmp_path, secret):
    _pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret, CTX, JOB)
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
    a, b = envelope.seal(pub, secret, CTX, JOB), envelope.seal(pub, secret, CTX, JOB)
    assert a["ct"] != b["ct"] and a["ek"] != b["ek"] and a["nonce"] != b["nonce"] and a["id"] != b["id"]


@pytest.mark.parametrize("field", ["ct", "nonce", "ek", "kid", "id", "iat"])
def test_tampering_is_detected(tmp_path, secret, field):
    pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret, CTX, JOB)
    value = sealed[field]
    if field == "kid":  # claiming another recipient: refused before any decryption
        sealed[field] = "0" * 64
        with pytest.raises(CommandExecutionError, match="sealed for another minion"):
            envelope.unseal(sealed, str(pki), CTX, JOB)
        return
    if field == "iat":
        sealed[field] = value - 1
    else:
        raw = bytearray(envelope._unb64(value, field))
        raw[len(raw) // 2] ^= 0x01
        sealed[field] = envelope._b64(bytes(raw))
    with pytest.raises(CommandExecutionError, match="corrupt or was tampered with"):
        envelope.unseal(sealed, str(pki), CTX, JOB)


def test_another_purpose_is_refused_without_the_secret(tmp_path, secret):
    """A VM's sealed private key passed as another VM's console password (issue 23): never opened."""
    pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret, CTX, JOB)
    for context in ("web2/graphics", "web1/graphics", "web2/priv_key"):
        with pytest.raises(CommandExecutionError) as err:
            envelope.unseal(sealed, str(pki), context, JOB)
        assert str(err.value) == envelope.PURPOSE_REFUSED.format(context=context)
    # rewriting the context to match is caught by the authentication tag
    with pytest.raises(CommandExecutionError, match="corrupt or was tampered with"):
        envelope.unseal(dict(sealed, context="web2/graphics"), str(pki), "web2/graphics", JOB)


def test_another_job_is_refused(tmp_path, secret):
    pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret, CTX, JOB)
    with pytest.raises(CommandExecutionError) as err:
        envelope.unseal(sealed, str(pki), CTX, "20261125203000999999")
    assert str(err.value) == envelope.JOB_REFUSED
    with pytest.raises(CommandExecutionError, match="corrupt or was tampered with"):
        envelope.unseal(dict(sealed, job="20261125203000999999"), str(pki), CTX, "20261125203000999999")


def test_an_envelope_opens_once(tmp_path, secret):
    pki, pub = minion_pki(tmp_path, "hv1")
    cache = str(tmp_path / "cache" / "opened")
    sealed = envelope.seal(pub, secret, CTX, JOB)
    assert envelope.unseal(sealed, str(pki), CTX, JOB, replay_cache=cache) == secret
    with pytest.raises(CommandExecutionError) as err:
        envelope.unseal(sealed, str(pki), CTX, JOB, replay_cache=cache)
    assert str(err.value) == envelope.REPLAY_REFUSED and secret not in str(err.value)
    other = envelope.seal(pub, secret, CTX, JOB)  # another envelope still opens
    assert envelope.unseal(other, str(pki), CTX, JOB, replay_cache=cache) == secret
    assert os.stat(cache).st_mode & 0o777 == 0o600


def test_expired_or_future_envelopes_are_refused(tmp_path, secret, monkeypatch):
    pki, pub = minion_pki(tmp_path, "hv1")
    sealed = envelope.seal(pub, secret, CTX, JOB)
    for shift in (envelope.MAX_AGE + 60, -(envelope.CLOCK_SKEW + 60)):
        now = sealed["iat"] + shift
        monkeypatch.setattr(envelope.time, "time", lambda now=now: now)
        with pytest.raises(CommandExecutionError) as err:
            envelope.unseal(sealed, str(pki), CTX, JOB)
        assert str(err.value) == envelope.EXPIRED_REFUSED


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
        envelope.seal("not a key", secret, CTX, JOB)
    with pytest.raises(SaltInvocationError, match="empty secret"):
        envelope.seal(pub, "", CTX, JOB)
    with pytest.raises(SaltInvocationError, match="without a context and a job"):
        envelope.seal(pub, secret, "", JOB)
    with pytest.raises(SaltInvocationError, match="not an envelope"):
        envelope.unseal({"ct": "abc"}, str(pki), CTX, JOB)
    sealed = envelope.seal(pub, secret, CTX, JOB)
    with pytest.raises(SaltInvocationError, match="unsupported envelope"):
        envelope.unseal(dict(sealed, v=1), str(pki), CTX, JOB)
    with pytest.raises(SaltInvocationError, match="not valid base64"):
        envelope.unseal(dict(sealed, ct="***"), str(pki), CTX, JOB)
    with pytest.raises(CommandExecutionError, match="minion.pem does not exist"):
        envelope.unseal(sealed, str(tmp_path / "nowhere"), CTX, JOB)


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


def test_keypair_maker_hands_over_the_pair_or_the_error(tmp_path):
    """The pair made in a thread is a minion key pair as new_keypair's; a failed generation raises in the
    caller when it asks for the pair (not lost in the thread)."""
    pub, priv = envelope.keypair_maker()()
    path = tmp_path / "minion.pem"
    path.write_text(priv)
    assert envelope.fingerprint(salt.crypt.get_rsa_key(str(path), None).public_key()) == envelope.fingerprint(pub)
    failed = envelope.keypair_maker(bits=64)  # below what the library makes
    with pytest.raises(ValueError, match="key_size"):
        failed()
