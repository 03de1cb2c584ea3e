"""Dead letters and set-aside records (core/dead_letter.py), the topic limits they rely on
(core/topic_limits.py), and which of a group commit's requests a refused record fails."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from kbroker.core.catalog.models import MAX_QUEUE_MESSAGE_BYTES
from kbroker.core.dead_letter import RECORD_SET_ASIDE, dead_letter_record, set_aside
from kbroker.core.topic_limits import (
    DEAD_LETTER_LIMIT,
    MAX_REASON_BYTES,
    MESSAGE_TOPIC_LIMIT,
    queue_limit,
    record_bytes,
    system_topic_limit,
)
from kbroker.kafka.txn.commit_requests import CommitRequest, refused_requests


@dataclass
class Consumed:
    """A consumed record as dead_letter_record reads it."""

    body: bytes | None
    extra: list[tuple[str, bytes]]
    where: tuple[str, int, int] = ("kbroker.ns.queue.Q", 2, 41)

    def topic(self) -> str:
        return self.where[0]

    def partition(self) -> int:
        return self.where[1]

    def offset(self) -> int:
        return self.where[2]

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes | None:
        return self.body

    def headers(self) -> list[tuple[str, bytes]]:
        return self.extra


def test_the_dead_letter_topic_takes_any_record_a_queue_holds_with_the_dead_letter_headers():
    largest = Consumed(None, [("x-foreign", b"h" * 40_000)])
    body_room = queue_limit(MAX_QUEUE_MESSAGE_BYTES) - record_bytes(b"k", None, largest.extra)
    largest.body = b"b" * body_room  # a record at its queue topic's very limit
    letter = dead_letter_record("ns", largest, "r" * 50_000)
    assert record_bytes(letter[1], letter[2], letter[3]) <= DEAD_LETTER_LIMIT
    assert dict(letter[3] or [])["kb.dlq.reason"].endswith(b"...")
    assert len(dict(letter[3] or [])["kb.dlq.reason"]) <= MAX_REASON_BYTES
    for source in ("transmission", "inbound"):
        assert (system_topic_limit(source) or 0) >= queue_limit(MAX_QUEUE_MESSAGE_BYTES)
    assert (system_topic_limit("inbound") or 0) >= (system_topic_limit("transmission") or 0) == MESSAGE_TOPIC_LIMIT
    assert system_topic_limit("deadletter") == DEAD_LETTER_LIMIT > MESSAGE_TOPIC_LIMIT
    assert system_topic_limit("catalog") is None


def test_a_set_aside_record_keeps_where_it_was_its_size_and_reason_and_an_event_says_so():
    record = Consumed(b"x" * 5000, [("x-foreign", b"v")])
    letter, event = set_aside("ns", record, "no kb.* headers", now_ms=7)
    topic, key, value, headers = letter
    assert (topic, key, value) == ("kbroker.ns.deadletter", b"k", None)
    h = dict(headers or [])
    assert h["x-foreign"] == b"v" and h["kb.dlq.reason"] == b"no kb.* headers"
    assert (h["kb.dlq.topic"], h["kb.dlq.partition"], h["kb.dlq.offset"], h["kb.dlq.size"]) == (
        b"kbroker.ns.queue.Q",
        b"2",
        b"41",
        b"5000",
    )
    assert h["kb.dlq.omitted"] == b"body"
    assert event[0] == "kbroker.ns.events" and event[1] == b"kbroker.ns.queue.Q"
    assert orjson.loads(event[2]) == {
        "event": RECORD_SET_ASIDE,
        "topic": "kbroker.ns.queue.Q",
        "partition": 2,
        "offset": 41,
        "size": 5000,
        "reason": "no kb.* headers",
        "dead_letter": "without body",
        "time": 7,
    }


def test_a_set_aside_record_drops_the_original_headers_too_when_they_alone_are_too_many():
    record = Consumed(b"x", [("x-foreign", b"v" * 2000)])
    letter, event = set_aside("ns", record, "why", limit=1000)
    h = dict(letter[3] or [])
    assert "x-foreign" not in h and h["kb.dlq.omitted"] == b"body,headers" and h["kb.dlq.size"] == b"1"
    assert record_bytes(letter[1], letter[2], letter[3]) <= 1000
    assert orjson.loads(event[2])["dead_letter"] == "without body and headers"


def test_a_refused_record_fails_only_the_request_that_holds_it():
    one = CommitRequest([("t", None, b"a", None)], [])
    two = CommitRequest([("t", None, b"b", None), ("t", None, b"c", None)], [])
    three = CommitRequest([], [])
    four = CommitRequest([("t", None, b"d", None)], [])
    # The transaction's records are the requests' records in order: a, b, c, d.
    assert refused_requests([one, two, three, four], {2: "too large"}) == {two: "too large"}
    assert refused_requests([one, two, three, four], {0: "x", 3: "y"}) == {one: "x", four: "y"}
    assert refused_requests([one, two], {}) == {}
