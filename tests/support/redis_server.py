"""A real redis-server for tests: 127.0.0.1, a free port, its own temp dir, no automatic persistence (an explicit
SAVE is loaded again by a restart); stopped by pid."""

import os
import shutil
import socket
import subprocess
import tempfile
import time


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="svredis-")
        self.port = _free_port()
        self.proc = None

    def start(self):
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        args = [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir, "--save", ""]
        args += ["--appendonly", "no", "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis("127.0.0.1", self.port)
        for _ in range(200):
            try:
                if client.ping():
                    return self
            except redis.exceptions.ConnectionError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port} (log in {self.dir})")

    def client(self):
        import redis

        return redis.Redis("127.0.0.1", self.port)

    def master_opts(self):
        """The master config a redis-backed salt.cache needs."""
        return {"cache": "redis", "cache.redis.host": "127.0.0.1", "cache.redis.port": self.port, "cache.redis.db": "0"}

    def crash(self):
        """SIGKILL it (a crash: clients get "connection refused" from now on); its directory stays, so
        :meth:`start` brings it back on the same port with its last snapshot (``client().save()``)."""
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
