"""A minimal NBD client (read-only) for the exports QEMU serves over a unix socket: a pull-mode backup's
view of the VM's disks as they were when the job began (https://github.com/NetworkBlockDevice/nbd,
doc/proto.md). Fixed newstyle handshake, structured replies, block status with one meta context
(``base:allocation`` or a ``qemu:dirty-bitmap:<name>``), reads (several in flight). No qemu-nbd or libnbd: the first
does not run here and neither is needed for this much of the protocol.
"""

import contextlib
import socket
import struct
from collections.abc import Callable, Iterable, Iterator

NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x3E889045565A9
FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES = 1, 2
OPT_GO, OPT_STRUCTURED_REPLY, OPT_SET_META_CONTEXT = 7, 8, 10
REP_ACK, REP_INFO, REP_META_CONTEXT = 1, 3, 4
INFO_EXPORT = 0
REQUEST_MAGIC, SIMPLE_MAGIC, STRUCTURED_MAGIC = 0x25609513, 0x67446698, 0x668E33EF
CMD_READ, CMD_DISC, CMD_BLOCK_STATUS = 0, 2, 7
REPLY_FLAG_DONE = 1
CHUNK_NONE, CHUNK_DATA, CHUNK_HOLE, CHUNK_BLOCK_STATUS = 0, 1, 2, 5
STATE_HOLE, STATE_ZERO = 1, 2  # base:allocation
STATE_DIRTY = 1  # qemu:dirty-bitmap:*
ALLOCATION = "base:allocation"


class NBDError(OSError):
    pass


def _raise_if_error(ctype: int, payload: bytes) -> None:
    """A structured reply's error chunk (type bit 15: the error code, then a message) as :class:`NBDError`."""
    if ctype & (1 << 15):
        error = struct.unpack(">I", payload[:4])[0]
        raise NBDError(f"NBD request failed (error {error}): {payload[6:].decode(errors='replace')}")


class Client:
    """One export of the server at unix socket ``path``; ``context``: the meta context whose block status
    :meth:`extents` reports."""

    def __init__(self, path: str, export: str, context: str = ALLOCATION, timeout: float = 600.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.cookie = 0
        try:
            self.sock.connect(path)
            self.size, self.context_id = self._handshake(export.encode(), context.encode())
        except BaseException:
            self.sock.close()
            raise

    # the wire ---------------------------------------------------------------------------------------
    def _recv(self, n: int, into: memoryview | None = None) -> memoryview:
        buf = into if into is not None else memoryview(bytearray(n))
        got = 0
        while got < n:
            k = self.sock.recv_into(buf[got:n])
            if not k:
                raise NBDError("the NBD server closed the connection")
            got += k
        return buf[:n]

    def _option(self, opt: int, data: bytes) -> Iterator[tuple[int, bytes]]:
        self.sock.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)
        while True:
            magic, ropt, rtype, length = struct.unpack(">QIII", self._recv(20))
            payload = bytes(self._recv(length)) if length else b""
            if magic != OPT_REPLY_MAGIC or ropt != opt:
                raise NBDError(f"bad NBD option reply to {opt}")
            if rtype & (1 << 31):
                raise NBDError(f"NBD option {opt} refused ({rtype & 0x7FFFFFFF}): {payload[:200]!r}")
            if rtype == REP_ACK:
                return
            yield rtype, payload

    def _handshake(self, export: bytes, context: bytes) -> tuple[int, int]:
        magic, opt_magic, flags = struct.unpack(">8sQH", self._recv(18))
        if magic != NBDMAGIC or opt_magic != IHAVEOPT or not flags & FLAG_FIXED_NEWSTYLE:
            raise NBDError("not a fixed-newstyle NBD server")
        self.sock.sendall(struct.pack(">I", FLAG_FIXED_NEWSTYLE | (flags & FLAG_NO_ZEROES)))
        list(self._option(OPT_STRUCTURED_REPLY, b""))
        query = struct.pack(">I", len(export)) + export + struct.pack(">II", 1, len(context)) + context
        ids = [
            struct.unpack(">I", p[:4])[0] for t, p in self._option(OPT_SET_META_CONTEXT, query) if t == REP_META_CONTEXT
        ]
        if len(ids) != 1:
            raise NBDError(f"the NBD server does not offer {context.decode()!r} on export {export.decode()!r}")
        size = None
        for rtype, payload in self._option(OPT_GO, struct.pack(">I", len(export)) + export + struct.pack(">H", 0)):
            if rtype == REP_INFO and struct.unpack(">H", payload[:2])[0] == INFO_EXPORT:
                size = struct.unpack(">Q", payload[2:10])[0]
        if size is None:
            raise NBDError(f"the NBD server gave no size for export {export.decode()!r}")
        return size, ids[0]

    def _request(self, cmd: int, offset: int, length: int) -> int:
        self.cookie += 1
        self.sock.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, cmd, self.cookie, offset, length))
        return self.cookie

    def _chunks(self, cookie: int) -> Iterator[tuple[int, bytes]]:
        """The reply chunks of request ``cookie`` (block status: no data) as ``(type, payload)``."""
        while True:
            magic = struct.unpack(">I", self._recv(4))[0]
            if magic == SIMPLE_MAGIC:
                error, got = struct.unpack(">IQ", self._recv(12))
                if got != cookie or error:
                    raise NBDError(f"NBD request failed (error {error})")
                return
            if magic != STRUCTURED_MAGIC:
                raise NBDError(f"bad NBD reply magic {magic:#x}")
            flags, ctype, got, length = struct.unpack(">HHQI", self._recv(16))
            if got != cookie:
                raise NBDError("NBD reply to another request")
            payload = bytes(self._recv(length)) if length else b""
            _raise_if_error(ctype, payload)
            yield ctype, payload
            if flags & REPLY_FLAG_DONE:
                return

    # the face ---------------------------------------------------------------------------------------
    def extents(self, step: int = 1 << 30) -> list[tuple[int, int, int]]:
        """``(offset, length, flags)`` of the whole export, in the meta context's terms."""
        out: list[tuple[int, int, int]] = []
        offset = 0
        while offset < self.size:
            length = min(step, self.size - offset)
            got = offset
            for ctype, payload in self._chunks(self._request(CMD_BLOCK_STATUS, offset, length)):
                if ctype != CHUNK_BLOCK_STATUS or struct.unpack(">I", payload[:4])[0] != self.context_id:
                    continue
                for i in range(4, len(payload) - 7, 8):
                    n, flags = struct.unpack(">II", payload[i : i + 8])
                    out.append((got, n, flags))
                    got += n
            if got <= offset:
                raise NBDError(f"the NBD server gave no block status at {offset}")
            offset = got
        return out

    def read(self, offset: int, length: int, into: memoryview | None = None) -> memoryview:
        """``length`` bytes at ``offset`` (holes the server reports read as zeros)."""
        buf = into[:length] if into is not None else memoryview(bytearray(length))
        return next(self.reads([(offset, length)], lambda: buf, 1))

    def reads(
        self, ranges: Iterable[tuple[int, int]], buffer: Callable[[], memoryview], depth: int = 4
    ) -> Iterator[memoryview]:
        """The bytes of each ``(offset, length)`` of ``ranges``, in order, each read into a buffer
        ``buffer()`` gives (at least ``length`` long; it is the caller's again once yielded). Up to
        ``depth`` requests are in flight on this one connection: QEMU serves each in a coroutine of its
        own, so its reads of the disk overlap the sending of earlier replies (one request at a time left it
        idle between them). Replies may come out of order; they are matched by cookie."""
        todo = iter(ranges)
        pending: dict[int, list] = {}  # cookie: [view, offset, done]
        order: list[int] = []  # cookies in request order
        while True:
            while len(order) < depth and (nxt := next(todo, None)) is not None:
                offset, length = nxt
                view = buffer()[:length]
                if len(view) != length:
                    raise ValueError(f"a read buffer of {len(view)} bytes for a {length}-byte read")
                cookie = self._request(CMD_READ, offset, length)
                pending[cookie] = [view, offset, False]
                order.append(cookie)
            if not order:
                return
            while not pending[order[0]][2]:
                self._reply(pending)
            yield pending.pop(order.pop(0))[0]

    def _reply(self, pending: dict[int, list]) -> None:
        """Read one reply chunk of any read request in ``pending`` into its buffer (marked done on its last
        chunk)."""
        magic = struct.unpack(">I", self._recv(4))[0]
        if magic == SIMPLE_MAGIC:
            error, cookie = struct.unpack(">IQ", self._recv(12))
            if cookie not in pending or error:
                raise NBDError(f"NBD request failed (error {error})")
            req = pending[cookie]
            self._recv(len(req[0]), req[0])  # a simple reply carries the whole read
            req[2] = True
            return
        if magic != STRUCTURED_MAGIC:
            raise NBDError(f"bad NBD reply magic {magic:#x}")
        flags, ctype, cookie, length = struct.unpack(">HHQI", self._recv(16))
        if cookie not in pending:
            raise NBDError("NBD reply to another request")
        view, base = pending[cookie][0], pending[cookie][1]
        if ctype == CHUNK_DATA:
            start = struct.unpack(">Q", self._recv(8))[0] - base
            if start < 0 or start + length - 8 > len(view):
                raise NBDError("NBD data outside the request")
            self._recv(length - 8, view[start:])
        else:
            payload = bytes(self._recv(length)) if length else b""
            _raise_if_error(ctype, payload)
            if ctype == CHUNK_HOLE:
                start, n = struct.unpack(">QI", payload[:12])
                if start < base or start - base + n > len(view):
                    raise NBDError("NBD hole outside the request")
                view[start - base : start - base + n] = bytes(n)
        if flags & REPLY_FLAG_DONE:
            pending[cookie][2] = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._request(CMD_DISC, 0, 0)
        self.sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
