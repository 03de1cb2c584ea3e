"""Which metadata kbroker asks for: one topic by name where the request cannot create it, the
brokers alone to see that a cluster answers, the created topics by name while apply waits for
them. An answer about every topic costs the broker every topic of the cluster (docs/benchmarks.md,
sixteenth round). Stand-in clients record what they were asked; no broker is involved."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from kbroker.errors import KBrokerError, PermissionDeniedError
from kbroker.kafka import clients, topic_propagation
from kbroker.kafka.snapshot import topic_partitions

TOPIC = "kbroker.ns.queue.Q"


def metadata(*topics: str) -> SimpleNamespace:
    return SimpleNamespace(
        topics={t: SimpleNamespace(error=None, partitions={0: None, 1: None}) for t in topics}, brokers={1: None}
    )


class Asked:
    """Records what list_topics was asked (mixed into a client built without a librdkafka handle)."""

    asked: list[str | None]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.asked.append(topic)
        return metadata(TOPIC)


class AskedConsumer(Asked, Consumer):
    pass


class AskedProducer(Asked, Producer):
    pass


def stand_in(cls: type) -> Any:
    client = cls.__new__(cls)
    client.asked = []
    return client


def test_a_consumer_is_asked_for_the_one_topic() -> None:
    consumer = stand_in(AskedConsumer)
    assert topic_partitions(consumer, TOPIC, 5) == [0, 1]
    assert consumer.asked == [TOPIC]


def test_a_producer_is_asked_for_every_topic_unless_it_never_creates_one() -> None:
    producer = stand_in(AskedProducer)
    assert topic_partitions(producer, TOPIC, 5) == [0, 1]
    assert producer.asked == [None]  # naming it could create it (allow.auto.create.topics)
    producer.asked.clear()
    assert topic_partitions(producer, TOPIC, 5, never_creates=True) == [0, 1]
    assert producer.asked == [TOPIC]


def done(value: Any = None, error: KafkaError | None = None) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    if error is not None:
        future.set_exception(KafkaException(error))
    else:
        future.set_result(value)
    return future


class StandInAdmin:
    """describe_cluster and describe_topics answer from a script; list_topics fails the test."""

    def __init__(self, described: list[dict[str, Any]]) -> None:
        self.described = described  # one answer per describe_topics call: name -> partitions or KafkaError
        self.cluster_asked = 0

    def list_topics(self, *_a: Any, **_kw: Any) -> Any:
        raise AssertionError("asked about every topic")

    def describe_cluster(self, request_timeout: float) -> concurrent.futures.Future:
        self.cluster_asked += 1
        return done(SimpleNamespace(nodes=[SimpleNamespace(host="127.0.0.1", port=9092)]))

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, concurrent.futures.Future]:
        answer = self.described.pop(0) if len(self.described) > 1 else self.described[0]
        return {
            name: done(error=got) if isinstance(got, KafkaError) else done(SimpleNamespace(partitions=got))
            for name, got in answer.items()
        }


def led(leader_id: int) -> SimpleNamespace:
    return SimpleNamespace(leader=None if leader_id < 0 else SimpleNamespace(id=leader_id))


def test_brokers_answering_asks_for_the_brokers_alone() -> None:
    admin = StandInAdmin([{}])
    assert clients.brokers_answering("127.0.0.1:9092", 5, client=admin) == 1  # type: ignore[arg-type]
    assert admin.cluster_asked == 1


def test_apply_waits_by_name_until_every_partition_has_a_leader() -> None:
    unknown = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    admin = StandInAdmin([{TOPIC: unknown}, {TOPIC: [led(1), led(-1)]}, {TOPIC: [led(1), led(1)]}])
    deadline = topic_propagation.time.monotonic() + 10
    assert topic_propagation._wait_known(admin, [TOPIC], deadline) == ["127.0.0.1:9092"]  # type: ignore[arg-type]
    assert admin.described == [{TOPIC: [led(1), led(1)]}]  # asked three times, by name


def test_a_topic_the_principal_may_not_describe_is_refused_by_name() -> None:
    admin = StandInAdmin([{TOPIC: KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)}])
    deadline = topic_propagation.time.monotonic() + 10
    with pytest.raises(PermissionDeniedError):
        topic_propagation._wait_known(admin, [TOPIC], deadline, "127.0.0.1:9092")  # type: ignore[arg-type]


class OffsetsAdmin:
    """list_offsets answers each call from a script: an error code, or every partition's end."""

    def __init__(self, *answers: int | KafkaError) -> None:
        self.answers, self.calls = list(answers), 0

    def list_offsets(self, wanted: dict, request_timeout: float) -> dict:
        self.calls += 1
        got = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return {
            tp: done(error=got) if isinstance(got, KafkaError) else done(SimpleNamespace(offset=got)) for tp in wanted
        }


def test_end_offsets_wait_while_a_new_topic_is_not_led_yet_and_refuse_anything_else() -> None:
    deadline = topic_propagation.time.monotonic() + 10
    admin = OffsetsAdmin(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), 0)
    assert clients.end_offsets(admin, TOPIC, [0, 1], deadline) == {0: 0, 1: 0}  # type: ignore[arg-type]
    assert admin.calls == 2
    denied = OffsetsAdmin(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KBrokerError):
        clients.end_offsets(denied, TOPIC, [0], deadline)  # type: ignore[arg-type]
    assert denied.calls == 1
    late = OffsetsAdmin(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    with pytest.raises(KBrokerError, match="not leader|Not leader"):
        clients.end_offsets(late, TOPIC, [0], topic_propagation.time.monotonic() + 0.3)  # type: ignore[arg-type]
