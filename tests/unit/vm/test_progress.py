"""saltvirt.vm.progress: virt.init progress events with a real minion event bus (tests.support.eventbus), and
without one (no socket, a stale socket), with nothing mocked: the bus check and Salt's event code are
watched, not replaced."""

import socket
import time

import pytest
import salt.config
import salt.utils.event

from saltvirt.vm import progress as progress_events
from tests.support.eventbus import minion_bus, short_sock_dir


@pytest.fixture
def opts():
    with short_sock_dir() as sock_dir:
        opts = salt.config.minion_config(None)
        opts.update({"id": "hyper-ev", "file_client": "local", "sock_dir": sock_dir})
        yield opts


@pytest.fixture
def pulls(monkeypatch):
    """How often Salt's event code tries to connect to a bus (the call that waits up to 1 s for none)."""
    calls = []
    real = salt.utils.event.SaltEvent.connect_pull

    def counting(self, timeout=1):
        calls.append(timeout)
        return real(self, timeout=timeout)

    monkeypatch.setattr(salt.utils.event.SaltEvent, "connect_pull", counting)
    return calls


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"file_client": "local"}, "local"),
        ({"file_client": "remote", "local": True}, "local"),
        ({"file_client": "remote", "master_type": "disable"}, "local"),
        ({"file_client": "local", "use_master_when_local": True}, "master"),
        ({"file_client": "remote"}, "master"),
        ({"file_client": "remote", "__cli": "salt-call"}, "salt-call"),
    ],
)
def test_route_follows_event_send(extra, expected):
    base = {"file_client": "remote", "local": False, "master_type": "str", "use_master_when_local": False}
    assert progress_events.route(dict(base, **extra)) == expected


def test_no_bus_means_no_event_and_no_wait(opts, pulls):
    probes = []

    def probe(o):
        probes.append(1)
        return progress_events.bus_reachable(o)

    with progress_events.Progress(opts, "salt/virt/init/vm1", base={"vm": "vm1"}, probe=probe) as progress:
        for step in ("image_cached", "disks_ready", "defined", "started"):
            assert progress(step, x=1) is False
    assert probes == [1]  # decided once per init
    assert pulls == []  # Salt's connect (the ~1 s spin per event) never attempted
    assert progress.sent == 0 and "does not exist" in progress.skipped


def test_a_stale_socket_is_no_bus(opts, pulls):
    path = progress_events.bus_address(opts)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)  # the file a dead minion leaves: a socket nobody listens on
    ok, why = progress_events.bus_reachable(opts)
    assert not ok and "refused" in why.lower()
    progress = progress_events.Progress(opts, "salt/virt/init/vm1")
    assert progress("defined") is False and pulls == []


def test_a_plain_file_is_no_bus(opts):
    open(progress_events.bus_address(opts), "w").close()
    ok, why = progress_events.bus_reachable(opts)
    assert not ok and "not a socket" in why


@pytest.fixture
def connects(monkeypatch):
    """Each connection Progress opens to the bus's pull socket."""
    calls = []
    real = progress_events._connect

    def counting(addr, timeout):
        calls.append(addr)
        return real(addr, timeout)

    monkeypatch.setattr(progress_events, "_connect", counting)
    return calls


@pytest.mark.parametrize(
    ("file_client", "expected_tag"), [("local", "salt/virt/init/vm2/defined"), ("remote", "fire_master")]
)
def test_with_a_bus_every_step_goes_through_one_connection(opts, pulls, connects, file_client, expected_tag):
    opts["file_client"] = file_client
    with minion_bus(opts) as received:
        assert progress_events.bus_reachable(opts) == (True, None)
        with progress_events.Progress(opts, "salt/virt/init/vm2", base={"vm": "vm2", "host": "h"}) as progress:
            assert progress("defined", uuid="u1") is True
            assert progress("started") is True
        assert progress.sent == 2 and progress.skipped is None
        # one plain connection for both steps; Salt's event client (its io loop and thread per client,
        # a few ms of CPU and GIL per init: issue #40) is not used
        assert connects == [progress_events.bus_address(opts)] and pulls == []
        deadline = time.monotonic() + 10  # the bus thread publishes asynchronously
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [t for t, _ in received] == [expected_tag, expected_tag.replace("defined", "started")]
    first = received[0][1]
    if file_client == "remote":  # what the running minion forwards to its master
        assert first["tag"] == "salt/virt/init/vm2/defined" and first["data"]["uuid"] == "u1"
        first = first["data"]
    assert first["vm"] == "vm2" and first["host"] == "h" and first["uuid"] == "u1"


def test_an_event_reads_back_as_one_salts_client_fired(opts):
    """Written by Progress or by Salt's own event client, the bus gets the same event."""
    with minion_bus(opts) as received:
        with progress_events.Progress(opts, "salt/virt/init/vm4", base={"vm": "vm4"}) as progress:
            assert progress("defined", uuid="u4") is True
        bus = salt.utils.event.get_event("minion", opts=opts, listen=False)
        assert bus.fire_event({"uuid": "u4", "vm": "vm4"}, "salt/virt/init/vm4/defined")
        bus.destroy()
        deadline = time.monotonic() + 10
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    (ours_tag, ours), (salts_tag, salts) = received
    assert ours_tag == salts_tag and sorted(ours) == sorted(salts) == ["_stamp", "uuid", "vm"]
    assert {k: v for k, v in ours.items() if k != "_stamp"} == {k: v for k, v in salts.items() if k != "_stamp"}


def test_without_salts_framing_its_event_client_sends(opts, monkeypatch, connects):
    """A Salt without ``frame_msg_ipc``: the events still go out, through Salt's event client."""
    monkeypatch.setattr(progress_events, "_framer", lambda: None)
    with minion_bus(opts) as received:
        with progress_events.Progress(opts, "salt/virt/init/vm5", base={"vm": "vm5"}) as progress:
            assert progress("defined", uuid="u5") is True
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
    assert connects == [] and received[0][0] == "salt/virt/init/vm5/defined" and received[0][1]["uuid"] == "u5"


def test_salt_call_with_a_master_uses_event_send(opts):
    opts.update({"file_client": "remote", "__cli": "salt-call"})
    sent = []
    progress = progress_events.Progress(
        opts, "salt/virt/init/vm3", base={"vm": "vm3"}, send=lambda t, d: sent.append((t, d))
    )
    assert progress("defined", uuid="u") is True
    assert sent == [("salt/virt/init/vm3/defined", {"uuid": "u", "vm": "vm3"})]


def test_a_failing_send_stops_further_tries(opts):
    opts.update({"file_client": "remote", "__cli": "salt-call"})
    sent = []

    def send(tag, data):
        sent.append(tag)
        return False

    progress = progress_events.Progress(opts, "p", send=send)
    assert progress("a") is False and progress("b") is False
    assert sent == ["p/a"] and progress.skipped
