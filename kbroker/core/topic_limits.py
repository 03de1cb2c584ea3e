"""The largest record each kind of topic takes (Kafka's max.message.bytes), as one rule.

A record may move from one topic to another: a queue's malformed or refused record to the
dead-letter topic (with kb.dlq.* headers added), a SEND to another namespace through the
transmission topic to the far inbound topic and on to a queue, a transport queue's poison message
to the dead-letter topic. A record that fits where it is but not where it must go holds its
partition for good (its move fails every time), so every destination takes the largest record
any of its sources holds, headers included:

    queue topic, secondary queue topic   max_message_bytes + HEADER_HEADROOM   (a queue's own limit)
    transport queue, transmission, inbound   MESSAGE_TOPIC_LIMIT = LARGEST_BODY + HEADER_HEADROOM
    dead-letter                          DEAD_LETTER_LIMIT = MESSAGE_TOPIC_LIMIT + DEAD_LETTER_HEADROOM

and every client that carries such records takes the largest of them: CLIENT_LIMIT is the
librdkafka producers' message.max.bytes (the largest request) and the worker's aiokafka
producer's max_request_size and consumer's per-partition fetch size (kafka/clients.py,
worker/app.py), with room for a batch's own overhead above DEAD_LETTER_LIMIT.

HEADER_HEADROOM is room for headers and Kafka's record overhead on top of the body; kbroker's own
headers take well under 1 KiB, so a message kbroker moves keeps fitting. A record another client
wrote may fill the whole headroom with headers; its dead letter adds the kb.dlq.* headers on top,
which DEAD_LETTER_HEADROOM bounds (the reason is cut to MAX_REASON_BYTES).
"""

from __future__ import annotations

HEADER_HEADROOM = 64 * 1024
MAX_QUEUE_MESSAGE_BYTES = 10_485_760  # the largest message body any queue may take (10 MiB)
LARGEST_BODY = MAX_QUEUE_MESSAGE_BYTES  # the largest body any queue or transport queue takes
MAX_REASON_BYTES = 4 * 1024  # a dead letter's kb.dlq.reason, cut to this
DEAD_LETTER_HEADROOM = 8 * 1024  # the kb.dlq.* headers: reason, topic (<= 249), partition, offset, size

MESSAGE_TOPIC_LIMIT = LARGEST_BODY + HEADER_HEADROOM
DEAD_LETTER_LIMIT = MESSAGE_TOPIC_LIMIT + DEAD_LETTER_HEADROOM
CLIENT_LIMIT = 11 * 1024 * 1024  # > DEAD_LETTER_LIMIT (10,559,488) plus a request's overhead

# Kafka's per-record and per-batch overhead, generously: a batch of one record adds 61 bytes, a
# record at most about 25 and each header a few (varints).
RECORD_OVERHEAD, HEADER_OVERHEAD = 128, 16


def queue_limit(max_message_bytes: int) -> int:
    """A queue topic's (and its secondary queues') max.message.bytes."""
    return max_message_bytes + HEADER_HEADROOM


def system_topic_limit(name: str) -> int | None:
    """The max.message.bytes a system topic needs because records move to it (None: Kafka's
    default will do; only small records of kbroker's own go there)."""
    return {"deadletter": DEAD_LETTER_LIMIT, "transmission": MESSAGE_TOPIC_LIMIT, "inbound": MESSAGE_TOPIC_LIMIT}.get(
        name
    )


def record_bytes(key: bytes | str | None, value: bytes | None, headers: list[tuple[str, bytes]] | None) -> int:
    """An upper bound of what a record takes in a batch of its own, as Kafka checks it against
    max.message.bytes (uncompressed)."""
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for name, val in headers or []:
        size += HEADER_OVERHEAD + len(name.encode()) + len(val or b"")
    return size
