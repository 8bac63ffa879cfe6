"""saltvirt.fleet.silence: a hypervisor the runner reported down is remembered across calls (issue 33), and what
may clear it (only a reply it signed)."""

import time

from saltvirt.fleet import publish as fleet
from saltvirt.fleet import silence
from tests.unit.fleet.test_replies import _Fleet, _forgeries


def _down_twice(tmp_path, memory, second_forge=None):
    """hv2 silent in two calls on one master (one cache): the second call's answer for hv2."""
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv3": {"c": 3}}, silent={"hv2"})
    cfg = fleet.config(fleet_.opts, timeout=0.05, gather_job_timeout=0.05, down_after=0.5, down_memory=memory)
    first, _jid = fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info")
    assert first["hv2"]["status"] == "down" and "no sign of life for 0.5 s" in first["hv2"]["error"], first
    fleet_.forge = second_forge
    second, _jid = fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info")
    assert second["hv1"]["status"] == second["hv3"]["status"] == "up", second
    return second["hv2"]


def test_a_hypervisor_reported_down_is_given_up_after_one_unanswered_check_by_the_next_call(tmp_path):
    """Issue 33: every call during an outage waited the whole down_after on the dead host; a host reported down
    within down_memory s is given up after one unanswered job check (timeout + gather_job_timeout)."""
    hv2 = _down_twice(tmp_path, memory=300)
    assert hv2["status"] == "down", hv2
    assert "no sign of life for 0.05 s after the first 0.05 s, and reported down 0 s ago" in hv2["error"], hv2


def test_the_memory_of_a_down_hypervisor_can_be_turned_off(tmp_path):
    hv2 = _down_twice(tmp_path, memory=0)
    assert hv2["status"] == "down" and "no sign of life for 0.5 s" in hv2["error"], hv2


def test_only_a_reply_the_suspect_signed_clears_it_not_a_forged_one(tmp_path):
    """A guest that forges hv2's answer does not make the runner wait the full down_after for it again."""
    hv2 = _down_twice(tmp_path, memory=300, second_forge=_forgeries(tmp_path)["plain"])
    assert hv2["status"] == "down" and "reported down" in hv2["error"] and "not believed" in hv2["error"], hv2


def test_a_suspect_that_answers_is_up_and_is_waited_for_in_full_when_silent_again(tmp_path):
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv3": {"c": 3}}, silent={"hv2"})
    cfg = fleet.config(fleet_.opts, timeout=0.05, gather_job_timeout=0.05, down_after=0.5)
    assert fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info")[0]["hv2"]["status"] == "down"
    back = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv2": {"b": 2}, "hv3": {"c": 3}})  # hv2 is back, same master
    back.opts = fleet_.opts
    got, _jid = fleet.Fleet(fleet_.opts, cfg, back).run("virt.full_info")
    assert got["hv2"] == {"status": "up", "ret": {"b": 2}}, got
    got, _jid = fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info")  # silent again: a full wait
    assert got["hv2"]["status"] == "down" and "no sign of life for 0.5 s" in got["hv2"]["error"], got


def test_the_memory_is_a_file_per_host_in_the_masters_cachedir_and_expires(tmp_path):
    opts = {"cachedir": str(tmp_path)}
    silence.remember(opts, "hv1")
    assert (tmp_path / "salt-virt" / "down" / "hv1").is_file()
    assert set(silence.recent(opts, ["hv1", "hv2"], 300)) == {"hv1"}
    assert silence.recent(opts, ["hv1"], 0) == {}  # off
    (tmp_path / "salt-virt" / "down" / "hv1").write_text(repr(time.time() - 301))
    assert silence.recent(opts, ["hv1"], 300) == {}  # older than down_memory
    silence.forget(opts, "hv1")
    silence.forget(opts, "hv1")  # twice: nothing to forget is fine
    assert silence.recent(opts, ["hv1"], 300) == {}


def test_an_id_that_is_no_plain_file_name_is_never_a_path(tmp_path):
    opts = {"cachedir": str(tmp_path / "cache")}
    for bad in ("../escape", "/etc/passwd", ".hidden", ""):
        silence.remember(opts, bad)
        silence.forget(opts, bad)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "cache" / "salt-virt" / "down" / ".hidden").exists()


def test_a_file_put_there_by_hand_under_a_name_remember_never_writes_is_no_suspect(tmp_path):
    opts = {"cachedir": str(tmp_path)}
    (tmp_path / "salt-virt" / "down").mkdir(parents=True)
    (tmp_path / "salt-virt" / "down" / ".hv1").write_text(repr(time.time()))
    assert silence.recent(opts, [".hv1"], 300) == {}
