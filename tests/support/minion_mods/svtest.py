"""Test-only execution module (minion ``module_dirs``, never shipped): libvirt's ``test:///default``
driver forgets its domains when its last connection closes, and every ``virt`` call opens and closes
its own. ``svtest.hold`` keeps one connection open for the minion process's life, so a test-driver
hypervisor minion running jobs in threads (``multiprocessing: False``) keeps the VMs it created."""

import libvirt


def hold():
    """Open the process-wide connection once (kept on the libvirt module: it outlives loader reloads)."""
    if getattr(libvirt, "_svtest_hold", None) is None:
        libvirt._svtest_hold = libvirt.open("test:///default")
    return libvirt._svtest_hold.getHostname() is not None
