"""One link: this namespace's connection to one destination namespace, on this Kafka
cluster or another. It sends over an idempotent producer to the destination's inbound topic and
reads the destination's acks topic for the acknowledgements of this namespace's messages.

Thin: when to connect, suppress and close is core/routing/links.py's; what to send and when is
core/routing/transmission.py's. Every call here has a deadline or does not block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.envelope import H_FOLLOWS, MalformedRecord
from kbroker.core.records import Header
from kbroker.core.routing.routes import address
from kbroker.core.routing.transmission import Outgoing, ack_key, read_ack
from kbroker.errors import KBrokerError, PermissionDeniedError, denied_code
from kbroker.kafka import clients, messages, producer_failures
from kbroker.kafka.snapshot import topic_partitions

SEND_TIMEOUT_MS = 20_000  # a message the destination did not take within this breaks the link
Signer = Callable[[bytes, bytes | None, list[Header]], list[Header]]  # (key, value, headers) -> signed headers
Invalid = Callable[[Message, str], None]  # an acknowledgement that is not one, and why


class LinkBroken(Exception):
    """The connection failed: why, in one line."""


class RoutingLink:
    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        from_broker: str,
        *,
        every_ack: bool = False,
        signer: Signer | None = None,
        on_invalid: Invalid | None = None,
    ):
        """`from_broker`: the namespace whose messages this link carries; `every_ack`: hand on
        the acknowledgements of every namespace's messages (a forwarder relays them); `signer`
        signs what `send` sends (a forwarder passes signed records on as they are);
        `on_invalid` is told of an acknowledgement of them that is not one."""
        self.cluster, self.namespace, self.from_broker = Cluster.of(cluster), namespace, from_broker
        self._signer, self._on_invalid = signer, on_invalid
        self.destination = address(self.cluster.bootstrap, namespace)
        self.inbound = names.inbound_topic(namespace)
        self.acks_topic = names.acks_topic(namespace)
        self._prefix = "" if every_ack else f"{from_broker}|"
        self.errors: list[str] = []
        self._producer = clients.idempotent_producer(
            cluster, **{"message.timeout.ms": SEND_TIMEOUT_MS, "linger.ms": 2, "error_cb": self._on_error}
        )
        self._acks = clients.consumer(cluster, names.reader_group(namespace), **{"error_cb": self._on_error})

    def _refused_topic(self, topic: str, timeout: float) -> None:
        """LinkBroken naming the refusal when `topic` is only hidden from this principal (an
        answer about all topics leaves out those it may not see); nothing when it is missing."""
        try:
            topic_partitions(self._acks, topic, timeout)
        except PermissionDeniedError as exc:
            raise LinkBroken(str(exc.naming(clients.principal(self.cluster)))) from None
        except KBrokerError:
            pass

    def _refused(self, err: KafkaError) -> Exception:
        """The destination's authorizer refused reading its acks: the link is broken, and says
        why (the route waits as for any broken link; the other routes go on)."""
        refusal = clients.denied(
            self.cluster,
            err,
            f"reading the acknowledgements of namespace {self.namespace}",
            topic=("READ", self.acks_topic),
            group=("DESCRIBE", names.reader_group(self.namespace)),
        )
        return LinkBroken(str(refusal))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() or err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.errors.append(err.str())

    def open(self, timeout: float) -> None:
        """Connect: the destination's cluster answers and has the namespace's topics (LinkBroken
        otherwise); the acks are read from the start (compacted: the latest per direction)."""
        try:
            md = self._producer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise LinkBroken(f"no Kafka broker answers at {self.cluster}: {exc.args[0].str()}") from None
        for topic in (self.inbound, self.acks_topic):
            if topic not in md.topics or md.topics[topic].error is not None:
                self._refused_topic(topic, timeout)
                raise LinkBroken(
                    f"namespace {self.namespace!r} at {self.cluster} has no topic {topic} (is its catalog applied?)"
                )
        parts = md.topics[self.acks_topic].partitions
        self._acks.assign([TopicPartition(self.acks_topic, p, OFFSET_BEGINNING) for p in parts])

    def send(self, m: Outgoing, follows: int, record: tuple[bytes | None, list[Header]] | None = None) -> None:
        """Queue `m` for the destination (never blocks: a full local queue is a broken link),
        declaring the message it follows (TransmissionQueue.follows); `record`: the (value,
        headers) to send instead of `m`'s own (sealed, kafka/routing/sealing.py)."""
        value, headers = record if record is not None else m.record
        declared = [(n, v) for n, v in headers or [] if n != H_FOLLOWS] + [(H_FOLLOWS, str(follows).encode())]
        key = ack_key(self.from_broker, m.conversation_id, m.to_side)
        if self._signer is not None:
            declared = self._signer(key.encode(), value, declared)
        self.send_record(key, value, declared)

    def send_record(self, key: str, value: bytes | None, headers: list[Header] | None) -> None:
        """Queue one record for the destination's inbound topic, keyed by its dialog direction."""
        try:
            self._producer.produce(
                self.inbound, key=key, value=value, headers=messages.wire_headers(headers), on_delivery=self._delivered
            )
        except BufferError:
            raise LinkBroken("the link's send queue is full") from None
        except KafkaException as exc:
            raise LinkBroken(exc.args[0].str()) from None

    def _delivered(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and denied_code(err):  # why the link is broken, in the refusal's words
            self.errors.append(
                str(
                    producer_failures.refusal(
                        self.cluster, [(err, self.inbound)], f"sending to namespace {self.namespace}"
                    )
                )
            )
        elif err is not None:
            self.errors.append(err.str())

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        """Serve delivery reports, and return the new acknowledgements of this namespace's
        messages; LinkBroken when a send failed or the cluster went away."""
        self._producer.poll(0)
        out = []
        for msg in messages.records(
            self._acks.consume(1000, 0),
            lambda err: self.errors.append(str(err)),
            transient=False,
            refused=self._refused,
        ):
            key = messages.key(msg).decode(errors="replace")
            if not key.startswith(self._prefix) or msg.value() is None:
                continue  # another sender's, or the tombstone of an ended direction
            try:
                out.append((key, read_ack(msg.value())))
            except MalformedRecord as exc:
                if self._on_invalid is not None:
                    self._on_invalid(msg, str(exc))
        if self.errors:
            raise LinkBroken(self.errors[-1])
        return out

    def close(self) -> None:
        self._producer.flush(0)
        try:
            self._acks.close()
        except KafkaException:
            pass
