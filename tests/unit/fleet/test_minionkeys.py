"""saltvirt.fleet.minionkeys: the master's key store the runner pre-accepts into (Salt's real key cache)."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import minionkeys
from saltvirt.pki import envelope
from tests.support.keystore import master_key_store_opts


@pytest.fixture
def master_opts(tmp_path):
    return master_key_store_opts(tmp_path)


def test_preaccepted_key_is_stored_refused_twice_and_removed_only_if_ours(master_opts, tmp_path):
    pub, _priv = envelope.new_keypair()
    other, _ = envelope.new_keypair()
    minionkeys.preaccept(master_opts, "web1", pub)
    assert (tmp_path / "pki" / "minions" / "web1").read_text() == pub  # exactly where salt-key -L looks
    assert (
        minionkeys.key_state(master_opts, "web1") == "accepted" and minionkeys.accepted_pub(master_opts, "web1") == pub
    )
    with pytest.raises(SaltInvocationError, match="already has a accepted key for 'web1'"):
        minionkeys.preaccept(master_opts, "web1", other)
    assert minionkeys.remove_key(master_opts, "web1", other) is False  # not ours: left alone
    assert minionkeys.key_state(master_opts, "web1") == "accepted"
    assert minionkeys.remove_key(master_opts, "web1", pub) is True
    assert minionkeys.key_state(master_opts, "web1") is None and not (tmp_path / "pki" / "minions" / "web1").exists()
    (tmp_path / "pki" / "minions_pre" / "web2").write_text(other)  # a real minion waiting for acceptance
    with pytest.raises(SaltInvocationError, match="already has a pending key for 'web2'"):
        minionkeys.preaccept(master_opts, "web2", pub)
    assert (
        minionkeys.remove_key(master_opts, "web2", pub) is False
        and (tmp_path / "pki" / "minions_pre" / "web2").exists()
    )
    with pytest.raises(CommandExecutionError, match="no accepted key for 'web2'"):
        minionkeys.accepted_pub(master_opts, "web2")  # never seal for a key the master did not accept
    with pytest.raises(SaltInvocationError, match="not a valid minion id"):
        minionkeys.key_state(master_opts, "../etc")


def test_delete_key_removes_any_state_and_says_which(master_opts, tmp_path):
    pub, _priv = envelope.new_keypair()
    (tmp_path / "pki" / "minions_pre" / "web3").write_text(pub)
    assert minionkeys.delete_key(master_opts, "web3") == "pending"
    assert not (tmp_path / "pki" / "minions_pre" / "web3").exists()
    assert minionkeys.delete_key(master_opts, "web3") is None  # nothing left: nothing to say
    minionkeys.preaccept(master_opts, "web4", pub)
    assert minionkeys.delete_key(master_opts, "web4") == "accepted"
    assert minionkeys.key_state(master_opts, "web4") is None


def test_purge_deletes_only_the_recorded_key(master_opts):
    """salt-run virt.purge: the master key goes only if it is the one virt.init seeded into the VM (its
    id and sha256 in the domain's <metadata>); anything else is reported and left alone."""
    import hashlib

    pub = envelope.new_keypair()[0]
    minionkeys.preaccept(master_opts, "web1", pub)
    other = {"id": "web1", "key_sha256": "0" * 64}
    assert minionkeys.delete_recorded_key(master_opts, "web1", None)["key_deleted"] is False
    assert "left alone" in minionkeys.delete_recorded_key(master_opts, "web1", other)["key_note"]
    wrong_id = minionkeys.delete_recorded_key(master_opts, "web1", dict(other, id="db1"), minion_id="web1")
    assert wrong_id["key_deleted"] is False and "not web1" in wrong_id["key_note"]
    assert minionkeys.key_state(master_opts, "web1") == "accepted"
    mine = {"id": "web1", "key_sha256": hashlib.sha256(pub.encode()).hexdigest()}
    assert minionkeys.delete_recorded_key(master_opts, "web1", mine) == {"key_deleted": "accepted"}
    assert minionkeys.key_state(master_opts, "web1") is None
