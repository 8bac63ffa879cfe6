"""saltvirt.fleet.vmwait: ``salt-run virt.init ... wait=ip|minion``. Arguments are checked before anything is
created; a wait that runs out (or fails) keeps the VM and says what it saw.

The waiting itself publishes through a salt-master (``fleet.call``, LocalClient): with a real master and
hypervisor that is tests/integration/test_guest_ips.py. Here the transport is :class:`Fleet`, whose ``call``
returns what a hypervisor would answer, since unit tests have no salt-master."""

import time

import pytest
from salt.exceptions import SaltClientError, SaltInvocationError

from saltvirt.fleet import vmwait

CREATED = {"name": "web1", "host": "hyper1", "key": {"minion_id": "web1-id"}}
IP = {"address": "10.0.0.5", "prefix": 24, "type": "ipv4", "source": "lease"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((None, 300), (None, None)),
        (("", "x"), (None, None)),  # no wait: wait_timeout is not even looked at
        (("ip", 300), ("ip", 300.0)),
        ((" Minion ", "12.5"), ("minion", 12.5)),
    ],
)
def test_check_accepts(args, expected):
    assert vmwait.check(*args) == expected


@pytest.mark.parametrize(
    ("wait", "timeout", "start", "message"),
    [
        ("ssh", 300, True, "wait must be ip or minion (or left out), not 'ssh'"),
        (["ip"], 300, True, "wait must be ip or minion"),
        (True, 300, True, "wait must be ip or minion"),
        ("ip", 0, True, "wait_timeout must be a number of seconds above 0"),
        ("ip", -5, True, "wait_timeout must be a number of seconds above 0"),
        ("ip", "soon", True, "not 'soon'"),
        ("ip", True, True, "wait_timeout must be a number"),
        ("ip", 10**9, True, f"at most {vmwait.MAX_TIMEOUT}"),
        ("minion", 60, False, "wait=minion needs the VM started: leave out start=False"),
        ("ip", 60, "false", "wait=ip needs the VM started"),
    ],
)
def test_check_refuses_with_a_clear_message(wait, timeout, start, message):
    with pytest.raises(SaltInvocationError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        vmwait.check(wait, timeout, start)


class Fleet:
    """``publish.Fleet``'s part the wait uses: ``call`` (a :class:`Hypervisor`) and the LocalClient ``client``."""

    def __init__(self, client=None, hypervisor=None):
        self.client, self.call = client, hypervisor


class Hypervisor:
    """What ``virt.vm_info NAME`` on the hypervisor answers, one answer per call (the last one repeats)."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, host, fun, args, kwarg=None, max_wait=None):
        self.calls.append((host, fun, args))
        ans = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(ans, Exception):
            raise ans
        return ans, "jid"


def up(state="running", ips=(), note=None):
    info = {"state": state, "nics": {"52:54:00:00:00:01": {"ips": list(ips)}, "52:54:00:00:00:02": {"ips": []}}}
    if note:
        info["ips_note"] = note
    return {"status": "up", "ret": {"web1": info}}


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(vmwait, "POLL", 0.01)


def test_wait_ip_returns_the_addresses_once_there(monkeypatch, fast):
    hv = Hypervisor(up(), {"status": "down", "error": "did not answer"}, up(ips=[IP]))
    ret = vmwait.wait(Fleet(hypervisor=hv), "ip", CREATED, 30)
    assert ret["result"] == "ok" and ret["ips"] == {"52:54:00:00:00:01": [IP]}
    assert hv.calls == [("hyper1", "virt.vm_info", ["web1"])] * 3  # only the new VM, on its own host


def test_wait_ip_timeout_keeps_the_vm_and_says_what_it_saw(monkeypatch, fast):
    hypervisor = Hypervisor(up(note="lease: network gone"))
    ret = vmwait.wait(Fleet(hypervisor=hypervisor), "ip", CREATED, 0.1)
    assert ret["result"] == "timeout" and ret["seen"] == {
        "state": "running",
        "ips": {},
        "ips_note": "lease: network gone",
    }
    assert ret["message"] == (
        "no address showed up on web1's NICs within 0.1 s. The VM web1 was created on hyper1 and is kept: "
        "see salt-run virt.vm_info web1, or salt-run virt.purge web1 to remove it"
    )


class NoMinion:
    """A LocalClient whose publications reach nobody (what a VM without a running minion looks like)."""

    def __init__(self):
        self.published = []

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, listen=False):
        self.published.append((tuple(tgt), fun, tgt_type))
        return {"jid": str(len(self.published)), "minions": tgt}

    def get_iter_returns(self, jid, minions, **kwargs):
        yield None
        yield None

    def get_cache_returns(self, jid):
        return {}

    def _clean_up_subscriptions(self, jid):
        pass


def test_wait_minion_pings_only_the_new_minion_and_times_out_clearly(monkeypatch):
    hypervisor = Hypervisor(up(ips=[IP]))
    monkeypatch.setattr(vmwait, "PING_WINDOW", 0.05)
    client = NoMinion()
    ret = vmwait.wait(Fleet(client, hypervisor), "minion", CREATED, 0.3)
    assert ret["result"] == "timeout" and ret["minion"] == "web1-id" and ret["pings"] >= 1
    assert set(client.published) == {(("web1-id",), "test.ping", "list")}  # a list target: never a glob
    assert ret["seen"] == {"state": "running", "ips": {"52:54:00:00:00:01": [IP]}}
    assert ret["message"].startswith("minion web1-id did not answer test.ping within 0.3 s. The VM web1 was created")

    unseeded = dict(CREATED, key=None)
    ret = vmwait.wait(Fleet(NoMinion(), hypervisor), "minion", unseeded, 0.1)
    assert "(no minion key was seeded: seed=False or no image;" in ret["message"]


def test_wait_minion_ok(monkeypatch):
    class Answers(NoMinion):
        def get_iter_returns(self, jid, minions, **kwargs):
            yield None
            yield {"web1-id": {"ret": True, "retcode": 0}}

    ret = vmwait.wait(Fleet(Answers()), "minion", CREATED, 30)
    assert ret["result"] == "ok" and ret["minion"] == "web1-id"


def test_a_failing_wait_never_fails_the_created_vm(monkeypatch):
    class Broken(NoMinion):
        def run_job(self, *args, **kwargs):
            raise SaltClientError("master gone")

    ret = vmwait.wait(Fleet(Broken()), "minion", CREATED, 30)
    assert ret["result"] == "error"
    assert ret["message"].startswith("waiting for minion failed (master gone). The VM web1 was created on hyper1")


class LateMinion(NoMinion):
    """A minion slower than the ping window: it answers each publication, but only after its window
    (in the master's job cache once the next publication is out)."""

    def get_cache_returns(self, jid):
        late = int(jid) < len(self.published)
        return {"web1-id": {"ret": True}} if late else {}


def test_wait_minion_counts_an_answer_that_came_after_its_window(monkeypatch):
    monkeypatch.setattr(vmwait, "PING_WINDOW", 0.05)
    client = LateMinion()
    ret = vmwait.wait(Fleet(client), "minion", CREATED, 30)
    assert ret["result"] == "ok" and ret["minion"] == "web1-id"
    assert len(client.published) == 2  # the first one's answer was seen before a third publication


def test_wait_minion_reads_the_last_answer_when_the_time_is_up(monkeypatch):
    class AnswersAfterTheLastWindow(NoMinion):
        def get_cache_returns(self, jid):
            return {"web1-id": {"ret": True}} if jid == str(len(self.published)) else {}

    monkeypatch.setattr(vmwait, "PING_WINDOW", 0.05)
    hypervisor = Hypervisor(up(ips=[IP]))
    client = AnswersAfterTheLastWindow()
    ret = vmwait.wait(Fleet(client, hypervisor), "minion", CREATED, 0.01)
    assert ret["result"] == "ok" and len(client.published) == 1


class SilentMinion(NoMinion):
    """A LocalClient whose publications are answered by nobody, read as Salt's get_iter_returns does: None
    until the timeout it was given has passed. Records when each publication went out."""

    def __init__(self):
        super().__init__()
        self.at = []

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, listen=False):
        self.at.append(time.monotonic())
        return super().run_job(tgt, fun, arg, tgt_type, timeout, listen)

    def get_iter_returns(self, jid, minions, timeout=None, **kwargs):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            yield None


def test_wait_minion_sends_a_silent_guest_fewer_pings_as_time_goes(monkeypatch):
    """A CI run: the tutorial's TCG guest answered each ping ~1 min late while wait=minion published one every
    ~5.5 s; the backlog made the page's next `salt demo1 test.ping` time out. Each window doubles now."""
    hypervisor = Hypervisor(up(ips=[IP]))
    monkeypatch.setattr(vmwait, "PING_WINDOW", 0.4)
    monkeypatch.setattr(vmwait, "MAX_PING_WINDOW", 1.6)
    client = SilentMinion()
    ret = vmwait.wait(Fleet(client, hypervisor), "minion", CREATED, 4.5)
    assert ret["result"] == "timeout"
    gaps = [b - a for a, b in zip(client.at, client.at[1:], strict=False)]
    assert len(client.published) <= 4 and all(b > a + 0.2 for a, b in zip(gaps, gaps[1:], strict=False)), gaps
