"""Ports for the servers tests start (bookies, ZooKeeper, HTTP admin), outside the
kernel's ephemeral range.

bind(("", 0)) hands out a port from the ephemeral range, the same range the kernel
draws the local ports of outgoing connections from. A test that kills a bookie and
restarts it on its old port could then find that port held meanwhile by some client's
outgoing connection (the restart cannot bind), or by a server of another test run on
the machine. No outgoing connection ever gets a port below the range, so a port picked
there at random and checked by binding can only clash with another server that picked
the same one, and the check catches a clash that exists when the port is picked.

A port picked but not yet bound (a cluster picks a bookie's port and its HTTP port
before it starts the bookie) would pass that check again, so this process never hands
out the same port twice. Under pytest-xdist (scripts/test runs test files in several worker
processes at once) that memory is per process, and a worker could pick the port of a bookie
another worker killed and is about to restart: so each worker draws from a slice of the range
of its own (PYTEST_XDIST_WORKER gwK of PYTEST_XDIST_WORKER_COUNT), and workers never pick alike.
The chaos runner's worker processes narrow that slice again (`narrow(k, n)`, k the worker's
slot among n live ones): a process-cluster run picks a bookie's port a second before the bookie
binds it, and another worker picking the same port meanwhile took it (seed 109795, EADDRINUSE).

`well_known_ports()` serialises the tests that start `bk standalone` on BookKeeper's default
ports (2181, 3181, 8180): across worker processes they would take each other's.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile

_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below: well-known and registered services a machine may run
_TRIES = 200
_rng = random.SystemRandom()  # not the tests' seeded `random`: seeds must not pick ports
_handed_out: set[int] = set()  # every port free_port returned in this process
_narrowed: tuple[int, int] | None = None  # (k, n): this process takes the k-th of n parts of its slice


def ephemeral_range() -> tuple[int, int]:
    try:
        with open(_RANGE_FILE, encoding="ascii") as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on or is bound to `port` now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _part(low: int, high: int, k: int, n: int) -> tuple[int, int]:
    if n <= 1 or not 0 <= k < n:
        return low, high
    width = (high - low) // n
    return low + k * width, low + (k + 1) * width


def worker_slice(low: int, high: int) -> tuple[int, int]:
    """[low, high) itself, or this pytest-xdist worker's own slice of it (disjoint per worker),
    narrowed to this process's part of that slice when `narrow` was called."""
    try:
        k = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
        n = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        k = n = 1
    low, high = _part(low, high, k, n)
    if _narrowed is not None:
        low, high = _part(low, high, *_narrowed)
    return low, high


def narrow(k: int, n: int) -> None:
    """From now on this process picks ports only from the k-th of n equal parts of its slice:
    for processes forked from one parent that each start servers, k distinct among the live ones."""
    global _narrowed
    if not 0 <= k < n:
        raise ValueError(f"part {k} of {n}")
    _narrowed = (k, n)


@contextlib.contextmanager
def well_known_ports():
    """Held while a test runs `bk standalone` on its default ports: an exclusive lock on one
    file in the temp dir, shared by every test process on the machine (flock: released when
    the holder dies, so a killed run leaves no stale lock)."""
    path = os.path.join(tempfile.gettempdir(), "bk-tests-well-known-ports.lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on or is bound to now, outside the ephemeral range when the
    range leaves room below it (else the kernel's choice)."""
    low, _high = ephemeral_range()
    if low - _LOWEST >= 1000:
        start, stop = worker_slice(_LOWEST, low)
        for _ in range(_TRIES):
            port = _rng.randrange(start, stop)
            if port not in _handed_out and port_is_free(port, host):
                _handed_out.add(port)
                return port
    for _ in range(_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port found in {_TRIES} tries")
