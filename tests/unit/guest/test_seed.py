"""saltvirt.guest.seed, the parts that need no mount: guest paths resolved inside the guest (the ``inspect``
hook's ``exists``), symlinks written into it. A plain directory stands in for a mounted root; the
backends themselves (loop, qsd-fuse, qemu-nbd mounts) are tested in tests/integration/test_seed.py."""

import os

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.guest import seed


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


@pytest.mark.parametrize(
    "path, found",
    [
        ("/opt/saltstack/salt/bin/salt-minion", True),
        ("/usr/bin/salt-minion", True),
        ("/usr/local/bin/salt-minion", True),
        ("/usr/bin/cloud-init", False),  # its target exists on the host, not in the guest
        ("/usr/local/bin/cloud-init", False),
        ("/usr/bin/loop1", False),
        ("/usr/bin/dangling", False),
        ("/usr/bin/salt-minion/x", False),
        ("/nonexistent/dir/file", False),
    ],
)
def test_exists_resolves_inside_the_guest(guest_root, path, found):
    fd, _ = guest_root
    assert seed._guest_exists(fd, path) is found


def test_symlinks_are_written_inside_the_guest_and_never_replace_a_file(guest_root):
    fd, root = guest_root
    unit = "/etc/systemd/system/x.service"
    link = "/etc/systemd/system/multi-user.target.wants/x.service"
    files = seed._normalize_files({unit: {"content": "[Unit]\n"}, link: {"symlink": unit}})
    seed._write_files(fd, files)
    assert os.readlink(root / link.lstrip("/")) == unit  # a link as the guest resolves it
    assert seed._guest_exists(fd, link)
    seed._write_files(fd, files)  # again: an existing link is replaced
    (root / "etc/systemd/system/multi-user.target.wants/x.service").unlink()
    (root / "etc/systemd/system/multi-user.target.wants/x.service").write_text("someone's")
    with pytest.raises(seed._GuestError, match="not a symlink: not replacing it"):
        seed._write_files(fd, files)
    assert (root / "etc/systemd/system/multi-user.target.wants/x.service").read_text() == "someone's"


@pytest.mark.parametrize("target", ["", None, "/a\nb", 5])
def test_bad_symlink_targets_are_refused(target):
    with pytest.raises(SaltInvocationError, match="symlink target must be a path"):
        seed._normalize_files({"/etc/x": {"symlink": target}})


def test_inspect_adds_files_once_it_looked(guest_root):
    fd, _ = guest_root
    files = seed._Files(seed._normalize_files({"/etc/a": "a"}))
    seen = []

    def inspect(exists):
        seen.append(exists("/usr/bin/salt-minion"))
        return {"/etc/b": {"content": "b", "mode": 0o600}}

    files.inspect = inspect
    out = seed._complete(files, lambda p: seed._guest_exists(fd, p))
    assert seen == [True] and files.added == ("/etc/b",)
    assert out == {"/etc/a": (b"a", 0o644), "/etc/b": (b"b", 0o600)}
