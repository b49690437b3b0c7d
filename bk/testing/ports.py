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
out the same port twice.
"""
from __future__ import annotations

import random
import socket

_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below: well-known and registered services a machine may run
_TRIES = 200
_rng = random.SystemRandom()  # not the tests' seeded `random`: seeds must not pick ports
_handed_out: set[int] = set()  # every port free_port returned in this process


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on or is bound to now, outside the ephemeral range when the
    range leaves room below it (else the kernel's choice)."""
    low, _high = ephemeral_range()
    if low - _LOWEST >= 1000:
        for _ in range(_TRIES):
            port = _rng.randrange(_LOWEST, low)
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
