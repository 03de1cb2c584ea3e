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
    # _TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN; a group coordinator loading, unavailable or moved
    # (what a broker restart answers for a while, not flagged retriable by every call)
    for code in (-195, -185, -187, 14, 15, 16):
        err = kafka_error("reading", FakeKafkaError(code))
        assert isinstance(err, BrokerUnavailableError) and err.retriable
        assert str(err).startswith("reading: KafkaError{code=")


def test_another_exception_counts_as_unreachable() -> None:
    err = kafka_error("listing", TimeoutError("no answer"))
    assert isinstance(err, BrokerUnavailableError)
    assert str(err) == "listing: no answer"


def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(InvalidArgumentError, KBrokerError)


# --- the authorizer's refusals --------------------------------------------------------------


def test_a_refusal_names_the_operation_and_resource_the_call_site_knows() -> None:
    from kbroker.errors import PermissionDeniedError

    on = {"topic": ("WRITE", "kbroker.s.queue.Q"), "group": ("READ", "kbroker.s.queue.Q")}
    topic = kafka_error("sending", FakeKafkaError(29), on=on, principal="User:alice")
    assert isinstance(topic, PermissionDeniedError) and not topic.retriable
    assert str(topic) == "permission denied: User:alice may not WRITE topic kbroker.s.queue.Q (sending)"
    assert (topic.operation, topic.resource, topic.principal) == ("WRITE", "topic kbroker.s.queue.Q", "User:alice")
    group = kafka_error("reading", FakeKafkaError(30), on=on)
    assert str(group) == "permission denied: this client's principal may not READ group kbroker.s.queue.Q (reading)"
    assert str(group.naming("User:bob")).startswith("permission denied: User:bob may not READ group")
    assert topic.naming("User:bob") is topic  # a principal already named stays
    unknown = kafka_error("committing", FakeKafkaError(53))
    assert str(unknown) == "permission denied: this client's principal may not use a transactional id (committing)"


def test_every_authorization_code_is_a_refusal_whatever_the_client_says() -> None:
    from kbroker.errors import PermissionDeniedError, denied_code, is_refusal

    for code in (29, 30, 31, 53):
        err = FakeKafkaError(code, retriable=True)  # even where a client calls it retriable
        assert denied_code(err) and isinstance(kafka_error("x", err), PermissionDeniedError)

    class AioAuthorizationError(Exception):  # aiokafka's carry the code as `errno`
        errno = 30

    class Wrapped(Exception):  # confluent_kafka's KafkaException carries the KafkaError
        pass

    assert is_refusal(AioAuthorizationError("kbroker.s.worker"))
    assert is_refusal(Wrapped(FakeKafkaError(29))) and not is_refusal(Wrapped(FakeKafkaError(7)))
    assert is_refusal(PermissionDeniedError("no")) and not is_refusal(RuntimeError("no"))
