"""A real QEMU NBD server for unit tests: qemu-storage-daemon exporting a qcow2 file over a unix socket,
as a libvirt pull-mode backup job has QEMU do."""

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator


@contextlib.contextmanager
def serve(disk: str, sock: str, bitmaps: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve the qcow2 ``disk`` read-write as export ``disk`` (writes through it mark ``bitmaps``, which
    are exported as ``qemu:dirty-bitmap:<name>``); yields the export's URL."""
    export = "type=nbd,id=e,node-name=d,name=disk,writable=on" + "".join(
        f",bitmaps.{i}={b}" for i, b in enumerate(bitmaps)
    )
    proc = subprocess.Popen(
        [
            "qemu-storage-daemon",
            "--blockdev",
            f"driver=file,filename={disk},node-name=f",
            "--blockdev",
            "driver=qcow2,file=f,node-name=d",
            "--nbd-server",
            f"addr.type=unix,addr.path={sock}",
            "--export",
            export,
        ]  # fmt: skip
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, "qemu-storage-daemon did not start"
            time.sleep(0.05)
        yield f"nbd+unix:///disk?socket={sock}"
    finally:
        proc.terminate()
        proc.wait(30)
