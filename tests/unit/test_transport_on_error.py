"""The pure parts of on_error: a retry it requests is remembered once per message, bounded, and
forgotten with the message (core/transport/endpoint.FailedDeliveries); each delivery's headers
are its own (core/transport/message.with_position)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.transport.endpoint import FailedDeliveries
from kbroker.core.transport.message import TransportMessage, with_position


def test_a_requested_retry_is_taken_once_and_forgotten_with_the_message() -> None:
    f = FailedDeliveries()
    p = ("t", 0, 7)
    assert not f.take_retry(p)
    f.failed(p, "boom")
    f.request_retry(p)
    assert f.take_retry(p) and not f.take_retry(p)
    f.request_retry(p)
    f.forget(p)
    assert not f.take_retry(p) and f.count(p) == 0


@given(st.lists(st.tuples(st.sampled_from(["req", "take"]), st.integers(0, 40)), max_size=300))
def test_requested_retries_stay_within_the_cap_and_match_a_model(ops: list[tuple[str, int]]) -> None:
    f = FailedDeliveries(cap=8)
    model: list[int] = []  # offsets, oldest first
    for op, off in ops:
        p = ("t", 0, off)
        if op == "req":
            if off in model:
                model.remove(off)
            model.append(off)
            del model[:-8]
            f.request_retry(p)
        else:
            assert f.take_retry(p) == (off in model)
            if off in model:
                model.remove(off)
    assert all(f.take_retry(("t", 0, off)) for off in model)


def test_each_delivery_gets_its_own_headers() -> None:
    stored = TransportMessage("00000000-0000-0000-0000-000000000001", b"x", {"h": "original"})
    first = with_position(stored, "Q", 0, 1, None)
    first.headers["h"] = "changed by a handler"  # type: ignore[index]
    again = with_position(stored, "Q", 0, 1, None)
    assert again.headers["h"] == "original" and stored.headers["h"] == "original"
