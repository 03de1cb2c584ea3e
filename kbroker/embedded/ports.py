"""Ports for embedded brokers: free now, and outside the range the kernel gives outgoing
connections, so a node restarted on its port finds it free."""

from __future__ import annotations

import collections
import os
import random
import socket
from pathlib import Path


def bind(port: int) -> int | None:
    """The port bound (a free one for 0), or None if it is taken. SO_REUSEADDR as the JVM sets
    it, so a port left in TIME_WAIT by a stopped broker counts as free."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return int(s.getsockname()[1])


def _ephemeral_low(default: int = 32768) -> int:
    """The first port of the kernel's range for outgoing connections' local ports."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def port_range() -> tuple[int, int]:
    """Where free_port looks: KBROKER_PORT_RANGE ("low-high", high excluded) when set, so
    processes run side by side (the test suite's workers) never pick each other's ports; else
    20000 up to the kernel's ephemeral range."""
    low, high = 20000, min(_ephemeral_low(), 65536)
    wanted = os.environ.get("KBROKER_PORT_RANGE", "")
    try:
        a, b = (int(x) for x in wanted.split("-"))
    except ValueError:
        return low, high
    return (a, b) if 1024 <= a < b <= 65536 else (low, high)


def free_port(tries: int = 200) -> int:
    """A port free on 127.0.0.1 now, below the kernel's ephemeral range when it can be: a port
    the kernel hands out (bind to 0) may be taken, while its listener is down, as the local port
    of some client's outgoing connection, and a node restarted on it then fails to bind."""
    start, end = port_range()
    if end > start:
        for _ in range(tries):
            port = bind(random.randrange(start, end))
            if port is not None and port not in _handed_out:
                return _hand_out(port)
    while True:  # no free port there: any the kernel gives
        port = bind(0)
        if port is not None and port not in _handed_out:
            return _hand_out(port)


# Ports free_port returned lately: a caller asking for several before binding any (a broker's
# client, controller and TLS ports) must get different ones, which a random pick in a small
# range did not always give.
_handed_out: collections.deque[int] = collections.deque(maxlen=64)


def _hand_out(port: int) -> int:
    _handed_out.append(port)
    return port


def claim_port(wanted: int, taken: set[int]) -> int:
    """`wanted` when it exists, is free and not `taken`, else any free port not `taken`; added
    to `taken`."""
    free = bind(wanted) if wanted <= 65535 and wanted not in taken else None
    while free is None or free in taken:
        free = free_port()
    taken.add(free)
    return free


def accepts(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port`."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False
