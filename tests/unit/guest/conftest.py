"""Fixtures of the guest layer's unit tests."""

import os

import pytest


@pytest.fixture
def guest_root(tmp_path):
    """A guest tree with the kinds of links a real image has; ``tmp_path/host`` is outside it."""
    root = tmp_path / "root"
    (root / "opt/saltstack/salt/bin").mkdir(parents=True)
    (root / "opt/saltstack/salt/bin/salt-minion").write_text("#!/bin/sh\n")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/local/bin").mkdir(parents=True)
    os.symlink("/opt/saltstack/salt/bin/salt-minion", root / "usr/bin/salt-minion")  # absolute: inside the guest
    os.symlink("../../../opt/saltstack/salt/bin/salt-minion", root / "usr/local/bin/salt-minion")
    (tmp_path / "host").mkdir()
    (tmp_path / "host/cloud-init").write_text("the hypervisor's own file")
    os.symlink(str(tmp_path / "host/cloud-init"), root / "usr/bin/cloud-init")  # would escape on the host
    os.symlink("../../../../../../host/cloud-init", root / "usr/local/bin/cloud-init")  # .. stops at /
    os.symlink("/usr/bin/loop2", root / "usr/bin/loop1")
    os.symlink("/usr/bin/loop1", root / "usr/bin/loop2")
    os.symlink("/nowhere", root / "usr/bin/dangling")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    yield fd, root
    os.close(fd)
