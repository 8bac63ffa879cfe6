"""A real minion event bus (what a running salt-minion has) in a thread of the test process."""

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time


@contextlib.contextmanager
def minion_bus(opts, timeout=30):
    """Serve the minion event bus of ``opts`` (``sock_dir``, ``id``) until the block ends; yields
    ``received``: every (tag, data) published on it, in order."""
    import salt.transport
    import salt.utils.event
    import tornado.ioloop

    ready, loops, received = threading.Event(), [], []

    def run():
        asyncio.set_event_loop(asyncio.new_event_loop())
        io_loop = tornado.ioloop.IOLoop.current()
        loops.append(io_loop)
        pub = salt.transport.ipc_publish_server("minion", opts)

        async def publish(payload):  # what the bus publishes, recorded (then published as a minion does)
            tag, data = salt.utils.event.SaltEvent.unpack(payload)
            received.append((tag, data))
            await pub.publish_payload(payload)

        io_loop.add_callback(lambda: asyncio.ensure_future(pub.publisher(publish, io_loop=io_loop)))
        io_loop.add_callback(ready.set)
        io_loop.start()
        pub.close()

    thread = threading.Thread(target=run, daemon=True, name="minion-event-bus")
    thread.start()
    if not ready.wait(timeout):
        raise RuntimeError("the minion event bus did not start")
    deadline = time.monotonic() + timeout
    while not _accepting(opts["sock_dir"]):  # the socket file exists from bind(), before listen()
        if time.monotonic() > deadline:
            raise RuntimeError("the minion event bus did not open its pull socket")
        time.sleep(0.01)
    try:
        yield received
    finally:
        loops[0].add_callback(loops[0].stop)
        thread.join(timeout)


def _accepting(sock_dir):
    """Whether the bus's pull socket in ``sock_dir`` takes connections yet."""
    for name in os.listdir(sock_dir):
        if name.endswith("_pull.ipc"):
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(os.path.join(sock_dir, name))
                    return True
                except OSError:
                    return False
    return False


@contextlib.contextmanager
def short_sock_dir():
    """A socket directory with a short path: AF_UNIX paths end at 107 bytes, and pytest's tmp_path
    under xdist (``/tmp/pytest-of-root/pytest-N/popen-gwN/<test name>/``) can be longer than that."""
    path = tempfile.mkdtemp(prefix="svbus-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
