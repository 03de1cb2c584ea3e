"""A producer's failed writes, typed: its fatal error (FatalError, producer_failed) and its failed
deliveries (Deliveries, refusal), with the authorizer's refusal among them named as such.

Apart from clients.py, which builds the clients: this is what their callers make of a producer's
errors once it writes.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from kbroker.core.cluster import ClusterLike
from kbroker.errors import KBrokerError, PermissionDeniedError, denied_code
from kbroker.kafka.clients import denied, principal


class FatalError:
    """An `error_cb` that keeps a producer's fatal error: once a producer failed for good, its
    calls raise only librdkafka's _FATAL, and the error callback is what says why (a refused
    producer id, say)."""

    def __init__(self) -> None:
        self.error: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        if err.fatal():
            self.error = err

    def of(self, producer: Producer, err: KafkaError) -> KafkaError:
        """Why `producer` failed, given the error a call raised: the fatal error it reported,
        once its callbacks are served, when `err` only says there was one."""
        if err.code() == KafkaError._FATAL and self.error is None:
            try:
                producer.poll(0)
            except KafkaException as exc:  # the binding raises the fatal error from poll as well
                if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() != KafkaError._FATAL:
                    self.error = exc.args[0]
        return self.error if err.code() == KafkaError._FATAL and self.error is not None else err


def producer_failed(cluster: ClusterLike, err: KafkaError, topic: str, what: str) -> KBrokerError:
    """A producer's fatal error while writing `topic`, typed. CLUSTER_AUTHORIZATION_FAILED from
    an idempotent producer means the principal may WRITE no topic at all (with WRITE on one,
    Kafka grants the producer id, KIP-679): named as the WRITE it lacks."""
    if err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        return PermissionDeniedError(
            resource=f"topic {topic}",
            operation="WRITE",
            principal=principal(cluster),
            what=f"{what}: the cluster refused a producer id to a principal that may write no topic",
        )
    return denied(cluster, err, what, topic=("WRITE", topic))


def refusal(cluster: ClusterLike, failed: list[tuple[KafkaError, str]], what: str) -> KBrokerError | None:
    """Among failed deliveries, (error, topic), the first the authorizer refused, as a
    PermissionDeniedError naming the topic; None when none was refused. (A refusal must not pass
    for a send that failed retriably: it fails the same way every time.)"""
    for err, topic in failed:
        if denied_code(err):
            return denied(cluster, err, what, topic=("WRITE", topic))
    return None


class Deliveries:
    """A producer's delivery reports (its `on_delivery`) until the next flush: the failed ones,
    as (error, topic). `flushed()` flushes and hands back the first failure, raising the
    authorizer's refusal among them instead (it would fail the same way every time)."""

    def __init__(self, topic: str = "") -> None:
        self._topic = topic  # named for a failed report that comes without its record
        self._failed: list[tuple[KafkaError, str]] = []

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._failed.append((err, msg.topic() if msg is not None else self._topic))

    def flushed(
        self, producer: Producer, cluster: ClusterLike, seconds: float, what: str
    ) -> tuple[int, KafkaError | None]:
        """Flush `producer` within `seconds`: (records still not acknowledged, the first failed
        delivery or None). PermissionDeniedError, saying `what` was refused, for a refusal."""
        left = producer.flush(seconds)
        failed, self._failed = self._failed, []
        refused = refusal(cluster, failed, what)
        if refused is not None:
            raise refused
        return left, failed[0][0] if failed else None
