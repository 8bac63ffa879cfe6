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


@pytest.mark.parametrize(
    ("file_client", "expected_tag"), [("local", "salt/virt/init/vm2/defined"), ("remote", "fire_master")]
)
def test_with_a_bus_every_step_goes_through_one_connection(opts, pulls, file_client, expected_tag):
    opts["file_client"] = file_client
    with minion_bus(opts) as received:
        assert progress_events.bus_reachable(opts) == (True, None)
        with progress_events.Progress(opts, "salt/virt/init/vm2", base={"vm": "vm2", "host": "h"}) as progress:
            assert progress("defined", uuid="u1") is True
            assert progress("started") is True
        assert progress.sent == 2 and progress.skipped is None
        assert pulls == [1.0]  # one connection for both steps
        deadline = time.monotonic() + 10  # the bus thread publishes asynchronously
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [t for t, _ in received] == [expected_tag, expected_tag.replace("defined", "started")]
    first = received[0][1]
    if file_client == "remote":  # what the running minion forwards to its master
        assert first["tag"] == "salt/virt/init/vm2/defined" and first["data"]["uuid"] == "u1"
        first = first["data"]
    assert first["vm"] == "vm2" and first["host"] == "h" and first["uuid"] == "u1"


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
