"""saltvirt.host.guestexec: cmd.run in a VM through its QEMU guest agent (guest-exec, guest-exec-status).

libvirt's test driver has no guest agent (its qemuAgentCommand is "not supported"), and a real agent needs a
booted guest with qemu-ga (minutes under TCG: the integration lab's test guest variant, initrd-qga.img). So these
tests inject a fake agent function that answers as QEMU's agent does (its JSON, base64 output) and check what is
asked of it, how answers are read and capped, and what is refused before anything reaches the guest.
"""

import base64
import json
from contextlib import contextmanager

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import guestexec

ON = {"virt:resources:guest_exec": True}


def b64(text):
    return base64.b64encode(text if isinstance(text, bytes) else text.encode()).decode()


class FakeAgent:
    """QEMU's agent as libvirt hands its answers over: ``guest-exec`` gives a pid, then ``guest-exec-status``
    answers ``statuses`` in turn (the last one again)."""

    def __init__(self, *statuses, pid=42):
        self.asked = []
        self.pid = pid
        self.statuses = list(statuses)

    def __call__(self, dom, command, timeout):
        request = json.loads(command)
        self.asked.append((request, timeout))
        if request["execute"] == "guest-exec":
            return json.dumps({"return": {"pid": self.pid}})
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return status if isinstance(status, str) else json.dumps({"return": status})


class Clock:
    def __init__(self):
        self.now = 0.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def done(out="", err="", code=0, **extra):
    return dict({"exited": True, "exitcode": code, "out-data": b64(out), "err-data": b64(err)}, **extra)


def run(agent, args=("/bin/sh", "-c", "uname -a"), timeout=60, clock=None, limit=guestexec.MAX_OUTPUT):
    clock = clock or Clock()
    return guestexec.run(object(), list(args), timeout, agent, clock=clock, sleep=clock.sleep, limit=limit)


def test_a_string_runs_under_sh_and_a_list_as_it_is():
    assert guestexec.argv("uname -a; id") == ["/bin/sh", "-c", "uname -a; id"]
    assert guestexec.argv("uname -a", python_shell=True) == ["/bin/sh", "-c", "uname -a"]
    assert guestexec.argv("ls -l '/a b'", python_shell=False) == ["ls", "-l", "/a b"]
    assert guestexec.argv(["/bin/echo", "a;b"]) == ["/bin/echo", "a;b"]
    for bad in ("", "  ", [], [""], ["ls", 1], None, 7):
        with pytest.raises(SaltInvocationError, match="takes a command"):
            guestexec.argv(bad)
    with pytest.raises(SaltInvocationError, match="python_shell must be True or False"):
        guestexec.argv("ls", python_shell="yes")


def test_the_request_is_an_argv_with_its_output_captured_and_the_answer_its_stdout():
    agent = FakeAgent({"exited": False}, done("Linux guest 6.1\n\n", "a warning"))
    clock = Clock()
    assert run(agent, clock=clock) == "Linux guest 6.1"  # Salt's cmd.run strips trailing whitespace
    (first, first_timeout), *polls = agent.asked
    assert first == {
        "execute": "guest-exec",
        "arguments": {"path": "/bin/sh", "arg": ["-c", "uname -a"], "capture-output": True},
    }
    assert [p for p, _ in polls] == [{"execute": "guest-exec-status", "arguments": {"pid": 42}}] * 2
    assert {first_timeout, *(t for _, t in polls)} == {guestexec.AGENT_TIMEOUT}  # every agent call is bounded
    assert clock.slept == [0.05]


def test_a_failed_command_raises_with_its_exit_code_and_stderr():
    with pytest.raises(CommandExecutionError) as err:
        run(FakeAgent(done("", "ls: /nope: No such file or directory\n", code=2)))
    assert str(err.value) == "the command failed in the guest (exit code 2): ls: /nope: No such file or directory"
    with pytest.raises(CommandExecutionError, match=r"\(killed by signal 9\)$"):
        run(FakeAgent({"exited": True, "signal": 9}))
    with pytest.raises(CommandExecutionError, match=r"\(exit code 1\): only stdout$"):
        run(FakeAgent(done("only stdout\n", code=1)))


def test_the_command_is_never_in_the_error():
    with pytest.raises(CommandExecutionError) as err:
        run(FakeAgent(done("", "denied", code=1)), args=("/bin/sh", "-c", "mysql -pS3cret"))
    assert "S3cret" not in str(err.value)


def test_output_is_capped():
    big = "x" * 5000
    assert run(FakeAgent(done(big)), limit=1000) == "x" * 1000 + "\n[salt-virt: out cut at 1000 bytes]"
    cut_by_agent = done("partial", **{"out-truncated": True})
    assert run(FakeAgent(cut_by_agent)).endswith("partial\n[salt-virt: out cut at 1048576 bytes]")
    with pytest.raises(CommandExecutionError) as err:
        run(FakeAgent(done("", "e" * 50000, code=3)))
    assert len(str(err.value)) < guestexec.MAX_ERROR + 200  # the message quotes a bounded part of stderr
    assert run(FakeAgent(done(b"caf\xe9 \xff"))) == "caf\ufffd \ufffd"  # not UTF-8: replaced, not an error


def test_a_command_that_runs_on_is_given_up_after_its_timeout():
    clock = Clock()
    agent = FakeAgent({"exited": False})
    with pytest.raises(CommandExecutionError, match=r"still runs in the guest after 5 s \(process 42 there"):
        run(agent, timeout=5, clock=clock)
    assert 5 <= clock.now < 6 and max(clock.slept) <= 1.0  # backs off to 1 s between polls, no further


def test_answers_that_are_not_the_agents_are_errors_not_tracebacks():
    for bad_status in ("not json", json.dumps({"error": {"class": "GenericError"}}), json.dumps({"return": [1]})):
        with pytest.raises(CommandExecutionError, match="not what QEMU's agent sends"):
            run(FakeAgent(bad_status))
    with pytest.raises(CommandExecutionError, match="did not say which process"):
        run(FakeAgent(done(), pid="42"))
    with pytest.raises(CommandExecutionError, match="not base64"):
        run(FakeAgent(dict(done(), **{"out-data": "@@@"})))


def test_timeouts_are_bounded():
    assert guestexec.bounded_timeout(None) == guestexec.DEFAULT_TIMEOUT
    assert guestexec.bounded_timeout(3600) == 3600
    for bad in (0, -1, 3601, "60", True, float("nan")):
        with pytest.raises(SaltInvocationError, match="timeout must be seconds above 0 and at most 3600"):
            guestexec.bounded_timeout(bad)


@contextmanager
def driver():
    conn = libvirt.open("test:///default")
    try:
        yield conn
    finally:
        conn.close()


def test_it_is_off_unless_the_minion_config_says_exactly_true():
    agent = FakeAgent(done("never"))
    for config in ({}, {"virt:resources:guest_exec": "True"}, {"virt:resources:guest_exec": 1}):
        with pytest.raises(CommandExecutionError, match=r"virt:resources:guest_exec: True in the hypervisor's minion"):
            guestexec.guest_run(lambda key, default=None, c=config: c.get(key, default), driver, "x", "id", agent=agent)
    assert agent.asked == []  # refused before anything reaches libvirt or the guest


def test_guest_run_on_a_vm_of_the_test_driver():
    """The driver's own running VM ``test``: the fake agent gets the command; libvirt's real agent call (the
    test driver has none) is an error naming the VM, not a traceback; a VM that left is said so."""
    config = ON.get
    with driver() as conn:
        uuid = conn.lookupByName("test").UUIDString()
    agent = FakeAgent(done("root\n"))
    assert guestexec.guest_run(lambda k, d=None: ON.get(k, d), driver, uuid, "id -un", agent=agent) == "root"
    assert agent.asked[0][0]["arguments"]["arg"] == ["-c", "id -un"]
    with pytest.raises(CommandExecutionError, match=f"running a command in VM {uuid} through its guest agent: "):
        guestexec.guest_run(lambda k, d=None: config(k, d), driver, uuid, "id")
    gone = "3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a0ff"
    with pytest.raises(CommandExecutionError, match=f"VM {gone} is no longer on this hypervisor"):
        guestexec.guest_run(lambda k, d=None: config(k, d), driver, gone, "id", agent=agent)
