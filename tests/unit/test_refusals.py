"""The authorizer's refusals where kbroker meets them: never waited out or retried, always typed
(PermissionDeniedError naming what was refused). Fakes stand in for the Kafka clients."""

from __future__ import annotations

import logging
import threading

import pytest

from kbroker.core import names
from kbroker.errors import BrokerUnavailableError, PermissionDeniedError


class FakeError:
    """Quacks like confluent_kafka.KafkaError."""

    def __init__(self, code: int, retriable: bool = False):
        self._code, self._retriable = code, retriable

    def code(self) -> int:
        return self._code

    def retriable(self) -> bool:
        return self._retriable

    def fatal(self) -> bool:
        return False

    def str(self) -> str:
        return f"error {self._code}"


class FakeMessage:
    def __init__(self, error: FakeError | None = None, topic: str = "kbroker.s.queue.Q"):
        self._error, self._topic = error, topic

    def error(self) -> FakeError | None:
        return self._error

    def topic(self) -> str:
        return self._topic


def test_a_consumers_refusal_is_raised_not_logged() -> None:
    from kbroker.kafka.messages import records

    logged: list[object] = []
    ok = FakeMessage()
    assert records([ok, FakeMessage(FakeError(-191))], logged.append) == [ok]  # end of partition: nothing
    with pytest.raises(PermissionDeniedError, match="may not READ topic kbroker.s.transmission"):
        records(
            [ok, FakeMessage(FakeError(29))],
            logged.append,
            refused=lambda err: PermissionDeniedError(resource="topic kbroker.s.transmission", operation="READ"),
        )
    with pytest.raises(PermissionDeniedError, match="use a group"):
        records([FakeMessage(FakeError(30, retriable=True))], logged.append)
    assert logged == []


def test_a_refused_delivery_names_its_topic_and_the_principal() -> None:
    from kbroker.core.cluster import Cluster
    from kbroker.kafka.producer_failures import refusal

    alice = Cluster.with_properties(
        "127.0.0.1:9092",
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "x",
        },
    )
    assert refusal(alice, [(FakeError(7, retriable=True), "kbroker.s.queue.Q")], "sending") is None
    refused = refusal(alice, [(FakeError(7), "a"), (FakeError(29), "kbroker.s.queue.Q")], "sending")
    assert str(refused) == "permission denied: User:alice may not WRITE topic kbroker.s.queue.Q (sending)"


def test_a_service_loop_stops_on_a_refusal_and_retries_anything_else() -> None:
    from kbroker.kafka.steps import run_steps

    calls: list[int] = []
    refusal = PermissionDeniedError(resource="topic kbroker.s.timers", operation="READ")

    def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise BrokerUnavailableError("away")  # retried after a second
        raise refusal

    stop = threading.Event()
    assert run_steps(step, stop, "timer service", None, logging.getLogger("test")) is refusal
    assert len(calls) == 2 and not stop.is_set()


def test_the_workers_guard_hands_a_refusal_on_and_never_calls_it_retriable() -> None:
    from kbroker.worker.guard import Guard, is_retriable, refusal_of

    class TopicAuthorizationFailedError(Exception):  # as aiokafka's: the code as errno, the topic as arg
        errno = 29

    guard = Guard(logging.getLogger("test"))
    handed: list[BaseException] = []
    guard.on_refused = handed.append
    aio = TopicAuthorizationFailedError("kbroker.s.ticks")
    guard.failed("tick request", aio)
    guard.failed("catalog refresh", BrokerUnavailableError("away"))
    assert handed == [aio] and not is_retriable(aio) and is_retriable(BrokerUnavailableError("away"))
    line = str(refusal_of(aio, "User:w", operation="WRITE"))
    assert line == "permission denied: User:w may not WRITE topic kbroker.s.ticks (the worker's Faust client)"


def test_a_failed_querys_refusal_is_read_from_its_text() -> None:
    from kbroker.analytics.job import refusal_in

    ours = RuntimeError(
        "An exception was raised by the Python Proxy.\nTraceback ...\nkbroker.errors."
        "PermissionDeniedError: permission denied: User:a may not WRITE transactional id "
        "kbroker.s.analytics-job (starting a transactional producer)\n\tat py4j..."
    )
    assert str(refusal_in(ours)) == (
        "permission denied: User:a may not WRITE transactional id "
        "kbroker.s.analytics-job (starting a transactional producer)"
    )
    java = RuntimeError(
        "[STREAM_FAILED] ... org.apache.kafka.common.errors.TopicAuthorizationException: "
        "Not authorized to access topics: [kbroker.s.queue.Q]\n\tat org.apache..."
    )
    assert str(refusal_in(java, "User:a")).startswith("permission denied: User:a may not READ topic (Spark's Kafka")
    assert refusal_in(RuntimeError("the broker went away")) is None and refusal_in(None) is None


def test_every_group_kbroker_names_lies_under_the_namespace() -> None:
    assert names.reader_group("s") == "kbroker.s.reader"
    assert names.namespace_of("kbroker.s.queue.Q") == "s"
    assert names.namespace_of("kbroker.s") is None and names.namespace_of("other.s.x") is None
    for group in (
        names.reader_group("s"),
        names.worker_app_id("s"),
        names.timers_group("s"),
        names.transmitter_group("s"),
        names.dispatcher_group("s"),
        names.analytics_group("s"),
        names.queue_group("s", "Q"),
        names.analytics_transactional_id("s"),
    ):
        assert group.startswith(names.prefix("s"))
