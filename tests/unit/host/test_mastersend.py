"""saltvirt.host.mastersend: what the engine's sender does before any master answers."""

import pytest
import salt.config
from salt.exceptions import CommandExecutionError

from saltvirt.host import mastersend


def test_master_sender_never_makes_the_minions_key(tmp_path):
    """The engine runs in its own process and starts before the minion signs in: a sender that
    reached for the master first made a key of its own while the minion made another, and the master
    (auto_accept) took one and denied the minion's, which then exited (CI, a fresh hypervisor minion).
    Until the minion's key is there, the sender waits, then says so; it never writes one. Real Salt
    channel code; the master URI is a closed port (nothing has to answer)."""
    pki = tmp_path / "pki"
    pki.mkdir()
    opts = salt.config.minion_config(None)
    opts.update(id="h1", pki_dir=str(pki), cachedir=str(tmp_path / "cache"), master_uri="tcp://127.0.0.1:9")
    sender = mastersend.MasterSender(opts, timeout=1)
    with pytest.raises(CommandExecutionError, match="has no key yet"):
        sender("salt/virt/h1/reaped", {"removed": []})
    assert list(pki.iterdir()) == []
