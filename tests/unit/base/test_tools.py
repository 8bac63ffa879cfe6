"""saltvirt.base.tools.run: real processes, the messages a user acts on."""

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.base import tools


def test_output_of_a_tool_that_worked():
    assert tools.run(["sh", "-c", "echo out; echo err >&2"], "echoing").stdout == "out\n"


def test_a_failing_tool_names_the_step_and_says_what_the_tool_said():
    with pytest.raises(CommandExecutionError, match=r"^copying a to b failed: no such thing$"):
        tools.run(["sh", "-c", "echo 'no such thing' >&2; exit 3"], "copying a to b")
    assert tools.run(["sh", "-c", "exit 3"], "probing", check=False).returncode == 3


def test_a_silent_failure_gives_the_exit_status():
    with pytest.raises(CommandExecutionError, match=r"^probing failed: exit 4$"):
        tools.run(["sh", "-c", "exit 4"], "probing")


def test_a_missing_tool_says_what_to_install():
    with pytest.raises(
        CommandExecutionError, match=r"^resizing: no-such-tool-x is not installed \(install qemu-utils\)$"
    ):
        tools.run(["no-such-tool-x"], "resizing", install="qemu-utils")


def test_a_hanging_tool_is_stopped():
    with pytest.raises(CommandExecutionError, match=r"^waiting: sleep did not finish within 0.2s$"):
        tools.run(["sleep", "5"], "waiting", timeout=0.2)


def test_a_qemu_lock_error_says_the_image_is_in_use():
    cmd = ["sh", "-c", "echo 'Failed to get \"write\" lock' >&2; exit 1"]
    with pytest.raises(CommandExecutionError, match=r"in use by a running VM: shut it down first\)$"):
        tools.run(cmd, "resizing disk.qcow2")
