"""Pull-mode live backups (``virt:backup:mode: pull``, the default): libvirt has QEMU serve each disk, as
it was when the job began, over NBD on a private unix socket; salt-virt reads it and writes the backup
file itself.

Why not push mode (QEMU writes the file): a guest write to a block not yet copied waits until the old
block is in the backup file. Here it waits only for the copy into a local scratch file (fleecing, as
Proxmox VE and libvirt's pull mode do), and the reader never stalls the guest. And the backup file is
written front to back (:mod:`saltvirt.storage.qcow2stream`), so its sha256 is taken of the bytes as
they are written: one pass over the data, no second read of the file. An incremental file names its
parent as its backing file from its first byte (no ``qemu-img rebase`` afterwards).

The job ends with ``abortJob`` (libvirt's way to end a pull job); the scratch files and the socket go.
"""

import contextlib
import hashlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from typing import Any

from salt.exceptions import CommandExecutionError

from saltvirt.base import fsutil
from saltvirt.base.salttypes import Domain
from saltvirt.host.conn import libvirt, lv_errors
from saltvirt.storage import nbdread, qcow2stream
from saltvirt.xml import backupxml

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes per NBD read (QEMU serves up to 32 MiB; 16 MiB was slower and held the guest's writes longer)
# NBD reads in flight on the one connection (virt:backup:pull_depth). QEMU serves them and the guest's disk
# writes in one thread: 8 copied 1.3-1.7x faster than 1 here, but the guest then wrote at half the rate or less
DEPTH, MAX_DEPTH = 1, 16
WRITEBACK = 1 << 25  # bytes written between two starts of their write-back (the fsync at the end waits less)


def scratch_file(path: str) -> str:
    """The scratch file of a backup file ``<id>.<disk>.qcow2``: beside it, named by the same backup id
    (so an interrupted backup's scratch counts among its leftovers)."""
    return path.removesuffix(".qcow2") + ".scratch.qcow2"


class Pull:
    """One pull-mode job over the disks of ``files`` ({target dev: backup file}): :attr:`xml` to begin it
    with, :meth:`copy` to write the files once begun, :meth:`end` (always) to end the job and clean up."""

    def __init__(
        self,
        dom: Domain,
        files: dict[str, str],
        skip: list[str],
        incremental: str | None,
        owner: Any,
        depth: int = DEPTH,
    ):
        self.dom, self.files, self.depth = dom, files, depth
        self.scratch = {t: scratch_file(p) for t, p in files.items()}
        base = "/run" if os.access("/run", os.W_OK) else None  # a socket path has at most 107 bytes
        self.sockdir = tempfile.mkdtemp(prefix="salt-virt-nbd-", dir=base)
        if owner is not None:  # QEMU (running as the disks' owner) creates the socket; nobody else may enter
            os.chown(self.sockdir, owner.st_uid, owner.st_gid)
        self.socket = os.path.join(self.sockdir, "nbd.sock")
        self.xml = backupxml.pull_xml(self.socket, self.scratch, skip, incremental)
        self.incremental = incremental
        self.begun = False

    def copy(self, backings: dict[str, str | None], deadline: float) -> dict[str, str]:
        """Write every backup file from the job's NBD exports: ``{file: sha256}``. ``backings``: {target dev:
        the parent's file name (relative) or None}."""
        with lv_errors(f"read the backup job of VM {self.dom.name()!r}"):
            exports = backupxml.exports(self.dom.backupGetXMLDesc(0))
        digests = {}
        for target, path in self.files.items():
            export, bitmap = exports.get(target, (target, None))
            if self.incremental and not bitmap:
                raise CommandExecutionError(f"libvirt names no dirty bitmap for disk {target} of the incremental job")
            context = f"qemu:dirty-bitmap:{bitmap}" if self.incremental else nbdread.ALLOCATION
            try:
                digests[path] = copy_export(
                    self.socket, export, context, path, backings.get(target), deadline, self.depth
                )
            except OSError as exc:  # the NBD server, the socket or the backup directory (ENOSPC)
                raise CommandExecutionError(f"backup of disk {target} of VM {self.dom.name()} failed: {exc}") from None
        return digests

    def end(self, wait: float = 120.0) -> None:
        """End the job (when begun) and remove the scratch files and the socket directory."""
        try:
            if self.begun:
                self.dom.abortJob()
                until = time.monotonic() + wait
                while self.dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE and time.monotonic() < until:
                    time.sleep(0.01)
        except libvirt.libvirtError as exc:  # libvirtd gone: the next backup ends what is left
            log.warning("VM %s: could not end the pull backup job: %s", self.dom.name(), exc)
        finally:
            for path in self.scratch.values():
                if os.path.lexists(path):
                    os.unlink(path)
            shutil.rmtree(self.sockdir, ignore_errors=True)


def wanted(extents: list[tuple[int, int, int]], incremental: bool) -> list[tuple[int, int]]:
    """The byte ranges a backup copies: the dirty ones (incremental), else all but what reads as zeros."""
    if incremental:
        return [(o, n) for o, n, f in extents if f & nbdread.STATE_DIRTY]
    return [(o, n) for o, n, f in extents if not f & nbdread.STATE_ZERO]


def copy_export(
    socket: str, export: str, context: str, path: str, backing: str | None, deadline: float, depth: int = DEPTH
) -> str:
    """Write the qcow2 backup file ``path`` (new) from one NBD export; its sha256, taken as it is written.
    ``backing``: the parent backup's file (an incremental: only the dirty clusters are in this file).
    A pipeline: this thread keeps ``depth`` reads in flight on one NBD connection while another
    thread hashes and writes the chunks in file order (socket reads, hashing and writes all leave the
    GIL), starting their write-back as it goes; one fsync at the end."""
    with contextlib.ExitStack() as stack:
        nbd = stack.enter_context(nbdread.Client(socket, export, context))
        ranges = wanted(nbd.extents(), context != nbdread.ALLOCATION)
        layout = qcow2stream.Layout(nbd.size, qcow2stream.clusters_of(ranges, nbd.size), backing)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        stack.callback(os.close, fd)
        writer = stack.enter_context(_Writer(fd, buffers=depth + 2))
        writer.put(layout.metadata())
        pieces = qcow2stream.pieces(layout, CHUNK)
        for (_offset, _length, padding), data in zip(
            pieces, nbd.reads([(o, n) for o, n, _p in pieces], writer.buffer, depth), strict=True
        ):
            if time.monotonic() > deadline:
                raise CommandExecutionError(f"backup of {export} ran past its time (virt:backup:timeout)")
            writer.put(data)
            if padding:
                writer.put(bytes(padding))
        writer.close()
        os.fsync(fd)  # durable before the manifest says it is there, as QEMU's job flushes its target
    return writer.digest.hexdigest()


class _Writer:
    """Hashes and writes to ``fd``, in a thread of its own, what :meth:`put` hands it, in order; the read
    buffers (:meth:`buffer`) go round a small pool."""

    def __init__(self, fd: int, buffers: int = 3):
        self.fd, self.digest = fd, hashlib.sha256()
        self.error: Exception | None = None
        self.free: queue.Queue = queue.Queue()
        for _ in range(buffers):
            self.free.put(memoryview(bytearray(CHUNK)))
        self.work: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="backup-writer", daemon=True)

    def buffer(self) -> memoryview:
        while True:
            if self.error:
                raise self.error
            try:
                return self.free.get(timeout=1)
            except queue.Empty:
                continue

    def put(self, data: Any) -> None:
        if self.error:
            raise self.error
        self.work.put(data)

    def _run(self) -> None:
        written = started = 0  # bytes written; of them, whose write-back has been started
        while (data := self.work.get()) is not None:
            try:
                if not self.error:
                    self.digest.update(data)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(self.fd, view) :]
                    written += len(data)
                    if written - started >= WRITEBACK:
                        fsutil.start_writeback(self.fd, started, written - started)
                        started = written
            except Exception as exc:  # noqa: BLE001 - handed to the reading thread, which raises it
                self.error = exc
            if isinstance(data, memoryview) and isinstance(data.obj, bytearray) and len(data.obj) == CHUNK:
                self.free.put(memoryview(data.obj))  # a read buffer: back to the pool

    def __enter__(self) -> "_Writer":
        self.thread.start()
        return self

    def close(self) -> None:
        """Wait until everything put is written; raise what writing raised."""
        if self.thread.is_alive():
            self.work.put(None)
            self.thread.join()
        if self.error:
            raise self.error

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.work.put(None)
            self.thread.join()
