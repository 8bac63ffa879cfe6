"""Running host tools (qemu-img, mount, losetup, ...): one runner with the errors users can act on."""

import subprocess
from collections.abc import Sequence

from salt.exceptions import CommandExecutionError


def run(
    cmd: Sequence[str], what: str, timeout: float = 120, check: bool = True, install: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (a list, never a shell) with no stdin; return the CompletedProcess.

    Raises CommandExecutionError naming ``what`` when the tool is missing (``install``: the package to
    install), when it runs longer than ``timeout`` seconds, or (``check``) when it exits non-zero, with
    the tool's own message."""
    try:
        proc = subprocess.run(  # the exit status is checked below, with the tool's own message
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError:
        hint = f" (install {install})" if install else ""
        raise CommandExecutionError(f"{what}: {cmd[0]} is not installed{hint}") from None
    except subprocess.TimeoutExpired:
        raise CommandExecutionError(f"{what}: {cmd[0]} did not finish within {timeout}s") from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        if "lock" in err and ("Failed to get" in err or "another process" in err):
            err += " (the image is in use by a running VM: shut it down first)"
        raise CommandExecutionError(f"{what} failed: {err}")
    return proc
