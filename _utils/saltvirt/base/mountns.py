"""A private mount namespace for mounts nobody else may see or keep: an untrusted guest's filesystem.

A mount made in the host's namespace is copied into every mount namespace created while it exists (each
qemu's own, libvirt's default; ``ip netns exec``; containers). Where ``/`` is not a shared mount (hosts
without systemd, containers) the host's unmount never reaches those copies, and the loop device under
them stays busy until their last process exits: ``losetup -d`` cannot free it. Mounted here instead, the
guest's filesystem is seen by no other process, and goes when this namespace does.

The namespace is held by a helper (``unshare --mount --propagation private cat``) that exits when its
stdin closes: when :meth:`PrivateMounts.close` runs, or when the process that made it dies. Or by a daemon
the caller starts in it (``holder``: qemu-storage-daemon, whose FUSE export is mounted there), which the
caller stops. Tools enter it with ``nsenter`` (a threaded process such as a minion cannot enter another mount
namespace itself); its files are reached from here through ``/proc/<helper>/root``.
"""

import os
import subprocess
import time
from typing import Any

from salt.exceptions import CommandExecutionError

from saltvirt.base import fsutil, tools

READY_SECONDS = 10


class PrivateMounts:
    """One private mount namespace (see the module's text). Paths are the host's; :meth:`path` reaches
    what is mounted at one of them from here."""

    def __init__(self, holder: list[str] | None = None, **popen: Any) -> None:
        """``holder``: a command to run in the new namespace instead of the helper (its ``popen`` arguments
        given), holding it while it runs (:attr:`proc`; the caller stops it). The caller waits until what the
        holder mounts there shows in :meth:`mounted` before it enters the namespace: only then is the process
        certain to be in it (``unshare`` made it and exec'd the holder). One process less to start and stop
        than a helper and a daemon entered into its namespace."""
        helper = {"stdin": subprocess.PIPE, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
        try:
            self._proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", *(holder or ["cat"])],
                **(popen if holder else helper),
                start_new_session=True,  # a Ctrl-C reaches us (who unmount and close), not it
            )
        except FileNotFoundError:
            raise CommandExecutionError("a private mount namespace: unshare is not installed (util-linux)") from None
        self.pid, self.proc = self._proc.pid, self._proc
        if holder:
            return
        deadline = time.monotonic() + READY_SECONDS
        # ready once unshare has exec'd cat: the namespace exists and nothing in it propagates
        while fsutil.read_text(f"/proc/{self.pid}/comm") != "cat":
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._proc.stderr.read().decode(errors="replace").strip() if self._proc.stderr else ""
                self.close()
                raise CommandExecutionError(f"could not make a private mount namespace: {err or 'unshare timed out'}")
            time.sleep(0.001)

    def path(self, path: str) -> str:
        """``path`` as this namespace sees it (its mounts included), reachable from the host."""
        return f"/proc/{self.pid}/root{os.path.abspath(path)}"

    def run(self, cmd: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return tools.run(["nsenter", "-t", str(self.pid), "-m", "--", *cmd], what, check=check)

    def popen(self, cmd: list[str], **kwargs: Any) -> subprocess.Popen:
        """``cmd`` started inside this namespace (nsenter execs it: the process is ``cmd`` itself)."""
        return subprocess.Popen(["nsenter", "-t", str(self.pid), "-m", "--", *cmd], **kwargs)

    def mounted(self, path: str) -> bool:
        """Whether ``path`` (a host path, no symlinks) is a mount point in this namespace."""
        try:
            return os.path.abspath(path) in fsutil.mount_points(self.pid)
        except FileNotFoundError:  # its holder has exited: the namespace ended with its mounts
            return False

    def mount(self, node: str, target: str, fstype: str, options: list[str]) -> None:
        """Mount ``node`` at ``target`` here; ``-i``: no mount helper (/sbin/mount.*) runs."""
        self.run(["mount", "-i", "-n", "-t", fstype, "-o", ",".join(options), node, target], f"mounting {node}")

    def umount(self, target: str, lazy: bool = False) -> None:
        self.run(["umount", "-i", "-n", *(["-l"] if lazy else []), target], f"unmounting {target}")

    def close(self) -> None:
        """Let the helper go: the namespace ends with the last process in it (and every mount left in it)."""
        if self._proc.stdin and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=READY_SECONDS)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stderr:
            self._proc.stderr.close()
