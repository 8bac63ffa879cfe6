"""A minimal VNC (RFB 3.8) client over QEMU's websocket, for the console tickets' security tests
(tests/integration/test_tenants.py): does a password open a VM's console? Handshake and VNC authentication
only, nothing is drawn. websocket-client comes with selenium (requirements-test.txt)."""

import struct

from cryptography.hazmat.primitives.ciphers import Cipher, modes

try:  # cryptography >= 43
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.algorithms import TripleDES  # type: ignore[attr-defined,no-redef]

VNC_AUTH = 2


class Refused(Exception):  # noqa: N818 - reads as what it says
    """The server refused the password (its reason is the message)."""


class _Stream:
    def __init__(self, ws):
        self.ws, self.buf = ws, b""

    def read(self, n):
        while len(self.buf) < n:
            data = self.ws.recv()
            self.buf += data if isinstance(data, bytes) else data.encode()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, data):
        self.ws.send_binary(data)


def _des_response(password, challenge):
    """VNC authentication: the challenge DES-encrypted with the password (8 bytes, each bit-reversed)."""
    key = bytes(int(f"{b:08b}"[::-1], 2) for b in password.encode()[:8].ljust(8, b"\0"))
    enc = Cipher(TripleDES(key * 3), modes.ECB()).encryptor()  # three equal keys: single DES
    return enc.update(challenge) + enc.finalize()


def login(url, password, timeout=30, sslopt=None):
    """Open ``url`` (``ws://host:port/``; ``wss://`` with ``sslopt`` as websocket-client takes it, e.g.
    ``{"ca_certs": path}``) and authenticate with ``password``; returns the desktop's name, or raises
    :class:`Refused` (or the connection's own error)."""
    import websocket

    ws = websocket.create_connection(url, timeout=timeout, subprotocols=["binary"], sslopt=sslopt)
    try:
        s = _Stream(ws)
        version = s.read(12)
        if not version.startswith(b"RFB 003."):
            raise Refused(f"not a VNC server: {version!r}")
        s.send(b"RFB 003.008\n")
        (count,) = struct.unpack("!B", s.read(1))
        if count == 0:
            (length,) = struct.unpack("!I", s.read(4))
            raise Refused(s.read(length).decode(errors="replace"))
        types = s.read(count)
        if VNC_AUTH not in types:
            raise Refused(f"no VNC password authentication offered: {list(types)}")
        s.send(bytes([VNC_AUTH]))
        s.send(_des_response(password, s.read(16)))
        (result,) = struct.unpack("!I", s.read(4))
        if result != 0:
            (length,) = struct.unpack("!I", s.read(4))
            raise Refused(s.read(length).decode(errors="replace") or "authentication failed")
        s.send(b"\x01")  # ClientInit: shared
        _w, _h = struct.unpack("!HH", s.read(4))
        s.read(16)  # pixel format
        (length,) = struct.unpack("!I", s.read(4))
        return s.read(length).decode(errors="replace")
    finally:
        ws.close()
