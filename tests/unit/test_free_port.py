"""Ports for embedded brokers: free, and outside the range the kernel gives outgoing connections
(a client's connection could otherwise hold a stopped node's port when it restarts)."""

import itertools
import random
import socket

from kbroker.embedded import ports


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_listened_on():
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert 0 < port < 65536
        if low > 20000:
            assert 20000 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_taken_port_is_never_given(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        real = random.Random(7)
        picks = itertools.chain([busy, busy], iter(lambda: real.randrange(20000, 65536), None))
        monkeypatch.setattr(ports.random, "randrange", lambda *_: next(picks))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        assert ports.free_port() != busy


def test_a_port_range_in_the_environment_confines_the_ports(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 32768)
    monkeypatch.setenv("KBROKER_PORT_RANGE", "24000-24100")
    assert ports.port_range() == (24000, 24100)
    assert all(24000 <= ports.free_port() < 24100 for _ in range(20))
    for unusable in ("", "24000", "x-y", "24100-24000", "80-90", "24000-70000"):
        monkeypatch.setenv("KBROKER_PORT_RANGE", unusable)
        assert ports.port_range() == (20000, 32768), unusable


def test_ports_asked_for_together_differ_even_when_the_random_pick_repeats(monkeypatch):
    """A broker's client, controller and TLS ports are asked for before any is bound: a random
    pick that repeats (it did, once in a suite: "the controller port must differ") is skipped."""
    real = random.Random(11)
    first = real.randrange(40000, 41000)
    picks = itertools.chain([first, first, first], iter(lambda: real.randrange(40000, 41000), None))
    monkeypatch.setattr(ports.random, "randrange", lambda *_: next(picks))
    monkeypatch.setattr(ports, "_handed_out", ports.collections.deque(maxlen=64))
    monkeypatch.setenv("KBROKER_PORT_RANGE", "40000-41000")
    given = [ports.free_port() for _ in range(3)]
    assert len(set(given)) == 3 and given[0] == first
