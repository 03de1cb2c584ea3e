"""A producer's fatal error, however confluent-kafka reports it: to the error callback, or raised
from the poll that serves it. Raised, it escaped as a traceback from `kbroker apply` when the
cluster refused the deployer a producer id, instead of the one-line permission error."""

from __future__ import annotations

from typing import Callable

from confluent_kafka import KafkaError, KafkaException

from kbroker.errors import PermissionDeniedError
from kbroker.kafka.producer_failures import FatalError, producer_failed

REFUSED = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Failed to acquire idempotence PID", fatal=True)
ONLY_FATAL = KafkaError(KafkaError._FATAL, "Fatal error")  # what a producer's calls raise once it failed


class RaisingProducer:
    def poll(self, timeout: float) -> int:
        raise KafkaException(REFUSED)


class ReportingProducer:
    def __init__(self, error_cb: Callable[[KafkaError], None]) -> None:
        self._error_cb = error_cb

    def poll(self, timeout: float) -> int:
        self._error_cb(REFUSED)
        return 0


def test_a_fatal_error_raised_from_the_poll_is_the_reason() -> None:
    fatal = FatalError()
    assert fatal.of(RaisingProducer(), ONLY_FATAL).code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_a_fatal_error_given_to_the_callback_is_the_reason() -> None:
    fatal = FatalError()
    assert fatal.of(ReportingProducer(fatal), ONLY_FATAL).code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_any_other_error_is_its_own_reason() -> None:
    other = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert FatalError().of(RaisingProducer(), other) is other


def test_a_refused_producer_id_is_a_permission_error_naming_the_write() -> None:
    error = producer_failed("127.0.0.1:1", REFUSED, "kbroker.ns.catalog", "publishing to kbroker.ns.catalog failed")
    assert isinstance(error, PermissionDeniedError)
    assert "WRITE" in str(error) and "kbroker.ns.catalog" in str(error)
