"""storage/saltcache: a salt:// image's cached copy is used without reading it whole when the master's hash
matches the digest recorded for the copy as it is on disk; anything else goes through cp.cache_file.

Salt's file client is stood in for here by :class:`Cp` (a master's files and a minion's cache in ``tmp_path``,
hashed as Salt hashes them): the real one needs a master and a minion, and runs in
``tests/integration/test_intake_runner.py``."""

import hashlib
import json
import os

from saltvirt.storage import saltcache

URL = "salt://images/base.qcow2"


class Cp:
    """A master's file (``master``) and Salt's minion cache of it, as a Salt file client: ``cache_file`` checks
    the cached copy by reading it whole, as Salt's fileclient does, and fetches it when it differs."""

    def __init__(self, tmp_path, content=b"image v1" * 1000):
        self.master = {URL: content}
        self.copy = tmp_path / "minion-cache" / "files" / "base" / "images" / "base.qcow2"
        self.calls = {"is_cached": 0, "hash_file": 0, "cache_file": 0}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def is_cached(self, url, saltenv):
        self.calls["is_cached"] += 1
        return str(self.copy) if self.copy.is_file() else ""

    def hash_file(self, url, saltenv):
        self.calls["hash_file"] += 1
        data = self.master.get(url)
        return {"hsum": hashlib.sha256(data).hexdigest(), "hash_type": "sha256"} if data is not None else ""

    def cache_file(self, url, saltenv):
        self.calls["cache_file"] += 1
        data = self.master.get(url)
        if data is None:
            return False
        if not self.copy.is_file() or self.copy.read_bytes() != data:
            self.copy.parent.mkdir(parents=True, exist_ok=True)
            self.copy.write_bytes(data)
        return str(self.copy)


def files(cp, tmp_path):
    return saltcache.SaltFiles(lambda: cp, "base", str(tmp_path / "cachedir" / "salt-virt"))


def test_an_unchanged_copy_is_used_without_cp_cache_file_after_its_digest_is_recorded(tmp_path):
    cp = Cp(tmp_path)
    assert files(cp, tmp_path)(URL) == str(cp.copy)  # the first use fetches and records
    assert cp.calls["cache_file"] == 1
    record = json.loads((tmp_path / "cachedir" / "salt-virt" / saltcache.RECORD).read_text())
    assert record[str(cp.copy)][1:] == ["sha256", hashlib.sha256(cp.master[URL]).hexdigest()]
    for _ in range(3):
        assert files(cp, tmp_path)(URL) == str(cp.copy)
    assert cp.calls["cache_file"] == 1  # the master's hash was asked; the copy was not read again
    assert cp.calls["hash_file"] == 4


def test_a_file_changed_on_the_master_is_fetched_again(tmp_path):
    cp = Cp(tmp_path)
    files(cp, tmp_path)(URL)
    cp.master[URL] = b"image v2" * 1000
    assert files(cp, tmp_path)(URL) == str(cp.copy)
    assert cp.calls["cache_file"] == 2
    assert cp.copy.read_bytes() == cp.master[URL]
    files(cp, tmp_path)(URL)  # and the new copy is recorded
    assert cp.calls["cache_file"] == 2


def test_a_copy_changed_on_disk_is_checked_by_salt_again(tmp_path):
    cp = Cp(tmp_path)
    files(cp, tmp_path)(URL)
    st = cp.copy.stat()
    cp.copy.write_bytes(b"tampered" * 1000)  # the same size: the mtime moves
    assert cp.copy.stat().st_mtime_ns != st.st_mtime_ns
    assert files(cp, tmp_path)(URL) == str(cp.copy)
    assert cp.calls["cache_file"] == 2
    assert cp.copy.read_bytes() == cp.master[URL]  # Salt's own check put the master's file back


def test_what_libvirt_does_to_a_backing_file_is_no_change(tmp_path):
    """Starting a VM relabels its backing chain (owner, xattrs: the ctime moves); the base overlays back onto
    is this copy's inode, hard-linked (vm/provision.base_image): that is no reason to read it whole again."""
    cp = Cp(tmp_path)
    files(cp, tmp_path)(URL)
    os.chmod(cp.copy, 0o444)
    os.chown(cp.copy, 107, 107)
    assert files(cp, tmp_path)(URL) == str(cp.copy)
    assert cp.calls["cache_file"] == 1


def test_a_copy_that_does_not_match_the_masters_hash_is_not_recorded(tmp_path):
    cp = Cp(tmp_path)
    real = cp.cache_file

    def stale(url, saltenv):  # the master's file changes while Salt fetches: the copy is the old one
        path = real(url, saltenv)
        cp.master[url] = b"image v2" * 1000
        return path

    cp.cache_file = stale
    files(cp, tmp_path)(URL)
    assert not (tmp_path / "cachedir" / "salt-virt" / saltcache.RECORD).exists()
    cp.cache_file = real
    files(cp, tmp_path)(URL)  # so the next use goes through Salt, which fetches the new file
    assert cp.copy.read_bytes() == cp.master[URL]
    assert cp.calls["cache_file"] == 2


def test_a_record_others_may_write_is_not_trusted(tmp_path):
    cp = Cp(tmp_path)
    files(cp, tmp_path)(URL)
    os.chmod(tmp_path / "cachedir" / "salt-virt", 0o777)
    files(cp, tmp_path)(URL)
    assert cp.calls["cache_file"] == 2


def test_an_image_the_master_does_not_have_is_what_cp_cache_file_says(tmp_path):
    cp = Cp(tmp_path)
    assert files(cp, tmp_path)("salt://images/missing.qcow2") is False
    assert cp.calls["cache_file"] == 1
