"""saltvirt.envelope: a secret sealed for one minion opens only with that minion's key."""

import hashlib
import json
import os

import pytest
import salt.config
import salt.crypt
import salt.payload
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt import envelope


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


# the master's half: the key store the runner pre-accepts into (saltvirt.fleet, Salt's real key cache) ------
@pytest.fixture
def master_opts(tmp_path):
    """Master opts with a private pki_dir: salt.cache 'localfs_key' writes <pki_dir>/minions/<id> as salt-key does."""
    opts = salt.config.master_config(None)
    opts.update(pki_dir=str(tmp_path / "pki"), cachedir=str(tmp_path / "cache"), sock_dir=str(tmp_path / "sock"))
    for sub in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (tmp_path / "pki" / sub).mkdir(parents=True)
    return opts


def test_preaccepted_key_is_stored_refused_twice_and_removed_only_if_ours(master_opts, tmp_path):
    from saltvirt import fleet

    pub, _priv = envelope.new_keypair()
    other, _ = envelope.new_keypair()
    fleet.preaccept(master_opts, "web1", pub)
    assert (tmp_path / "pki" / "minions" / "web1").read_text() == pub  # exactly where salt-key -L looks
    assert fleet.key_state(master_opts, "web1") == "accepted" and fleet.accepted_pub(master_opts, "web1") == pub
    with pytest.raises(SaltInvocationError, match="already has a accepted key for 'web1'"):
        fleet.preaccept(master_opts, "web1", other)
    assert fleet.remove_key(master_opts, "web1", other) is False  # not ours: left alone
    assert fleet.key_state(master_opts, "web1") == "accepted"
    assert fleet.remove_key(master_opts, "web1", pub) is True
    assert fleet.key_state(master_opts, "web1") is None and not (tmp_path / "pki" / "minions" / "web1").exists()
    (tmp_path / "pki" / "minions_pre" / "web2").write_text(other)  # a real minion waiting for acceptance
    with pytest.raises(SaltInvocationError, match="already has a pending key for 'web2'"):
        fleet.preaccept(master_opts, "web2", pub)
    assert fleet.remove_key(master_opts, "web2", pub) is False and (tmp_path / "pki" / "minions_pre" / "web2").exists()
    with pytest.raises(CommandExecutionError, match="no accepted key for 'web2'"):
        fleet.accepted_pub(master_opts, "web2")  # never seal for a key the master did not accept
    with pytest.raises(SaltInvocationError, match="not a valid minion id"):
        fleet.key_state(master_opts, "../etc")


def test_a_key_the_hypervisor_did_not_seed_is_taken_back(master_opts):
    from saltvirt import fleet

    pub, _priv = envelope.new_keypair()
    fp = hashlib.sha256(pub.encode()).hexdigest()
    key = {"minion_id": "web1", "state": "accepted", "fingerprint": fp}
    fleet.preaccept(master_opts, "web1", pub)
    assert fleet._check_seeded_key(
        master_opts, key, pub, {"seed": {"backend": "loop"}, "key": {"fingerprint": fp}}
    ) == (key, [])
    cases = [
        ({"seed": None}, "did not seed"),
        ({"seed": {"backend": "loop"}, "key": {"fingerprint": "ab" * 32}}, "seeded another key"),
    ]
    for ret, why in cases:
        if not fleet.key_state(master_opts, "web1"):
            fleet.preaccept(master_opts, "web1", pub)
        new, warnings = fleet._check_seeded_key(master_opts, key, pub, ret)
        assert new["state"] == "removed" and why in warnings[0] and fleet.key_state(master_opts, "web1") is None
