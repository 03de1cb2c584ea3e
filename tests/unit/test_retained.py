"""RETENTION = ON's sent messages, with no broker: the copy SEND keeps in the sender's queue
(core/dialogs/retained.py) and how the queue view lists it (kafka/receive/retention.py's
message_rows, status 3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from kbroker.core import names
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import Catalog
from kbroker.core.dialogs.conversation_endpoint import CLOSED, DISCONNECTED_OUTBOUND, Endpoint, handle_for
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.dialogs.retained import H_RETAINED_TYPE, RETAINED_MARKER, retained_type
from kbroker.core.dialogs.statements import Statements
from kbroker.kafka.receive.retention import READY, RECEIVED, SENT, QueuedRecord, message_rows

NS = "unit"
T = TypeVar("T")
CATALOG = """
message_types:
  - name: //t/Request
  - name: //t/Reply
contracts:
  - name: //t/RequestReply
    messages:
      - {type: //t/Request, sent_by: INITIATOR}
      - {type: //t/Reply, sent_by: TARGET}
queues:
  - {name: Kept, retention: ON}
  - {name: Plain}
services:
  - {name: //t/Client, queue: Kept, contracts: [//t/RequestReply]}
  - {name: //t/Server, queue: Plain, contracts: [//t/RequestReply]}
  - {name: //t/Peer, queue: Kept, contracts: [//t/RequestReply]}
"""


@pytest.fixture
def statements(tmp_path) -> tuple[Statements, dict[str, Endpoint]]:
    (tmp_path / "c.yaml").write_text(CATALOG)
    catalog = load_definitions([tmp_path], NS)
    endpoints: dict[str, Endpoint] = {}

    def lookup(fn: Callable[[Catalog], T]) -> T:
        return fn(catalog)

    return Statements(NS, lookup, lambda g: [e for e in endpoints.values() if e.conversation_group_id == g]), endpoints


def begin(statements: Statements, endpoints: dict[str, Endpoint], to: str = "//t/Server") -> Endpoint:
    ep = statements.new_dialog("//t/Client", to, "//t/RequestReply", endpoint_of=endpoints.__getitem__)
    endpoints[ep.conversation_handle] = ep
    return ep


def test_a_retention_on_sender_keeps_a_copy_in_its_own_queue(statements):
    st, endpoints = statements
    ep = begin(st, endpoints)
    sent, message_id, after = st.message_record(ep, "//t/Request", b"<a/>")
    assert st.retains_sent(ep)
    [copy] = st.retained_records(ep, sent)
    topic, key, body, headers = copy
    assert topic == names.queue_topic(NS, "Kept") != sent[0] and key == ep.chain[0] and body == sent[2] == b"<a/>"
    env, original = Envelope.from_headers(headers), Envelope.from_headers(sent[3])
    assert env.message_type_name == RETAINED_MARKER and retained_type(headers) == "//t/Request"
    # Addressed to the sending side, in its group: the view and the reclaim find this side's endpoint.
    assert handle_for(env.conversation_id, env.to_side) == ep.conversation_handle
    assert env.conversation_group_id == ep.conversation_group_id
    assert (env.message_id, env.message_sequence_number) == (original.message_id, original.message_sequence_number)
    assert env.message_id == message_id and after.send_sequence == ep.send_sequence + 1


def test_a_retention_off_sender_keeps_nothing(statements):
    st, endpoints = statements
    client = begin(st, endpoints)
    sent, _, _ = st.message_record(client, "//t/Request", b"x")
    target = replace(client, side="TARGET", service_name="//t/Server", far_service_name="//t/Client")
    assert not st.retains_sent(target) and st.retained_records(target, sent) == []


def row_of(record, partition: int, offset: int, retained: bool = True) -> QueuedRecord:
    return QueuedRecord(
        partition,
        offset,
        1000 + offset,
        Envelope.from_headers(record[3]),
        record[2],
        retained_type(record[3]) if retained else None,
    )


def test_the_view_lists_a_copy_as_sent_until_this_side_ends(statements):
    st, endpoints = statements
    ep = begin(st, endpoints, to="//t/Peer")  # both services on Kept: message and copy share a topic
    sent, _, after = st.message_record(ep, "//t/Request", b"hello")
    [copy] = st.retained_records(ep, sent)
    assert sent[0] == copy[0]
    records = [row_of(sent, 0, 0), row_of(copy, 0, 1)]
    by_handle = {ep.conversation_handle: after}

    rows = message_rows(records, lambda p, o: o == 1, by_handle, retention=True)
    assert [(r["status"], r["message_type_name"], r["service_name"]) for r in rows] == [
        (READY, "//t/Request", "//t/Peer"),  # the message, not yet received by the target
        (SENT, "//t/Request", "//t/Client"),  # the copy: consumed, still status 3
    ]
    assert rows[1]["conversation_handle"] == ep.conversation_handle and rows[1]["message_body"] == "hello"
    assert rows[0]["message_id"] == rows[1]["message_id"]

    target = handle_for(ep.conversation_id, "TARGET")  # exists once the target received
    both = {**by_handle, target: replace(after, side="TARGET", conversation_handle=target)}
    assert [r["status"] for r in message_rows(records, lambda p, o: True, both, retention=True)] == [RECEIVED, SENT]
    # RETENTION = OFF now (ALTER QUEUE): the copies leave the view with the received messages.
    assert [r["status"] for r in message_rows(records, lambda p, o: False, by_handle, retention=False)] == [READY]
    for state in (DISCONNECTED_OUTBOUND, CLOSED):
        ended = {ep.conversation_handle: replace(after, state=state)}
        assert [r["status"] for r in message_rows(records, lambda p, o: False, ended, retention=True)] == [READY]


def test_a_marker_record_without_its_type_is_not_listed(statements):
    st, endpoints = statements
    ep = begin(st, endpoints)
    sent, _, after = st.message_record(ep, "//t/Request", b"x")
    [copy] = st.retained_records(ep, sent)
    foreign = (copy[0], copy[1], copy[2], [h for h in copy[3] if h[0] != H_RETAINED_TYPE])
    assert retained_type(foreign[3]) is None and retained_type([(H_RETAINED_TYPE, b"\xff")]) is None
    rows = message_rows([row_of(foreign, 0, 0)], lambda p, o: False, {ep.conversation_handle: after}, retention=True)
    assert rows == []
