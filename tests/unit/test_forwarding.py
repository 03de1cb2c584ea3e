"""The forwarder's memory (core/routing/forwarding.py) with a fake clock, and the broker endpoint that
turns forwarding on (catalog `broker_endpoints:`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import BrokerEndpoint, Catalog
from kbroker.core.routing.forwarding import FORWARD_STALE_AFTER, MB, Forwarded, ForwardQueue
from kbroker.errors import DefinitionError


def fwd(i: int, size: int = 100, arrived: float = 0.0, dest: str = "h:1/d") -> Forwarded:
    return Forwarded(f"m{i}", f"c{i}", True, "//S", "//C", "s", dest, 0, size, arrived)


def test_a_message_past_the_size_cap_is_dropped_and_counted():
    q = ForwardQueue(250)
    assert q.add(fwd(1)) and q.add(fwd(2))
    assert not q.add(fwd(3))  # 300 > 250
    assert (q.bytes, q.dropped_full, len(q.held)) == (200, 1, 2)
    q.passed_on(q.held["m1"])
    assert q.add(fwd(3)) and q.bytes == 200 and q.sent == 1


def test_a_copy_of_a_held_message_is_held_once():
    q = ForwardQueue(1000)
    assert q.add(fwd(1)) and q.add(fwd(1))
    assert q.bytes == 100 and len(q.held) == 1


def test_the_5th_tick_deletes_what_was_not_passed_on_within_60_s():
    q = ForwardQueue(MB)
    q.add(fwd(1, arrived=0.0))
    q.add(fwd(2, arrived=30.0))
    assert q.sweep(FORWARD_STALE_AFTER - 0.001) == []
    assert [m.message_id for m in q.sweep(FORWARD_STALE_AFTER)] == ["m1"]
    assert [m.message_id for m in q.sweep(30.0 + FORWARD_STALE_AFTER)] == ["m2"]
    assert (q.bytes, q.dropped_stale) == (0, 2)


def test_rows_are_sys_dm_broker_forwarded_messages():
    q = ForwardQueue(MB)
    q.add(fwd(1, arrived=10.0, dest="k:9092/far"))
    [row] = q.rows(25.0)
    assert row["adjacent_broker_address"] == "k:9092/far"
    assert (row["time_consumed"], row["time_to_live"]) == (15.0, FORWARD_STALE_AFTER - 15.0)


@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "pass", "sweep"]), st.integers(0, 9), st.integers(1, 400), st.floats(0, 200)),
        max_size=60,
    )
)
def test_held_bytes_never_pass_the_cap_and_always_add_up(ops):
    q, now = ForwardQueue(1000), 0.0
    for op, i, size, dt in ops:
        now += dt
        if op == "add":
            q.add(fwd(i, size=size, arrived=now))
        elif op == "pass" and f"m{i}" in q.held:
            q.passed_on(q.held[f"m{i}"])
        elif op == "sweep":
            q.sweep(now)
        assert q.bytes == sum(m.size for m in q.held.values()) <= q.limit


def test_forwarding_is_on_only_with_an_enabled_broker_endpoint():
    assert Catalog(namespace="n").forwarding is None
    off = Catalog(namespace="n", broker_endpoints={"E": BrokerEndpoint(name="E")})
    assert off.forwarding is None
    on = Catalog(namespace="n", broker_endpoints={"E": BrokerEndpoint(name="E", message_forwarding=True)})
    assert on.forwarding is not None and on.forwarding.message_forward_size == 10


def test_a_namespace_has_one_broker_endpoint(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("broker_endpoints:\n  - {name: A, message_forwarding: ENABLED}\n  - {name: B}\n")
    with pytest.raises(DefinitionError, match="one broker endpoint"):
        load_definitions([f], "ns")
    f.write_text("broker_endpoints:\n  - {name: A, message_forwarding: SOMETIMES}\n")
    with pytest.raises(DefinitionError, match="message_forwarding"):
        load_definitions([f], "ns")
    f.write_text("broker_endpoints:\n  - {name: A, message_forwarding: ON, message_forward_size: 5}\n")
    assert load_definitions([f], "ns").forwarding.message_forward_size == 5
