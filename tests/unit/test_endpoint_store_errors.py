"""The endpoints cache meets a Kafka error while reading forward: it raises a typed kbroker error.
A confluent KafkaError is not an exception class; raised as one (as the cache once did), it
escaped even `except BaseException`, so nothing could stop it taking down the thread that read:
a receiver's poll thread, on its partition-assignment path. And a commit that ended in doubt
leaves the cache where no sequence number can be used twice."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from kbroker.errors import BrokerUnavailableError, KBrokerError
from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore

from .fake_consumer import FakeConsumer, FakeMessage, eof


class NoProducer:
    """The store's shared producer: reading forward must not write."""

    def produce(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("reading forward wrote a record")


def store_reading(consumer: FakeConsumer) -> EndpointStore:
    store = EndpointStore("127.0.0.1:1", "ns", NoProducer())  # type: ignore[arg-type]
    # The store builds its consumer on its first read and learns the partitions then: hand it the
    # fake and the partitions instead, so no broker is involved.
    store._reader._consumer = consumer  # type: ignore[assignment]
    store._reader._positions = dict.fromkeys(consumer.watermarks, 0)
    return store


def test_a_kafka_error_while_reading_forward_raises_a_typed_error() -> None:
    timed_out = FakeMessage(0, 0, error_=KafkaError(KafkaError._MSG_TIMED_OUT))
    store = store_reading(FakeConsumer({0: (0, 5)}, [[timed_out]]))
    with pytest.raises(BrokerUnavailableError) as raised:
        store.refresh()
    assert store.topic in str(raised.value)
    assert "timed out" in str(raised.value).lower()


def test_a_permanent_error_is_a_kbroker_error_too() -> None:
    denied = FakeMessage(0, 0, error_=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    store = store_reading(FakeConsumer({0: (0, 5)}, [[denied]]))
    with pytest.raises(KBrokerError) as raised:
        store.find("some-handle")
    assert not raised.value.retriable  # not worth retrying unchanged


def test_a_lost_connection_is_waited_out_and_the_read_goes_on() -> None:
    lost = FakeMessage(-1, -1001, error_=KafkaError(KafkaError._TRANSPORT))
    consumer = FakeConsumer({0: (0, 1)}, [[lost], [eof(0, 1)]])
    store = store_reading(consumer)
    store.refresh()  # no error: librdkafka reconnects by itself
    assert store._reader._positions == {0: 1}
    assert consumer.unassigned == 1


def test_after_a_commit_in_doubt_the_next_send_goes_past_the_reserved_block() -> None:
    """A transaction that SENT on a dialog ended in doubt: whether its numbers were used is not
    known, so the next SEND continues past the block, even once the doubtful transaction's own
    endpoint record is read back. Before, the cache kept the count from before the transaction,
    and the next SEND reused its sequence numbers when it had committed."""
    from dataclasses import replace

    from kbroker.core.dialogs.conversation_endpoint import CONVERSING, Endpoint

    store = EndpointStore("127.0.0.1:1", "ns", NoProducer())  # type: ignore[arg-type]
    before = Endpoint(
        "h", "c", "INITIATOR", "g", "f", "s", "fs", "k", CONVERSING, send_sequence=3, sequence_reserved=64
    )
    store.note("h", before, written=True)
    doubtful = replace(before, send_sequence=70, sequence_reserved=128)  # it wrote a new block
    store.in_doubt(doubtful)
    assert store.cached("h").send_sequence == 128
    store._apply(FakeMessage(0, 0, key_=b"h", value_=doubtful.to_json()), now=0.0)  # read back: committed
    assert store.cached("h").send_sequence == 128
