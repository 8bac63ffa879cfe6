"""A stopped daemon's port scan that a process exiting elsewhere on the machine does not fail.

After a salt-factories daemon stops, pytest-shell-utilities (1.9.7) looks at every process on the machine for one
still listening on the daemon's ports (``Daemon._terminate_processes_matching_listen_ports``). It skips a process
it may not read (``AccessDenied``) or a zombie, but not one that exits between the listing and the look
(``psutil.NoSuchProcess``): on a busy suite another test's process sometimes does, and the teardown of whatever
daemon was stopping errors (run D2: test_delegation's salt-api). :func:`install` has the scan run again then: the
process that exited is no longer listed, and a daemon still listening on the ports is found as before.
"""

import functools

ATTEMPTS = 5  # each retry follows a process exit during the scan: a few are plenty


def install() -> None:
    import psutil
    from pytestshellutils.shell import Daemon

    scan = Daemon._terminate_processes_matching_listen_ports
    if getattr(scan, "tolerates_exits", False):
        return

    @functools.wraps(scan)
    def tolerant(self):
        for _ in range(ATTEMPTS - 1):
            try:
                return scan(self)
            except psutil.NoSuchProcess:  # exited after the listing: not listening any more, look again
                continue
        return scan(self)

    tolerant.tolerates_exits = True
    Daemon._terminate_processes_matching_listen_ports = tolerant
