"""The Salt CLIs the tests run (``salt``, ``salt-run``, ``salt-call``, ``salt-key`` through salt-factories),
forked from one process per pytest worker that imported Salt once, instead of a new interpreter per call.

Why: a CLI call costs ~1.3 CPU-seconds, ~0.7 of them Python's start and Salt's imports; the suite makes
hundreds and is CPU-bound on 2 cores (issue 33: every CPU-second of the suite is half a second of its wall).
What still runs is the real CLI: salt-factories' own script for it, its argv, environment, working
directory and output files, in its own process (its pid is what salt-factories watches and kills); only
the imports happened before the fork. Daemons are never forked from here.

``install()`` (tests/conftest.py) swaps the ``subprocess`` that pytestshellutils uses for a shim whose
``Popen`` sends these CLI command lines to the zygote and everything else to :class:`subprocess.Popen`.
``RUN_TESTS_CLI_ZYGOTE=0`` turns it off (every CLI a fresh interpreter, as before).
"""

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import types

CLI_SCRIPTS = {"cli_salt.py", "cli_salt_run.py", "cli_salt_call.py", "cli_salt_key.py"}
# what every one of those scripts imports before it parses its arguments
PRELOAD = (
    "salt.scripts",
    "salt.cli.salt",
    "salt.cli.run",
    "salt.cli.call",
    "salt.cli.key",
    "salt.client",
    "salt.runner",
    "salt.config",
    "salt.loader",
    "salt.minion",
    "salt.key",
    "salt.output",
    "salt.utils.event",
    "salt.utils.parsers",
    "salt.transport.zeromq",
    "salt.fileclient",
)
STARTUP_WAIT = 120  # seconds for the zygote's imports on a loaded machine; past it, CLIs run as before
_EXIT = struct.Struct("!q")


# the zygote (its own process) --------------------------------------------------------------------
def serve(path, parent):
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path + ".tmp")
    srv.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears when it accepts
    waiting = {}  # child pid -> the connection that asked for it
    while os.getppid() == parent:  # the pytest worker that started it is gone: so is it
        if select.select([srv], [], [], 0.05)[0]:
            conn, _ = srv.accept()
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
            pid = os.fork()
            if pid == 0:
                srv.close()
                conn.close()
                _child(json.loads(msg), fds)
            for fd in fds:
                os.close(fd)
            conn.send(_EXIT.pack(pid))
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send(_EXIT.pack(os.waitstatus_to_exitcode(status)))
                conn.close()


def _child(req, fds):
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen(close_fds=True): other CLIs' connections too
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = req["argv"][1:]
        import runpy

        runpy.run_path(sys.argv[0], run_name="__main__")  # salt-factories' script ends with os._exit()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - said on the CLI's stderr, as Python would
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# the pytest worker's side ------------------------------------------------------------------------
class Zygote:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="svzyg")
        self.path = os.path.join(self.dir, "sock")
        log = open(os.path.join(self.dir, "log"), "wb")  # noqa: SIM115 - the zygote's stderr, kept open
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # a CLI's signals (a test's Ctrl-C) are not the zygote's
        )
        log.close()
        atexit.register(self.stop)

    def ready(self):
        deadline = time.monotonic() + STARTUP_WAIT
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class ZygoteProcess:
    """What pytestshellutils uses of a :class:`subprocess.Popen`, for a CLI forked by the zygote."""

    def __init__(self, zygote, args, stdout, stderr, cwd, env):
        self.args, self.returncode = args, None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._conn.connect(zygote.path)
        req = {"argv": [str(a) for a in args], "cwd": str(cwd or os.getcwd()), "env": dict(env or os.environ)}
        socket.send_fds(self._conn, [json.dumps(req).encode()], [stdout.fileno(), stderr.fileno()])
        self.pid = _EXIT.unpack(self._conn.recv(_EXIT.size))[0]

    def wait(self, timeout=None):
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                data = self._conn.recv(_EXIT.size)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            # no answer: the zygote died with the CLI running; the CLI is its child and died with it
            self.returncode = _EXIT.unpack(data)[0] if data else -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def poll(self):
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def communicate(self, input=None, timeout=None):
        self.wait(timeout)
        return None, None

    def send_signal(self, sig):
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def _translate_newlines(self, data, encoding, errors):
        return data.decode(encoding, errors).replace("\r\n", "\n").replace("\r", "\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._conn.close()


_zygote = None


def _is_cli(args, shell):
    return not shell and isinstance(args, list | tuple) and len(args) > 1 and os.path.basename(args[1]) in CLI_SCRIPTS


def popen(args, *, stdout=None, stderr=None, cwd=None, env=None, shell=False, **kwargs):
    global _zygote
    if _is_cli(args, shell) and hasattr(stdout, "fileno") and hasattr(stderr, "fileno"):
        if _zygote is None:
            _zygote = Zygote()
        if _zygote.ready():
            return ZygoteProcess(_zygote, args, stdout, stderr, cwd, env)
    return subprocess.Popen(args, stdout=stdout, stderr=stderr, cwd=cwd, env=env, shell=shell, **kwargs)


def install():
    """pytestshellutils' CLIs through the zygote (see the module docstring)."""
    if os.environ.get("RUN_TESTS_CLI_ZYGOTE", "1") == "0":
        return
    from pytestshellutils import shell

    shim = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in dir(subprocess) if not k.startswith("__")})
    shim.Popen = popen
    shell.subprocess = shim


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
