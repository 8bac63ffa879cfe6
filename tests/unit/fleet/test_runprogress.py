"""saltvirt.fleet.runprogress: salt-run's [progress] lines, only for a person, and virt.init's steps."""

import socket
import time

import pytest
from salt.utils.event import NamespacedEvent

from saltvirt.fleet import runprogress


class Recorder:
    """What a RunnerClient's event would send (the real one needs a running master's bus): Salt's own
    NamespacedEvent wraps it below, as ``__jid_event__`` wraps the runner's."""

    def __init__(self):
        self.fired = []

    def fire_event(self, data, tag):
        self.fired.append((tag, data))


def jid_event():
    rec = Recorder()
    return rec, NamespacedEvent(rec, "salt/run/123")


@pytest.mark.parametrize("output", runprogress.MACHINE_OUTPUTS)
def test_no_progress_line_among_a_machine_output(output):
    """Issue 35: the backup runner kept its own list without pprint and txt, and showed lines there."""
    rec, event = jid_event()
    runprogress.show({"output": output}, event, "web1: started")
    assert rec.fired == []


@pytest.mark.parametrize("opts", [{}, {"output": "nested"}, {"output": "virt_query"}, {"quiet": False}])
def test_a_person_sees_the_line_without_control_characters(opts):
    rec, event = jid_event()
    runprogress.show(opts, event, "web1: \x1b[2Jcleared\x07", outputter="virt_query")
    assert rec.fired == [("salt/run/123/progress", {"message": "web1: ?[2Jcleared?", "outputter": "virt_query"})]


def test_quiet_shows_nothing_and_a_missing_event_never_fails_the_work():
    rec, event = jid_event()
    runprogress.show({"quiet": True}, event, "x")
    assert rec.fired == []
    runprogress.show({}, None, "no RunnerClient: nothing to show it with")  # logged at debug, not raised


def test_init_progress_keeps_a_timeline_and_shows_both_sides(tmp_path):
    """Each step is marked (seconds, source, host); a step the runner fires (no master bus here: logged, the work
    goes on) and one the hypervisor fired are both shown; a value that does not fit its format shows nothing."""
    rec, event = jid_event()
    progress = runprogress.InitProgress("web1", {"sock_dir": str(tmp_path)}, event, "virt_query")
    progress("placed", host="hv1", score=0.9, reason="most free memory")
    progress.relay("defined", {"host": "hv1"})
    progress("key_accepted", minion_id="web1", fingerprint=None)  # None cannot be cut to 16 characters
    assert [(e["step"], e["source"], e.get("host")) for e in progress.timeline] == [
        ("placed", "runner", "hv1"),
        ("defined", "hypervisor", "hv1"),
        ("key_accepted", "runner", None),
    ]
    assert [data["message"] for _tag, data in rec.fired] == [
        "web1: placed on hv1 (score 0.9): most free memory",
        "web1: defined on hv1",
    ]


def test_fire_without_a_master_socket_gives_up_at_once(tmp_path, caplog):
    """Issue 33: Salt's connect retried the missing socket in a busy loop for a whole second (one CPU-second
    for every announcement of a runner that runs without a master)."""
    caplog.set_level("DEBUG", logger="saltvirt.fleet.runprogress")
    started = time.process_time()
    runprogress.fire({"sock_dir": str(tmp_path), "ipc_mode": "ipc"}, "salt/virt/test", {"a": 1})
    assert time.process_time() - started < 0.5
    assert f"could not fire salt/virt/test: no master event socket in {tmp_path}" in caplog.text


def test_fire_reaches_a_master_socket_that_is_there(tmp_path):
    """The check above only looks for the socket: a listening master's pull socket gets the event."""
    path = str(tmp_path / "master_event_pull.ipc")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        server.settimeout(30)
        runprogress.fire({"sock_dir": str(tmp_path), "ipc_mode": "ipc"}, "salt/virt/test", {"marker": "m-42"})
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            received = b""
            while b"m-42" not in received and (chunk := conn.recv(4096)):
                received += chunk
    assert b"salt/virt/test" in received and b"m-42" in received
