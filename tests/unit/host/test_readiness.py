"""saltvirt.host.readiness (through virt.ready / virt.ready_confirm on Salt's real loader): a ready event's
nonce is confirmed once, only by the minion that fired it, and a wrong guess spoils nothing."""

import json
import os
import time

from saltvirt.host import readiness
from tests.support.saltloader import make_minion_mods


def test_a_nonce_is_confirmed_once(tmp_path):
    nonce = readiness.announce(str(tmp_path))
    assert len(nonce) == 32 and (os.stat(tmp_path / readiness.FILE).st_mode & 0o777) == 0o600
    assert readiness.confirm(str(tmp_path), "0" * 32) is False  # a forger's guess ...
    assert readiness.confirm(str(tmp_path), None) is False
    assert readiness.confirm(str(tmp_path), nonce) is True  # ... leaves the real one intact
    assert readiness.confirm(str(tmp_path), nonce) is False  # once
    assert readiness.confirm(str(tmp_path / "nowhere"), nonce) is False


def test_an_old_or_replaced_nonce_confirms_nothing(tmp_path):
    old = readiness.announce(str(tmp_path))
    new = readiness.announce(str(tmp_path))
    assert readiness.confirm(str(tmp_path), old) is False
    kept = json.loads((tmp_path / readiness.FILE).read_text())
    kept["time"] = time.time() - readiness.MAX_AGE - 1
    (tmp_path / readiness.FILE).write_text(json.dumps(kept))
    assert readiness.confirm(str(tmp_path), new) is False
    (tmp_path / readiness.FILE).write_text("not json")
    assert readiness.confirm(str(tmp_path), new) is False


def test_virt_ready_confirm_reads_the_minions_cachedir(tmp_path):
    """virt.ready (it needs a master to send its event: tests/integration/test_events.py) keeps its nonce
    where virt.ready_confirm looks: the minion's cachedir."""
    mods = make_minion_mods(tmp_path, "test:///default")
    nonce = readiness.announce(mods.opts["cachedir"])
    assert mods["virt.ready_confirm"]("f" * 32) is False
    assert mods["virt.ready_confirm"](nonce) is True
    assert mods["virt.ready_confirm"](nonce) is False
