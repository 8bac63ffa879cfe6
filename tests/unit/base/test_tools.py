"""saltvirt.base.tools.run: real processes, the messages a user acts on."""

import re
import subprocess

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.base import fsutil, tools


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


def test_tools_speak_c_english_whatever_the_hosts_language(tmp_path, monkeypatch):
    """A host set to German (LANGUAGE=de, coreutils' translation installed): cp onto a full device says so
    in C's English through tools.run, the words virt.init recognises as a full filesystem."""
    src = tmp_path / "src"
    src.write_bytes(b"x")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LANGUAGE", "de")
    monkeypatch.delenv("LC_ALL", raising=False)
    localized = subprocess.run(["cp", str(src), "/dev/full"], capture_output=True, text=True, check=False).stderr
    if fsutil.NO_SPACE_TEXTS[0] in localized:
        pytest.skip("coreutils' German messages are not installed here: no localized message to test with")
    assert not fsutil.out_of_space(CommandExecutionError(localized))  # a translation is not recognised ...
    with pytest.raises(CommandExecutionError) as err:
        tools.run(["cp", str(src), "/dev/full"], "copying src")
    assert str(err.value) == "copying src failed: cp: error writing '/dev/full': No space left on device"
    assert fsutil.out_of_space(err.value)  # ... what the tool says through tools.run is


def test_c_locale_keeps_the_environment_but_the_language():
    env = tools.c_locale({"PATH": "/bin", "LANG": "de_DE.UTF-8", "LANGUAGE": "de:en", "LC_ALL": "de_DE.UTF-8"})
    assert env == {"PATH": "/bin", "LANG": "de_DE.UTF-8", "LC_ALL": "C.UTF-8"}


def test_limits_are_set_in_the_tool_itself():
    """Issue 36 #3: qemu-img info on a caller's image had only a wall-clock timeout; Nova's caps now."""
    limits = tools.run(["cat", "/proc/self/limits"], "reading limits", limits=tools.QEMU_IMG_INFO_LIMITS).stdout
    assert re.search(r"^Max address space\s+1073741824\s+1073741824\s+bytes", limits, re.M)
    assert re.search(r"^Max cpu time\s+30\s+31\s+seconds", limits, re.M)


def test_a_tool_stopped_by_its_limits_says_so():
    with pytest.raises(
        CommandExecutionError,
        match=r"^probing x failed: sh was killed: CPU time limit exceeded \(it runs here with at most "
        r"1024 MiB of address space and 30 s of CPU: input that needs more is refused\)$",
    ):
        tools.run(["sh", "-c", "kill -XCPU $$"], "probing x", limits=tools.QEMU_IMG_INFO_LIMITS)


def test_a_missing_tool_under_limits_says_what_to_install():
    with pytest.raises(
        CommandExecutionError, match=r"^probing: no-such-tool-x is not installed \(install qemu-utils\)$"
    ):
        tools.run(["no-such-tool-x"], "probing", install="qemu-utils", limits=tools.QEMU_IMG_INFO_LIMITS)
