"""Running host tools (qemu-img, mount, losetup, ...): one runner with the errors users can act on."""

import os
import subprocess
from collections.abc import Sequence

from salt.exceptions import CommandExecutionError


def run(
    cmd: Sequence[str], what: str, timeout: float = 120, check: bool = True, install: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (a list, never a shell) with no stdin; return the CompletedProcess.

    Raises CommandExecutionError naming ``what`` when the tool is missing (``install``: the package to
    install), when it runs longer than ``timeout`` seconds, or (``check``) when it exits non-zero, with
    the tool's own message. Tools speak C's English (:func:`c_locale`): what they say is what salt-virt
    recognises (``saltvirt.base.fsutil.out_of_space``) and what its documentation quotes."""
    try:
        proc = subprocess.run(  # the exit status is checked below, with the tool's own message
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env=c_locale(),
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


def c_locale(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with messages in C's English: ``LC_ALL=C.UTF-8`` (UTF-8
    file names stay as they are; where C.UTF-8 is missing, C) and no ``LANGUAGE`` (GNU gettext honours it
    over any locale but C itself)."""
    out = {k: v for k, v in (os.environ if env is None else env).items() if k != "LANGUAGE"}
    out["LC_ALL"] = "C.UTF-8"
    return out
