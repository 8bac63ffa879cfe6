"""saltvirt.fleet.publish: the runner's pure helpers around placement (answers, locating a VM, settings)."""

import socket
import threading
import time

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import hypervisors
from saltvirt.fleet import publish as fleet


@pytest.mark.parametrize(
    "ret, retcode, expected",
    [
        ({"host": {}}, 0, {"status": "up", "ret": {"host": {}}}),
        (
            "ERROR: start VM 'x' on hv1: no bridge",
            1,
            {"status": "error", "error": "start VM 'x' on hv1: no bridge", "retcode": 1},
        ),
        (
            "ERROR executing 'virt.init': nic profile 'n' is not defined",
            1,
            {"status": "error", "error": "nic profile 'n' is not defined", "retcode": 1},
        ),
        (
            "'virt.full_info' is not available.",
            1,
            {"status": "error", "error": "'virt.full_info' is not available.", "no_virt": True},
        ),
        (
            "'virt' __virtual__ returned False: libvirt python bindings missing",
            1,
            {
                "status": "error",
                "error": "'virt' __virtual__ returned False: libvirt python bindings missing",
                "no_virt": True,
            },
        ),
        (
            {"virt.full_info": "'virt.full_info' is not available."},
            1,
            {"status": "error", "error": "'virt.full_info' is not available.", "no_virt": True},
        ),
        (False, 0, {"status": "up", "ret": False}),
    ],
)
def test_minion_answers_are_classified(ret, retcode, expected):
    assert fleet.classify(ret, retcode) == expected


HOSTS = {
    "h1": {"status": "up", "vms": {"web1": "running", "twin": "running"}},
    "h2": {"status": "up", "vm_info": {"twin": {}, "db1": {}}},
    "h3": {"status": "down", "error": "did not answer"},
}


def test_locate_finds_the_one_host_and_refuses_ambiguity():
    assert fleet.locate(HOSTS, "web1") == "h1" and fleet.locate(HOSTS, "db1") == "h2"
    with pytest.raises(fleet.Failed, match="ambiguous: defined on h1, h2. Pass host=") as exc:
        fleet.locate(HOSTS, "twin")
    assert exc.value.details == {"hosts": ["h1", "h2"]}
    assert fleet.locate(HOSTS, "twin", host="h2") == "h2"
    with pytest.raises(fleet.Failed, match="not defined on any hypervisor that answered; .* may have it: h3"):
        fleet.locate(HOSTS, "nosuch")
    with pytest.raises(fleet.Failed, match=r"'web1' is not defined on h2 \(it is on h1\)"):
        fleet.locate(HOSTS, "web1", host="h2")
    with pytest.raises(fleet.Failed, match="hypervisor h3 is down: did not answer"):
        fleet.locate(HOSTS, "web1", host="h3")


def test_hypervisor_settings_from_master_config_and_call():
    opts = {"virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 2, "max_wait": 1}}}
    cfg = fleet.config(opts)
    assert (cfg["tgt"], cfg["tgt_type"], cfg["timeout"], cfg["gather_job_timeout"]) == (None, None, 2.0, 5.0)
    assert cfg["max_wait"] == 2 + 20 + 2  # never shorter than the down detection (timeout + down_after)
    assert fleet.config(opts, tgt="a,b")["tgt"] == "a,b"  # a per-call narrowing, resolved by hypervisors.narrow
    assert fleet.config({"virt": {"hypervisors": ["hv1", "hv2"]}})["timeout"] == 5.0  # the list form: default waits
    with pytest.raises(SaltInvocationError, match="unknown key"):
        fleet.config({"virt": {"hypervisors": {"tgt": "h*", "tmeout": 3}}})
    with pytest.raises(SaltInvocationError, match="timeout must be a number"):
        fleet.config(opts, timeout="soon")
    with pytest.raises(
        SaltInvocationError, match="virt:hypervisors:timeout must be a number of seconds above 0, not -1"
    ):
        fleet.config(opts, timeout=-1)


def test_nothing_configured_or_the_old_grain_default_says_what_to_add():
    for opts in ({}, {"virt": {"hypervisors": {"timeout": 4}}}):
        with pytest.raises(hypervisors.NotConfiguredError, match="hypervisors: \\[hyper1, hyper2\\]"):
            fleet.config(opts)
    with pytest.raises(SaltInvocationError, match="hypervisors_trust_minion_data"):
        fleet.config({"virt": {"hypervisors": {"tgt": "G@virt_hypervisor:True", "tgt_type": "compound"}}})


class _Events:
    def __init__(self, events):
        self.events = list(events)

    def get_event(self, **_kw):
        return self.events.pop(0) if self.events else None


class _EventClient:
    def __init__(self, events):
        self.event = _Events(events)


def test_progress_is_relayed_only_from_the_minions_published_to():
    """Issue 23 #6: another minion firing salt/virt/init/<vm>/... is never shown as the hypervisor's progress."""
    seen = []
    tag = "salt/virt/init/web1/seeded"
    client = _EventClient(
        [
            {"tag": tag, "data": {"id": "tenant-vm", "data": {"host": "hv1", "backend": "\x1b[2Jowned"}}},
            {"tag": tag, "data": {"id": "hv1", "data": {"host": "hv1", "backend": "loop"}}},
        ]
    )
    fleet._relay(client, ("salt/virt/init/web1/", lambda t, d: seen.append((t, d))), {"hv1"})
    assert seen == [(tag, {"host": "hv1", "backend": "loop"})]


class _Flood:
    """A guest firing the watched progress tag without pause: the bus always holds one more of its events."""

    def __init__(self):
        self.reads = 0

    def get_event(self, **_kw):
        self.reads += 1
        if self.reads > 10 * fleet.DRAIN_MAX:
            raise AssertionError("the runner is still reading a flooded bus")
        return {"tag": "salt/virt/init/web1/seeded", "data": {"id": "tenant-vm", "data": {}}}


def test_a_flooded_progress_tag_does_not_hold_the_runner():
    """The progress relay after a wait reads what is on the bus now, at most DRAIN_MAX events (it read until the
    bus was empty: a tenant firing salt/virt/init/<vm>/... without pause held the runner)."""
    client = _EventClient([])
    client.event = _Flood()
    fleet._relay(client, ("salt/virt/init/web1/", lambda t, d: None), {"hv1"})
    assert client.event.reads == fleet.DRAIN_MAX


def test_failure_is_the_runners_answer():
    from salt.exceptions import SaltInvocationError

    assert fleet.failure(fleet.Failed("no room", tried=["hyper1"]), host="hyper2") == {
        "error": "no room",
        "tried": ["hyper1"],
        "host": "hyper2",
        "retcode": 1,
    }
    assert fleet.failure(SaltInvocationError("bad name")) == {"error": "bad name", "retcode": 1}


def test_the_transport_reads_its_settings_once_and_wide_drops_a_calls_narrowing():
    opts = {"virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 2}}}
    transport = fleet.Fleet(opts, client="the client")
    assert transport.cfg["timeout"] == 2.0 and transport.cfg is transport.cfg  # the master config, read once
    narrowed = transport.with_cfg(fleet.config(opts, tgt="hyper1"))
    assert (narrowed.opts, narrowed.client, narrowed.cfg["tgt"]) == (opts, "the client", "hyper1")
    wide = narrowed.wide()
    assert (wide.cfg["tgt"], wide.cfg["tgt_type"], wide.client) == (None, None, "the client")
    assert narrowed.cfg["tgt"] == "hyper1" and wide.within_target({"h": {}}) == {"h": {}}


def test_ret_is_a_steps_return_or_failed_with_its_status():
    class Answering(fleet.Fleet):
        def call(self, minion, fun, arg=(), kwarg=None, **_kw):
            if minion == "hv1":
                return {"status": "up", "ret": [fun, list(arg), kwarg]}, "j1"
            return {"status": "down", "error": "did not answer"}, "j2"

    transport = Answering({}, {})
    assert transport.ret("hv1", "virt.x", 1, live=True) == ["virt.x", [1], {"live": True}]
    assert transport.ret("hv1", "virt.x") == ["virt.x", [], None]
    with pytest.raises(fleet.Failed, match="^virt.x on hv2: did not answer$") as err:
        transport.ret("hv2", "virt.x")
    assert err.value.details == {"host": "hv2", "status": "down", "jid": "j2"}


class _QuietBus:
    """The bus of a runner whose master stopped: nothing arrives; a job check cannot be published."""

    def __init__(self):
        self.event = self

    def get_event(self, wait=0.1, **_kw):
        time.sleep(wait)

    def run_job(self, *_args, **_kw):
        raise RuntimeError("Salt request timed out. The master is not responding.")


def _master_port():
    """A listening socket on the ret port of this test's "salt-master" (a runner only ever connects to it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def _replies(tmp_path, port):
    from saltvirt.fleet import replies

    opts = {"interface": "127.0.0.1", "ret_port": port, "cachedir": str(tmp_path), "pki_dir": str(tmp_path)}
    cfg = fleet.config({"virt": {"hypervisors": {"tgt": "hv1", "timeout": 600, "down_after": 600}}})
    return replies.Replies(opts, _QuietBus(), cfg, "20261201000000000000", "virt.init", "n", {"hv1"}, dict)


def test_a_wait_ends_when_the_salt_master_stops(tmp_path, monkeypatch):
    """A runner waiting for a hypervisor stops waiting once the salt-master it saw running stopped (its ret port
    closed at two looks in a row): no answer can reach it. Before, it waited out timeout + down_after (41 s in
    test_faults) and then took the hypervisor for silent."""
    monkeypatch.setattr(fleet, "MASTER_LOOK", 0.05)
    master = _master_port()
    waiting = _replies(tmp_path, master.getsockname()[1])
    threading.Timer(0.02, master.close).start()  # the master stops as soon as the runner waits
    with pytest.raises(fleet.MasterGone, match="the salt-master stopped while waiting for virt.init from hv1"):
        fleet._wait(waiting, waiting.client, None, {"hv1"}, None, max_wait=30)
    assert waiting.missing == {"hv1"} and not waiting.down  # not given up as silent: it had no master to answer


def test_a_wait_without_a_master_it_ever_saw_runs_its_course(tmp_path, monkeypatch):
    """No master seen running during the wait (none listens on the port): the wait ends as it always did."""
    monkeypatch.setattr(fleet, "MASTER_LOOK", 0.05)
    closed = _master_port()
    port = closed.getsockname()[1]
    closed.close()
    waiting = _replies(tmp_path, port)
    fleet._wait(waiting, waiting.client, None, {"hv1"}, None, max_wait=0.5)
    assert waiting.missing == {"hv1"}
