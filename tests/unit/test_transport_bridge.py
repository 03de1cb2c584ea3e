"""Addresses on other clusters and the bridge's records (kbroker/core/transport/bridge.py): what
parses, what is refused, and that a bridge record read back is what was sent, whatever else
another client wrote."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.transport.bridge import (
    H_DESTINATION,
    Address,
    address_of,
    bridge_topic,
    destination_topic,
    far_record,
    from_bridge,
    message_record,
    parse_position,
    position_record,
)
from kbroker.core.transport.message import new_message

QUEUES = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
NAMESPACES = st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True)
CLUSTERS = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)


def test_the_three_forms_of_an_address() -> None:
    assert address_of("Billing", "sales") == Address("Billing", "sales")
    assert address_of("Billing@finance", "sales") == Address("Billing", "finance")
    assert address_of("Billing@finance@eu", "sales") == Address("Billing", "finance", "eu")
    assert destination_topic("Billing@finance@eu", "sales") == bridge_topic("sales", "eu")
    assert destination_topic("Billing@finance", "sales") == "kbroker.finance.tqueue.Billing"


@pytest.mark.parametrize(
    "bad",
    ["Billing@@eu", "Billing@finance@", "Billing@finance@e u", "Billing@finance@eu\n", "@finance@eu", "a@b@c@d", 7],
)
def test_bad_addresses_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        address_of(bad, "sales")  # type: ignore[arg-type]


@given(QUEUES, NAMESPACES, CLUSTERS, st.binary(max_size=200) | st.none(), st.dictionaries(QUEUES, st.text(max_size=30)))
def test_a_bridge_record_reads_back_as_sent(
    queue: str, ns: str, cluster: str, body: bytes | None, headers: dict[str, str]
) -> None:
    msg = new_message(
        body,
        headers,
        now_ms=1_000,
        message_id=None,
        correlation_id=None,
        reply_to_address=None,
        recoverable=True,
        time_to_be_received=None,
    )
    topic, key, value, hs = message_record(f"{queue}@{ns}@{cluster}", "sales", msg)
    assert topic == bridge_topic("sales", cluster) and key == msg.id.encode()
    address, back = from_bridge(value, hs)
    assert address == Address(queue, ns) and back.id == msg.id and back.body == msg.body
    assert dict(back.headers) == dict(msg.headers)
    far_topic, far_key, far_value, far_headers = far_record(address, back)
    assert far_topic == f"kbroker.{ns}.tqueue.{queue}" and far_value == body
    assert H_DESTINATION not in dict(far_headers or [])


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(H_DESTINATION, b"Billing")],  # no namespace
        [(H_DESTINATION, b"Billing@fin@eu")],  # a far queue is on its own cluster
        [(H_DESTINATION, b"\xff")],
        [(H_DESTINATION, b"Billing@finance"), (H_DESTINATION, b"Other@finance")],
    ],
)
def test_records_that_are_not_bridge_records_are_malformed(headers: list[tuple[str, bytes]]) -> None:
    with pytest.raises(MalformedRecord):
        from_bridge(b"x", headers)


@given(st.binary(max_size=64) | st.none())
def test_a_position_is_a_whole_offset_or_nothing(value: bytes | None) -> None:
    n = parse_position(value)
    assert n is None or (isinstance(n, int) and n >= 0)


def test_a_position_reads_back() -> None:
    _t, _k, value, _h = position_record("sales", "cid", "kbroker.sales.tbridge.eu", 0, 42)
    assert parse_position(value) == 42
    assert parse_position(b'{"next": -1}') is None and parse_position(b'{"next": true}') is None
