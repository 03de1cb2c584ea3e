"""SEND's early permission check (kafka/security/permissions.SendChecks) against a fake admin: the
authorizer's no is -8494, and no answer at all lets the SEND go on (the write is authorized)."""

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclOperation

from kbroker.core.cluster import Cluster
from kbroker.errors import SendPermissionDeniedError
from kbroker.kafka.security.permissions import SendChecks


class FakeAdmin:
    def __init__(self, outcome):
        self.outcome, self.asked = outcome, 0

    def describe_topics(self, topics, **_kw):
        self.asked += 1
        future: Future = Future()
        if isinstance(self.outcome, BaseException):
            future.set_exception(self.outcome)
        else:
            future.set_result(type("Described", (), {"authorized_operations": self.outcome})())
        return {name: future for name in topics.topic_names}


def checks(outcome) -> tuple[SendChecks, FakeAdmin]:
    c = SendChecks(Cluster("127.0.0.1:1"), keep=60.0)
    c._admin = admin = FakeAdmin(outcome)  # type: ignore[assignment]
    return c, admin


def test_the_authorizers_no_is_error_8494_and_is_asked_again_each_time():
    c, admin = checks([AclOperation.READ, AclOperation.DESCRIBE])
    for _ in range(2):
        with pytest.raises(SendPermissionDeniedError) as refused:
            c.check("//svc", "kbroker.ns.queue.q")
        assert refused.value.number == -8494
    assert admin.asked == 2


def test_not_even_describe_is_a_no():
    c, _ = checks(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    with pytest.raises(SendPermissionDeniedError):
        c.check("//svc", "kbroker.ns.queue.q")


def test_a_yes_is_kept():
    c, admin = checks([AclOperation.WRITE])
    c.check("//svc", "kbroker.ns.queue.q")
    c.check("//svc", "kbroker.ns.queue.q")
    assert admin.asked == 1


@pytest.mark.parametrize(
    "failure",
    [
        KafkaException(KafkaError(KafkaError._TIMED_OUT)),
        KafkaException(KafkaError(KafkaError._DESTROY)),
        RuntimeError("the client is closing"),
    ],
)
def test_no_answer_lets_the_send_go_on_and_is_kept_like_a_yes(failure):
    c, admin = checks(failure)
    c.check("//svc", "kbroker.ns.queue.q")
    c.check("//svc", "kbroker.ns.queue.q")
    assert admin.asked == 1


def test_an_old_yes_lets_the_send_go_on_and_a_revoke_found_in_the_background_refuses_the_next():
    c = SendChecks(Cluster("127.0.0.1:1"), keep=0.0)
    c._admin = admin = FakeAdmin([AclOperation.WRITE])  # type: ignore[assignment]
    c.check("//svc", "kbroker.ns.queue.q")  # asked, and waited for: the first SEND
    admin.outcome = [AclOperation.READ]  # revoked
    c.check("//svc", "kbroker.ns.queue.q")  # goes on at once; asked again in the background
    assert admin.asked == 2
    with pytest.raises(SendPermissionDeniedError):
        c.check("//svc", "kbroker.ns.queue.q")


def test_a_send_allowed_before_never_waits_for_a_slow_cluster():
    c = SendChecks(Cluster("127.0.0.1:1"), keep=0.0)
    c._admin = admin = FakeAdmin([AclOperation.WRITE])  # type: ignore[assignment]
    c.check("//svc", "kbroker.ns.queue.q")
    pending: Future = Future()  # the cluster does not answer
    admin.describe_topics = lambda topics, **_kw: {name: pending for name in topics.topic_names}
    for _ in range(3):
        c.check("//svc", "kbroker.ns.queue.q")  # would wait `timeout` each if it waited at all
    assert not pending.done()


class RefusingAdmin:
    def describe_topics(self, topics, **_kw):  # raises at once, before any future exists
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker"))


def test_a_question_that_cannot_even_be_put_lets_the_send_go_on():
    c = SendChecks(Cluster("127.0.0.1:1"), keep=60.0)
    c._admin = RefusingAdmin()  # type: ignore[assignment]
    c.check("//svc", "kbroker.ns.queue.q")  # no answer: the write will be authorized
