"""kafka_error: a Kafka client error as a typed kbroker error, without the client imported."""

from __future__ import annotations

from kbroker.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    KBrokerError,
    kafka_error,
)


class FakeKafkaError:
    """Quacks like confluent_kafka.KafkaError."""

    def __init__(self, code: int, retriable: bool = False, text: str = "broken"):
        self._code, self._retriable, self._text = code, retriable, text

    def code(self) -> int:
        return self._code

    def retriable(self) -> bool:
        return self._retriable

    def str(self) -> str:
        return self._text

    def __str__(self) -> str:
        return f"KafkaError{{code={self._code},str={self._text!r}}}"


def test_a_final_error_is_a_plain_kbroker_error_with_its_text() -> None:
    err = kafka_error("creating topic t", FakeKafkaError(36, text="Topic already exists"))
    assert type(err) is KBrokerError
    assert str(err) == "creating topic t: Topic already exists"
    assert not err.retriable


def test_retriable_and_unreachable_errors_are_broker_unavailable() -> None:
    assert isinstance(kafka_error("x", FakeKafkaError(7, retriable=True)), BrokerUnavailableError)
    for code in (-195, -185, -187):  # _TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN
        err = kafka_error("reading", FakeKafkaError(code))
        assert isinstance(err, BrokerUnavailableError) and err.retriable
        assert str(err).startswith("reading: KafkaError{code=")


def test_another_exception_counts_as_unreachable() -> None:
    err = kafka_error("listing", TimeoutError("no answer"))
    assert isinstance(err, BrokerUnavailableError)
    assert str(err) == "listing: no answer"


def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(InvalidArgumentError, KBrokerError)
