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


def test_the_boot_id_is_this_boots(tmp_path):
    with open(readiness.BOOT_ID, encoding="ascii") as fh:
        assert readiness.boot_id() == fh.read().strip() != ""
    (tmp_path / "boot_id").write_text("abc\n")
    assert readiness.boot_id(str(tmp_path / "boot_id")) == "abc"
    mods = make_minion_mods(tmp_path, "test:///default")
    assert mods["virt.boot_id"]() == readiness.boot_id()


def test_virt_host_states_returns_a_failed_state_as_data(tmp_path):
    """salt-run virt.roll asks virt.host_states through virt.answer, which signs an error string instead of the
    return when the call leaves a retcode: a failed state must come back as its state results (with the retcode
    beside them), so the roll can say which ids failed. Salt's real state.apply over a local file_roots."""
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "good.sls").write_text("ok:\n  test.succeed_with_changes: []\n")
    (roots / "bad.sls").write_text("broken:\n  test.fail_without_changes:\n    - comment: 'E: dpkg was interrupted'\n")
    extra = {"file_roots": {"base": [str(roots)]}, "state_events": False}
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra=extra)
    out = mods["virt.host_states"]("bad")
    (res,) = out["ret"].values()
    assert out["retcode"] == 2 and res["result"] is False and res["comment"] == "E: dpkg was interrupted"
    assert mods.pack["__context__"].get("retcode", 0) == 0  # what virt.answer reads: nothing left
    out = mods["virt.host_states"](["good"], test=True)
    (res,) = out["ret"].values()
    assert out["retcode"] == 0 and res["result"] is None  # Salt's dry run: would change


def test_the_engines_beat_counts_only_fresh_connected_and_from_this_boot(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    cache, path = str(tmp_path / "cache"), str(boot)
    assert readiness.engine_state(cache, path=path) == {
        "ok": False,
        "why": "the events engine has not beaten yet (not started, or not since it was updated)",
    }
    readiness.engine_beat(cache, "virt_events", True, path=path)
    assert (os.stat(tmp_path / "cache" / readiness.ENGINE_FILE).st_mode & 0o777) == 0o600
    assert readiness.engine_state(cache, path=path)["ok"] is True
    later = time.time() + readiness.BEAT_STALE + 1
    assert "stopped or hung" in readiness.engine_state(cache, now=later, path=path)["why"]
    boot.write_text("boot-2\n")  # the host rebooted: the beat from before proves nothing
    assert readiness.engine_state(cache, path=path)["why"] == "the events engine has not beaten since this boot"
    readiness.engine_beat(cache, "virt_events", False, path=path)
    assert (
        readiness.engine_state(cache, path=path)["why"] == "the events engine (virt_events) runs but has lost libvirt"
    )
