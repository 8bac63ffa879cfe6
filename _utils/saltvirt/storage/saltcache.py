"""A ``salt://`` image through Salt's minion file cache, without reading the cached copy whole on every use.

Salt's ``cp.cache_file`` hashes its cached copy in full on every call to compare it with the master's file (a
200 MiB image: ~0.1 s before each ``virt.init``; 20 GiB: minutes). Here the master's hash is asked alone (the
file client's ``hash_file``, as ``cp.hash_file`` asks it: the master's fileserver keeps it) and compared with
the digest this module recorded when the copy was last fetched, under the copy's identity on disk: device,
inode, size and mtime (a write changes the mtime, a new file the inode; not the ctime: libvirt relabels a VM's
backing chain when the VM starts, and the overlays' base is this very inode, hard-linked). Only a match uses
the copy as it is; anything else goes through ``cp.cache_file`` as before, then the copy's digest is taken and
recorded anew. The record lives beside Salt's file cache, in salt-virt's folder of the minion's cachedir
(root's alone), and is trusted only there (:func:`saltvirt.base.fsutil.load_own_json`); nothing of it goes to
``virt:images``."""

import dataclasses
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from saltvirt.base import fsutil

log = logging.getLogger(__name__)
RECORD = "salt-files.json"
HASHES = ("sha256", "sha384", "sha512", "sha224", "sha1", "md5")  # what a master's hash_type may be


@dataclasses.dataclass(frozen=True)
class SaltFiles:
    """Salt's file client for one saltenv, called as ``cp.cache_file`` is: ``files(url)`` -> the local path (or a
    false value when the master has no such file). ``client()``: a new Salt file client
    (``salt.fileclient.get_file_client``), one for the three questions of a call (each ``cp.*`` function
    builds its own, and authenticates it: a private key load each). ``record_dir``: where digests are kept."""

    client: Callable[[], Any]
    saltenv: str
    record_dir: str

    def __call__(self, url: str) -> Any:
        with self.client() as client:
            local = client.is_cached(url, self.saltenv)
            master = _master_hash(client.hash_file(url, self.saltenv)) if local and os.path.isfile(local) else None
            recorded = _recorded(self.record_dir, local) if master else None
            if master and recorded == [fsutil.identity(local), *master]:
                return local
            log.debug("%s: Salt checks its cached copy in full (recorded %s, now %s)", url, recorded, master)
            local = client.cache_file(url, self.saltenv)
            if local and os.path.isfile(local):
                master = master or _master_hash(client.hash_file(url, self.saltenv))
                if master:
                    self._record(local, master)
            return local

    def _record(self, local: str, master: list[str]) -> None:
        """The copy's digest, in the master's hash type, under its identity now; a digest that differs
        from the master's (the file changed there meanwhile) is not recorded: the next use asks again."""
        before = fsutil.identity(local)
        digest = fsutil.file_digest(local, master[0])
        if digest != master[1] or fsutil.identity(local) != before:
            return
        try:
            os.makedirs(self.record_dir, mode=0o700, exist_ok=True)
            records = fsutil.load_own_json(self.record_dir, RECORD)
            records = {path: rec for path, rec in records.items() if os.path.exists(path)}
            records[local] = [before, *master]
            fsutil.atomic_write(os.path.join(self.record_dir, RECORD), json.dumps(records).encode(), 0o600)
        except OSError as exc:  # a record not kept costs the next use a full check, nothing else
            log.debug("could not record the digest of %s: %s", local, exc)


def salt_files(opts: Any, saltenv: str) -> SaltFiles:
    """:class:`SaltFiles` of a loader module's ``__opts__`` for ``saltenv``, recorded beside Salt's own file
    cache (the minion's ``cachedir``, in salt-virt's folder there)."""
    import salt.fileclient  # noqa: PLC0415 - the minion side only

    return SaltFiles(
        client=lambda: salt.fileclient.get_file_client(opts),
        saltenv=saltenv,
        record_dir=os.path.join(opts["cachedir"], "salt-virt"),
    )


def _master_hash(answer: Any) -> list[str] | None:
    if not isinstance(answer, dict) or answer.get("hash_type") not in HASHES or not answer.get("hsum"):
        return None
    return [str(answer["hash_type"]), str(answer["hsum"])]


def _recorded(record_dir: str, local: str) -> Any:
    return fsutil.load_own_json(record_dir, RECORD).get(local)
