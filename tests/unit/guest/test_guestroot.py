"""saltvirt.guest.guestroot: guest paths resolved inside the guest, symlinks written into it and never
over a file. A plain directory (``guest_root``, conftest.py) stands in for a mounted root."""

import os

import pytest

from saltvirt.guest import guestroot, seed


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
    assert guestroot.exists(fd, path) is found


def test_symlinks_are_written_inside_the_guest_and_never_replace_a_file(guest_root):
    fd, root = guest_root
    unit = "/etc/systemd/system/x.service"
    link = "/etc/systemd/system/multi-user.target.wants/x.service"
    files = seed._normalize_files({unit: {"content": "[Unit]\n"}, link: {"symlink": unit}})
    guestroot.write_files(fd, files)
    assert os.readlink(root / link.lstrip("/")) == unit  # a link as the guest resolves it
    assert guestroot.exists(fd, link)
    guestroot.write_files(fd, files)  # again: an existing link is replaced
    (root / "etc/systemd/system/multi-user.target.wants/x.service").unlink()
    (root / "etc/systemd/system/multi-user.target.wants/x.service").write_text("someone's")
    with pytest.raises(guestroot.GuestError, match="not a symlink: not replacing it"):
        guestroot.write_files(fd, files)
    assert (root / "etc/systemd/system/multi-user.target.wants/x.service").read_text() == "someone's"
