"""Hostile images built with the real qemu-img, and a real HTTP(S) server on 127.0.0.1 that serves
files, redirects, and streams bodies bigger than announced: for the image intake tests (unit and
integration)."""

import base64
import http.server
import os
import ssl
import subprocess
import threading

SECRET = b"root:$6$not-really$a-shadow-like-secret:19000:0:99999:7:::\n"


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def secret_file(folder):
    """An /etc/shadow-like host file the hostile images point at (never to be read into a VM)."""
    path = os.path.join(folder, "host-shadow")
    with open(path, "wb") as fh:
        fh.write(SECRET * 64)  # 4 KiB+: a disk that carried it would show the marker
    os.chmod(path, 0o600)
    return path


def backing_file_image(folder, target):
    """qcow2 whose header names ``target`` as its (raw) backing file."""
    path = os.path.join(folder, "evil-backing.qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", target, path, "1M"])
    return path


def data_file_image(folder):
    """qcow2 with an external data file (raw): the header names a host file, which holds the secret
    (qemu-img creates the file first, so the secret is written into it afterwards)."""
    path = os.path.join(folder, "evil-data.qcow2")
    data = os.path.join(folder, "host-data-file")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={data},data_file_raw=on", path, "1M"])
    with open(data, "r+b") as fh:
        fh.write(SECRET * 64)
    return path


def vmdk_descriptor_image(folder, target, comment=True):
    """A text vmdk descriptor saved as ``image.img``: one FLAT extent on the host file ``target``."""
    path = os.path.join(folder, "image.img" if comment else "plain.img")
    text = (
        ("# Disk DescriptorFile\n" if comment else "")
        + 'version=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicFlat"\n\n'
        + f'RW 8 FLAT "{target}" 0\n\nddb.adapterType = "ide"\n'
    )
    with open(path, "w") as fh:
        fh.write(text)
    return path


def other_format_image(folder, fmt="vpc"):
    path = os.path.join(folder, f"other.{fmt}")
    run(["qemu-img", "create", "-q", "-f", fmt, path, "1M"])
    return path


# HTTP(S) -----------------------------------------------------------------------------------------
class Handler(http.server.BaseHTTPRequestHandler):
    """``server.files[path] = bytes``; ``server.redirects[path] = location``; ``server.streams[path] =
    (chunk, count)``: sent without Content-Length (a server that lies about nothing and never ends
    in time). Requests are logged as (path, status, Authorization header) in ``server.log``."""

    protocol_version = "HTTP/1.0"

    def do_GET(self):
        srv = self.server
        auth = self.headers.get("Authorization")
        if self.path in srv.redirects:
            srv.log.append((self.path, 302, auth))
            self.send_response(302)
            self.send_header("Location", srv.redirects[self.path])
            self.end_headers()
            return
        if self.path in srv.streams:
            chunk, count = srv.streams[self.path]
            srv.log.append((self.path, 200, auth))
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(count):
                    self.wfile.write(chunk)
            except OSError:
                pass  # the client gave up (as it should)
            return
        body = srv.files.get(self.path)
        if body is None:
            srv.log.append((self.path, 404, auth))
            self.send_error(404)
            return
        srv.log.append((self.path, 200, auth))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server:
    """A started ThreadingHTTPServer on 127.0.0.1 (optionally TLS with a self-signed certificate for
    127.0.0.1 written to ``cert``). Use as a context manager: stopped on exit."""

    def __init__(self, folder=None, tls=False):
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.files, self.srv.redirects, self.srv.streams, self.srv.log = {}, {}, {}, []
        self.cert = None
        if tls:
            self.cert = os.path.join(folder, "cert.pem")
            key = os.path.join(folder, "key.pem")
            run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
                + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", self.cert]
            )
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.cert, key)
            self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        # shutdown() waits for serve_forever's next poll: the default 0.5 s was most of a test's time
        self.thread = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.files, self.redirects, self.streams, self.log = (
            self.srv.files,
            self.srv.redirects,
            self.srv.streams,
            self.srv.log,
        )

    def url(self, path, userinfo=None):
        scheme = "https" if self.cert else "http"
        who = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{who}127.0.0.1:{self.srv.server_port}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(timeout=10)


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
