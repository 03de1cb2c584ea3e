"""What waits in a transport queue (the error queue, for `kbroker endpoint errors`): its records
from its group's committed offsets to its end, decoded as transport messages. A read, never a
receive: nothing is removed or locked."""

from __future__ import annotations

from confluent_kafka import Message, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.envelope import MalformedRecord
from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.core.transport.message import TransportMessage, from_record
from kbroker.errors import TransportQueueNotFoundError
from kbroker.kafka import messages
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions


def waiting(
    cluster: ClusterLike, namespace: str, queue: str, *, limit: int = 1000, timeout: float = 30.0
) -> tuple[list[TransportMessage], int]:
    """(up to `limit` messages waiting in `queue`, oldest first per partition; how many records
    wait in all, malformed ones included). TransportQueueNotFoundError for a queue not installed."""
    topic = transport_queue_topic(namespace, queue)
    consumer = reading_consumer(cluster, names.reader_group(namespace))
    try:
        partitions = topic_partitions(consumer, topic, timeout)
        if partitions is None:
            raise TransportQueueNotFoundError(queue, topic)
        group = reading_consumer(cluster, topic)  # the queue's group: its committed offsets
        try:
            committed = group.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
        finally:
            group.close()
        starts = {tp.partition: max(tp.offset, 0) for tp in committed}
        found: list[TransportMessage] = []
        total = 0

        def take(msg: Message) -> None:
            nonlocal total
            total += 1
            if len(found) >= limit:
                return
            try:
                m = from_record(
                    messages.raw_headers(msg),
                    msg.value(),
                    queue=queue,
                    partition=messages.partition(msg),
                    offset=messages.offset(msg),
                )
            except MalformedRecord:
                return
            found.append(m)

        read_partitions(consumer, topic, starts, timeout, on_record=take)
        return found, total
    finally:
        consumer.close()
