"""Ports for the tests' salt daemons that no outgoing connection can take.

salt-factories (``saltfactories.daemons.master``, ``minion``, ...) picks each daemon's ports with
pytest-shell-utilities' ``ports.get_unused_localhost_port``: a bind to port 0, so the kernel hands out a port of its
ephemeral range (``net.ipv4.ip_local_port_range``), and closes it at once. The daemon binds it seconds later. Meanwhile
any outgoing connection on the machine (a minion to its master, libvirt, a browser) may get that very port as its
local one, and the daemon cannot bind it (run F1: tut-master's ``Address already in use`` on 60141).
:func:`install` hands out ports below the ephemeral range instead, where the kernel never puts an outgoing
connection: each xdist worker in a block of its own (two workers never choose the same port), one after the other,
each checked free on every address first (a listener of something else is skipped).
"""

import functools
import itertools
import os
import socket

FIRST = 20000  # below the kernel's ephemeral range (Linux default 32768-60999; checked in install)
BLOCK = 1500  # ports per worker: a run starts a few hundred daemons at most


def _worker() -> int:
    """This process's xdist worker number (``gw3`` -> 3), 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
        low, high = fh.read().split()
    return int(low), int(high)


def free(port: int) -> bool:
    """Whether ``port`` can be bound on every address (what a salt-master's ``0.0.0.0`` bind needs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))  # the daemons bind every address
        except OSError:
            return False
    return True


def allocator(start: int, size: int = BLOCK):
    """``next()``: the next free port of ``start .. start + size - 1``, round and round."""
    return (port for port in itertools.cycle(range(start, start + size)) if free(port))


def install() -> None:
    from pytestshellutils.utils import ports

    if getattr(ports.get_unused_localhost_port, "below_ephemeral", False):
        return
    low, _high = ephemeral_range()
    worker = _worker()
    if FIRST + (worker + 1) * BLOCK > low:  # a machine with a wider ephemeral range: keep the library's choice
        return
    chosen = allocator(FIRST + worker * BLOCK)

    @functools.wraps(ports.get_unused_localhost_port)
    def below_ephemeral(use_cache: bool = False) -> int:  # sequential: use_cache (no port twice) holds anyway
        return next(chosen)

    below_ephemeral.below_ephemeral = True  # type: ignore[attr-defined]
    ports.get_unused_localhost_port = below_ephemeral
