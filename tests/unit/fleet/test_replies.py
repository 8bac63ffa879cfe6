"""saltvirt.fleet.replies: what the runner believes of the hypervisors' answers to one publication (only what
each signed for this request: issue 34 #1), and how long it waits for a slow one (issue 33)."""

import time

import pytest

from saltvirt.fleet import publish as fleet
from saltvirt.pki import answers, envelope
from tests.support import signedfleet


class _Fleet(signedfleet.SigningClient):
    """Three hypervisors signing with their own keys (tests/support/signedfleet.py), answering ``virt.full_info``
    from ``answers``, and whatever ``forge`` puts on the bus in their names before their real answers."""

    def __init__(self, tmp_path, answers_, forge=None, silent=()):
        super().__init__({"virt.full_info": answers_}, busy={"hv1", "hv2", "hv3"} - set(silent))
        self.opts = signedfleet.fleet_opts(tmp_path, ["hv1", "hv2", "hv3"])
        self.forge, self.answers_ = forge, answers_
        self.kinds = []

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        jid = jid or str(30260000000000000000 + len(self.kinds))
        self.kinds.append(kwarg["fun"])
        if self.forge and kwarg["fun"] != answers.JOB_CHECK:
            for mid in tgt:
                self.event.queue.append({"tag": f"salt/job/{jid}/ret/{mid}", "data": self.forge(mid, kwarg)})
        return super().run_job(tgt, fun, arg, tgt_type, timeout=timeout, kwarg=kwarg, listen=listen, jid=jid)


def test_run_believes_only_answers_each_hypervisor_signed_for_this_request(tmp_path):
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv2": {"b": 2}, "hv3": {"c": 3}})
    got, jid = fleet.Fleet(fleet_.opts, client=fleet_).run("virt.full_info")
    assert jid and got == {m: {"status": "up", "ret": r} for m, r in fleet_.answers_.items()}
    assert fleet_.kinds == ["virt.full_info"]  # everyone answered: no job check


def _forgeries(tmp_path):
    """What a guest's root can put on the bus in a hypervisor's name (issue 34 #1)."""
    _other_pub, other_priv = envelope.new_keypair()
    (tmp_path / "guest-pki").mkdir()
    (tmp_path / "guest-pki" / "minion.pem").write_text(other_priv)

    def plain(mid, kwarg):  # an unsigned return, as Salt's own would look (or one remapped by resource_id)
        return {"id": mid, "return": {"web1": {"tenant": "attacker"}}, "retcode": 0}

    def own_key(mid, kwarg):  # signed, but with the guest's own key
        return {"id": mid, "return": answers.sign(str(tmp_path / "guest-pki"), mid, kwarg["fun"], kwarg["nonce"], {})}

    def old_nonce(mid, kwarg):  # a real hypervisor's signature from another request
        pki = signedfleet.minion_key(mid)[1]
        return {"id": mid, "return": answers.sign(pki, mid, kwarg["fun"], "n" + "0" * 32, {})}

    return {"plain": plain, "own_key": own_key, "old_nonce": old_nonce}


@pytest.mark.parametrize("how", ["plain", "own_key", "old_nonce"])
def test_a_forged_answer_in_a_hypervisors_name_is_ignored_and_the_real_one_counts(tmp_path, how):
    fleet_ = _Fleet(tmp_path, {"hv1": {"real": 1}, "hv2": {"real": 2}, "hv3": {"real": 3}})
    fleet_.forge = _forgeries(tmp_path)[how]  # each forged answer is on the bus before the real one
    got, _jid = fleet.Fleet(fleet_.opts, client=fleet_).run("virt.full_info")
    assert got == {m: {"status": "up", "ret": r} for m, r in fleet_.answers_.items()}


def test_a_hypervisor_that_only_forgers_speak_for_is_down_and_says_why(tmp_path):
    fleet_ = _Fleet(tmp_path, {"hv1": {"real": 1}, "hv3": {"real": 3}}, silent={"hv2"})
    fleet_.forge = _forgeries(tmp_path)["plain"]
    cfg = fleet.config(fleet_.opts, timeout=0.05, gather_job_timeout=0.05, down_after=0.2)
    got, _jid = fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info")
    assert got["hv1"]["status"] == got["hv3"]["status"] == "up"
    assert got["hv2"]["status"] == "down"
    assert "its job checks went unanswered" in got["hv2"]["error"] and "not believed" in got["hv2"]["error"]


def test_a_slow_hypervisor_that_says_its_job_runs_is_waited_for_until_max_wait(tmp_path):
    """Issue 33: a loaded hypervisor answers late; while it says (signed) that the job runs, it is not down."""
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv3": {"c": 3}})  # hv2 runs the job, and answers checks
    # checks every 0.3 s, down after 2 s of silence: a loaded test process that sleeps a while still reads the
    # answers before it would give hv2 up
    cfg = fleet.config(fleet_.opts, timeout=0.3, gather_job_timeout=0.3, down_after=2)
    got, _jid = fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info", max_wait=3)
    assert got["hv2"]["status"] == "timeout"  # not down: it may still finish
    assert fleet_.kinds.count(answers.JOB_CHECK) >= 3  # asked again and again, each time answered


class _CountingBus(signedfleet.Bus):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def get_event(self, *args, **kwargs):
        self.reads += 1
        return super().get_event(*args, **kwargs)


class _LateReader(signedfleet.Bus):
    """A loaded runner: each blocking read of the bus returns ``lag`` seconds late."""

    def __init__(self, lag):
        super().__init__()
        self.lag = lag

    def get_event(self, tag="", wait=0, no_block=False, **kw):
        if not no_block:
            time.sleep(self.lag)
        return super().get_event(tag=tag, no_block=True)


def test_answers_already_on_the_bus_are_read_before_a_hypervisor_is_given_up(tmp_path):
    """Every hypervisor's signed answer is on the bus, but the runner reads them late (a loaded machine) and the
    quiet bound (timeout + down_after: 0.15 s here) passes before it reaches the last one: it answered, so it is
    up, not down (run U: test_balancer's rounds lost their moves this way at load ~10)."""
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv2": {"b": 2}, "hv3": {"c": 3}})
    fleet_.event = _LateReader(lag=0.1)
    got, _jid = fleet.Fleet(fleet_.opts, client=fleet_).run("virt.full_info")
    assert got == {m: {"status": "up", "ret": r} for m, r in fleet_.answers_.items()}, got


def test_answers_already_on_the_bus_are_read_before_a_job_check_is_sent(tmp_path):
    """The same late reader: the first ``timeout`` (0.05 s) passes while two signed answers still wait on the bus.
    Reading them first means no job check is published to hypervisors that answered (run R1: test_leftovers'
    publications held an extra saltutil.find_job at load ~10)."""
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv2": {"b": 2}, "hv3": {"c": 3}})
    fleet_.event = _LateReader(lag=0.1)
    got, _jid = fleet.Fleet(fleet_.opts, client=fleet_).run("virt.full_info")
    assert got == {m: {"status": "up", "ret": r} for m, r in fleet_.answers_.items()}, got
    assert fleet_.kinds == ["virt.full_info"], fleet_.kinds


def test_a_wait_reads_the_bus_once_an_event_or_a_tick_not_in_a_loop(tmp_path):
    """A runner waits minutes for a TCG boot or a migration: each read blocks until an event or a tick
    (publish.TICK), so a quiet second is ~10 reads. It polled (a non-blocking look, a 5 ms pause): ~200 reads,
    8.5% of a core for the whole wait."""
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv3": {"c": 3}})  # hv2 runs the job: the wait lasts max_wait
    fleet_.event = _CountingBus()
    cfg = fleet.config(fleet_.opts, timeout=0.3, gather_job_timeout=0.3, down_after=5)
    got, _jid = fleet.Fleet(fleet_.opts, cfg, fleet_).run("virt.full_info", max_wait=1.5)
    assert got["hv1"]["status"] == "up" and got["hv2"]["status"] == "timeout", got
    quiet_seconds = 1.5
    assert fleet_.event.reads <= quiet_seconds / fleet.TICK + 2 * fleet_.kinds.count(answers.JOB_CHECK) + 5


def test_a_wait_makes_the_masters_key_store_once_for_all_its_answers(tmp_path, monkeypatch):
    """Issue 40: each answer's accepted key was read through a key store made for it (Salt's cache driver loaded
    by its loader): 217 ms for 200 hypervisors' keys, 58 ms with one store per wait (bench/RESULTS.md). Every
    answer is still verified with the key the master accepted for the hypervisor that signed it."""
    from saltvirt.fleet import minionkeys

    made = []
    real = minionkeys._keys
    monkeypatch.setattr(minionkeys, "_keys", lambda opts: made.append(1) or real(opts))
    fleet_ = _Fleet(tmp_path, {"hv1": {"a": 1}, "hv2": {"b": 2}, "hv3": {"c": 3}})
    fleet_.forge = _forgeries(tmp_path)["own_key"]  # a forged answer in each name still fails its check
    got, _jid = fleet.Fleet(fleet_.opts, client=fleet_).run("virt.full_info")
    assert got == {m: {"status": "up", "ret": r} for m, r in fleet_.answers_.items()}
    assert len(made) == 1, made
