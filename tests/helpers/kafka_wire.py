"""ListTransactions (Kafka API key 66, version 0) spoken directly on the wire: confluent-kafka's
admin client has no list/describe-transactions call. Sent to one broker, the answer lists the
transactional ids that broker coordinates, so asking each node in turn says which node is the
transaction coordinator of which producer. The framing is kbroker's own (kafka/wire.py)."""

from __future__ import annotations

from kbroker.core.cluster import Cluster
from kbroker.kafka.wire import Cursor, exchange, frame, uvarint

LIST_TRANSACTIONS, VERSION = 66, 0


def list_transactions_request(correlation_id: int) -> bytes:
    """An empty states filter and an empty producer-id filter (all transactions), no tags."""
    return frame(LIST_TRANSACTIONS, VERSION, correlation_id, uvarint(1) + uvarint(1) + b"\x00", flexible=True)


def parse_list_transactions(payload: bytes, correlation_id: int) -> dict[str, str]:
    """transactional id -> state, from a response without its size prefix; raises on an error code."""
    r = Cursor(payload)
    assert r.take(">i") == correlation_id, "a response to another request"
    r.skip_tags()  # response header v1
    r.take(">i")  # throttle time
    error = r.take(">h")
    if error:
        raise RuntimeError(f"ListTransactions failed with Kafka error code {error}")
    for _ in range(r.uvarint() - 1):  # unknown state filters
        r.compact_string()
    states: dict[str, str] = {}
    for _ in range(r.uvarint() - 1):
        transactional_id = r.compact_string()
        r.take(">q")  # producer id
        state = r.compact_string()
        r.skip_tags()
        if transactional_id is not None:
            states[transactional_id] = state or ""
    return states


def list_transactions(host: str, port: int, timeout: float = 10.0) -> dict[str, str]:
    """The transactions the broker at host:port coordinates: transactional id -> state."""
    broker = Cluster(f"{host}:{port}")  # this one broker, as a cluster to reach
    return parse_list_transactions(exchange(broker, list_transactions_request(1), timeout), 1)
