"""Commands in a guest through its QEMU guest agent (``guest-exec``, then ``guest-exec-status`` until it exited,
through libvirt's ``qemuAgentCommand``): the ``cmd.run`` of ``virt_vm`` resources
(``_resources/virt_vm/modules/cmd.py``, docs/topics/resources.md).

Off unless the hypervisor's minion config says ``virt:resources:guest_exec: True`` (never grains or pillar), and
operator-only (``saltvirt.base.operators``: cmd.run is not a function a tenant may call). The command is an argv
list for the agent (a string runs under ``/bin/sh -c``, as Salt's ``cmd.run`` with ``python_shell``); it is
never logged, and errors do not repeat it. What comes back is the guest's word (a tenant is root in its guest):
it is capped (:data:`MAX_OUTPUT`), parsed defensively, and decides nothing; every call is bounded in time (the
agent cannot stop a command that runs on: the error says so).
"""

import base64
import binascii
import json
import shlex
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import ConfigGet, Conn, Domain
from saltvirt.host import vmresources
from saltvirt.host.conn import lv_errors

OPT_IN = "virt:resources:guest_exec"  # minion config, exactly True
DEFAULT_TIMEOUT = 60  # seconds a command may run when the call gives no timeout
MAX_TIMEOUT = 3600
AGENT_TIMEOUT = 10  # seconds libvirt waits for one answer of the agent
MAX_OUTPUT = 1 << 20  # bytes of stdout returned (and of stderr in an error); the agent itself keeps 16 MiB
MAX_ERROR = 4096  # bytes of stderr (or stdout) quoted in an error message
SHELL = "/bin/sh"
OFF = (
    "cmd.run on a VM (through its guest agent) is off on this hypervisor: the operator turns it on with "
    "virt:resources:guest_exec: True in the hypervisor's minion config (docs/topics/resources.md)"
)
UNSUPPORTED = "cmd.run on a VM takes cmd, timeout and python_shell only, not {names}"

# ``agent(domain, json command, timeout seconds) -> json answer``: libvirt_qemu.qemuAgentCommand in production
Agent = Callable[[Domain, str, int], str]


def libvirt_agent(dom: Domain, command: str, timeout: int) -> str:
    """libvirt's ``qemuAgentCommand`` (the ``libvirt_qemu`` module of the libvirt bindings)."""
    import libvirt_qemu  # noqa: PLC0415 - only hypervisors that turned guest_exec on need it

    return libvirt_qemu.qemuAgentCommand(dom, command, timeout, 0)


def enabled(config: ConfigGet) -> bool:
    """True only when the minion config sets :data:`OPT_IN` to exactly True."""
    return config(OPT_IN, False) is True


def argv(cmd: Any, python_shell: Any = None) -> list[str]:
    """The argv the agent runs: a list as given; a string under ``/bin/sh -c`` (``python_shell`` unset or True,
    Salt's default for a published ``cmd.run``) or split as a shell would (``python_shell=False``)."""
    if isinstance(cmd, (list, tuple)) and cmd and all(isinstance(a, str) for a in cmd) and cmd[0]:
        return list(cmd)
    if isinstance(cmd, str) and cmd.strip():
        if python_shell is None or python_shell is True:
            return [SHELL, "-c", cmd]
        if python_shell is False:
            try:
                return shlex.split(cmd)
            except ValueError as exc:
                raise SaltInvocationError(
                    f"cmd.run on a VM: the command does not split into arguments: {exc}"
                ) from None
        raise SaltInvocationError(f"python_shell must be True or False, not {python_shell!r:.40}")
    raise SaltInvocationError("cmd.run on a VM takes a command: a string (run by /bin/sh -c) or a list of arguments")


def bounded_timeout(timeout: Any) -> float:
    """``timeout`` seconds (default :data:`DEFAULT_TIMEOUT`), above 0 and at most :data:`MAX_TIMEOUT`."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise SaltInvocationError(f"timeout must be seconds above 0 and at most {MAX_TIMEOUT}, not {timeout!r:.40}")
    return float(timeout)


def exec_request(args: list[str]) -> str:
    """The agent's ``guest-exec`` command for ``args`` (output captured, no input)."""
    return json.dumps(
        {"execute": "guest-exec", "arguments": {"path": args[0], "arg": args[1:], "capture-output": True}}
    )


def status_request(pid: int) -> str:
    return json.dumps({"execute": "guest-exec-status", "arguments": {"pid": pid}})


def _answer(text: Any, what: str) -> dict:
    """The ``return`` mapping of an agent answer (the guest's word: checked, not trusted)."""
    try:
        got = json.loads(text)["return"]
    except (TypeError, ValueError, KeyError) as exc:
        raise CommandExecutionError(
            f"the guest agent's answer to {what} is not what QEMU's agent sends ({exc!r:.80})"
        ) from None
    if not isinstance(got, dict):
        raise CommandExecutionError(f"the guest agent's answer to {what} is not what QEMU's agent sends")
    return got


def _decode(data: Any, limit: int) -> tuple[str, bool]:
    """``(text, cut)``: base64 ``data`` as text, cut to ``limit`` bytes."""
    if not data:
        return "", False
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else b""
    except (binascii.Error, ValueError):
        raise CommandExecutionError("the guest agent sent output that is not base64") from None
    return raw[:limit].decode("utf-8", "replace"), len(raw) > limit


def _output(status: dict, key: str, limit: int) -> str:
    text, cut = _decode(status.get(f"{key}-data"), limit)
    if cut or status.get(f"{key}-truncated") is True:
        text += f"\n[salt-virt: {key} cut at {limit} bytes]"
    return text


def run(
    dom: Domain,
    args: list[str],
    timeout: float,
    agent: Agent,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    limit: int = MAX_OUTPUT,
) -> str:
    """Run ``args`` in VM ``dom`` through ``agent``: its stdout (trailing whitespace stripped, as Salt's
    ``cmd.run``), or CommandExecutionError with the exit code (or signal) and stderr when it failed, or when it
    still runs after ``timeout`` seconds."""
    pid = _answer(agent(dom, exec_request(args), AGENT_TIMEOUT), "guest-exec").get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise CommandExecutionError("the guest agent did not say which process runs the command")
    deadline = clock() + timeout
    delay = 0.05
    while True:
        status = _answer(agent(dom, status_request(pid), AGENT_TIMEOUT), "guest-exec-status")
        if status.get("exited") is True:
            break
        left = deadline - clock()
        if left <= 0:
            raise CommandExecutionError(
                f"the command still runs in the guest after {timeout:g} s (process {pid} there: the guest agent "
                "cannot stop it); its output is not collected. Give a larger timeout= (at most "
                f"{MAX_TIMEOUT}) or stop it in the guest"
            )
        sleep(min(delay, left))
        delay = min(delay * 2, 1.0)
    out = _output(status, "out", limit)
    code, signal = status.get("exitcode"), status.get("signal")
    if signal is None and code == 0:
        return out.rstrip()
    err = _output(status, "err", limit)
    how = f"killed by signal {signal}" if signal is not None else f"exit code {code}"
    said = (err.strip() or out.strip())[:MAX_ERROR]
    # no ``info=``: Salt would append all of stdout and stderr to the message
    raise CommandExecutionError(f"the command failed in the guest ({how})" + (f": {said}" if said else ""))


def guest_run(
    config: ConfigGet,
    connect: Callable[[], AbstractContextManager[Conn]],
    rid: str,
    cmd: Any,
    timeout: Any = None,
    python_shell: Any = None,
    agent: Agent | None = None,
) -> str:
    """``cmd.run`` on VM resource ``rid`` (:func:`run`) over the libvirt connection ``connect()`` opens, once the
    minion config ``config`` turned it on (:func:`enabled`: checked first); ``agent``: :func:`libvirt_agent`
    unless given."""
    if not enabled(config):
        raise CommandExecutionError(OFF)
    args, limit = argv(cmd, python_shell), bounded_timeout(timeout)
    with connect() as conn:
        dom = vmresources.domain(conn, rid)
        if dom is None:
            raise CommandExecutionError(f"VM {rid} is no longer on this hypervisor")
        with lv_errors(f"running a command in VM {rid} through its guest agent"):
            return run(dom, args, limit, agent or libvirt_agent)
