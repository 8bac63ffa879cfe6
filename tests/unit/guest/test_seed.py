"""saltvirt.guest.seed, the parts that need no mount: the files it takes, the ``inspect`` hook. A plain
directory (``guest_root``, conftest.py) stands in for a mounted root; the backends themselves (loop,
qsd-fuse, qemu-nbd mounts) are tested in tests/integration/test_seed.py."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.guest import guestroot, seed


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
    out = seed._complete(files, lambda p: guestroot.exists(fd, p))
    assert seen == [True] and files.added == ("/etc/b",)
    assert out == {"/etc/a": (b"a", 0o644), "/etc/b": (b"b", 0o600)}
