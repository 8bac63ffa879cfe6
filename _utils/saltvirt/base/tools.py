"""Running host tools (qemu-img, mount, losetup, ...): one runner with the errors users can act on."""

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from salt.exceptions import CommandExecutionError


@dataclass(frozen=True)
class Limits:
    """Resource limits (setrlimit) of one tool run: its address space (bytes) and CPU time (seconds)."""

    address_space: int
    cpu_seconds: int

    def __str__(self) -> str:
        return f"{self.address_space // 2**20} MiB of address space and {self.cpu_seconds} s of CPU"


# qemu-img info on an image salt-virt did not make: a crafted header can make it allocate or compute without
# end (CVE-2015-5162), and a wall-clock timeout lets it take the host's memory first. OpenStack Nova's caps.
QEMU_IMG_INFO_LIMITS = Limits(address_space=2**30, cpu_seconds=30)


def run(
    cmd: Sequence[str],
    what: str,
    timeout: float = 120,
    check: bool = True,
    install: str | None = None,
    limits: Limits | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (a list, never a shell) with no stdin; return the CompletedProcess.

    Raises CommandExecutionError naming ``what`` when the tool is missing (``install``: the package to
    install), when it runs longer than ``timeout`` seconds, or (``check``) when it exits non-zero, with
    the tool's own message. Tools speak C's English (:func:`c_locale`): what they say is what salt-virt
    recognises (``saltvirt.base.fsutil.out_of_space``) and what its documentation quotes. ``limits``: run
    under them (util-linux's prlimit sets them and execs the tool: no Python runs between fork and exec,
    which a preexec_fn would, unsafely with the minion's threads)."""
    argv = list(cmd)
    if limits is not None:
        # the CPU's hard limit a second later: SIGXCPU ("CPU time limit exceeded") comes first, not SIGKILL
        cpu = f"{limits.cpu_seconds}:{limits.cpu_seconds + 1}"
        argv = ["prlimit", f"--as={limits.address_space}", f"--cpu={cpu}", "--", *argv]
    try:
        proc = subprocess.run(  # the exit status is checked below, with the tool's own message
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env=c_locale(),
        )
    except FileNotFoundError:
        missing, package = (cmd[0], install) if argv[0] == cmd[0] else ("prlimit", "util-linux")
        hint = f" (install {package})" if package else ""
        raise CommandExecutionError(f"{what}: {missing} is not installed{hint}") from None
    except subprocess.TimeoutExpired:
        raise CommandExecutionError(f"{what}: {cmd[0]} did not finish within {timeout}s") from None
    if limits is not None and proc.returncode == 127 and proc.stderr.startswith("prlimit: failed to execute"):
        hint = f" (install {install})" if install else ""
        raise CommandExecutionError(f"{what}: {cmd[0]} is not installed{hint}")
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        if proc.returncode < 0:  # what the kernel said: "CPU time limit exceeded" (SIGXCPU), ...
            err = f"{cmd[0]} was killed: {signal.strsignal(-proc.returncode) or f'signal {-proc.returncode}'}"
        if limits is not None and (proc.returncode < 0 or "alloc" in err.lower() or "memory" in err.lower()):
            err += f" (it runs here with at most {limits}: input that needs more is refused)"
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
