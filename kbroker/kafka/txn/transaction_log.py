"""Read one transactional id's recent history from Kafka's transaction log (`__transaction_state`):
the coordinator's own record of how its transactions ended (kbroker.core.txn.transaction_log says why the
committer asks). Reading it needs READ on that internal topic; a cluster that refuses it leaves
an in-doubt commit to the committed offsets alone."""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaException, Message, TopicPartition

from kbroker.core.cluster import ClusterLike
from kbroker.core.txn.transaction_log import (
    TRANSACTION_LOG,
    TxnLogEntry,
    TxnLogFormatError,
    parse_key,
    parse_value,
    partition_of,
)
from kbroker.errors import kafka_error
from kbroker.kafka.snapshot import read_partitions, reading_consumer, topic_partitions

log = logging.getLogger("kbroker.committer")


def transaction_history(
    cluster: ClusterLike, group: str, transactional_id: str, since: float, timeout: float
) -> list[TxnLogEntry] | None:
    """`transactional_id`'s log entries written since `since` (epoch seconds), in order; None
    when the log cannot be read to its end within `timeout`. A consumer of `group` (never
    joined) reads it; PermissionDeniedError when the cluster refuses."""
    deadline = time.monotonic() + timeout
    consumer = reading_consumer(cluster, group)
    try:
        partitions = topic_partitions(consumer, TRANSACTION_LOG, timeout)
        if not partitions:
            return None
        p = partition_of(transactional_id, len(partitions))
        try:
            [start] = consumer.offsets_for_times(
                [TopicPartition(TRANSACTION_LOG, p, int(since * 1000))], timeout=max(0.1, deadline - time.monotonic())
            )
        except KafkaException as exc:
            raise kafka_error(
                "cannot find where to read the transaction log",
                exc.args[0],
                on={"topic": ("DESCRIBE", TRANSACTION_LOG)},
            ) from None
        if start.offset < 0:  # nothing written since: the log's end
            return []
        entries: list[TxnLogEntry] = []

        def keep(msg: Message) -> None:
            value = msg.value()
            try:
                if parse_key(msg.key()) == transactional_id and value is not None:
                    entries.append(parse_value(value))
            except TxnLogFormatError as exc:
                log.warning(
                    "transaction log record at %s[%s]@%s not understood (%s); skipped",
                    TRANSACTION_LOG,
                    p,
                    msg.offset(),
                    exc,
                )

        read = read_partitions(
            consumer, TRANSACTION_LOG, {p: start.offset}, max(0.1, deadline - time.monotonic()), on_record=keep
        )
        return None if read.unfinished else entries
    finally:
        consumer.close()
