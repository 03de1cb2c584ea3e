"""Read a topic whole, to its end as of now: the snapshot views and checks work from."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from kbroker.config import KAFKA_LOG
from kbroker.errors import BrokerUnavailableError


def read_to_end(bootstrap: str, topic: str, timeout: float = 10.0, *,
                must_finish: bool = False) -> list[Message] | None:
    """Every committed record of `topic`, partition by partition in offset order; None when the
    topic does not exist. What was read by `timeout` is returned, unless `must_finish`: then
    not reaching the end raises BrokerUnavailableError."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kbroker-view-{uuid.uuid4().hex[:8]}",
                  "logger": KAFKA_LOG, "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    out: list[Message] = []
    try:
        meta = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        todo = set()
        for p in meta.partitions:
            try:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            except KafkaException as exc:
                raise BrokerUnavailableError(f"cannot read {topic}: {exc.args[0].str()}") from None
            if high > low:
                todo.add(p)
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        todo.discard(m.partition())
                    continue
                out.append(m)
        if todo and must_finish:
            raise BrokerUnavailableError(f"could not read {topic} to its end in {timeout} s")
    finally:
        c.close()
    return out


def latest_values(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[bytes, bytes] | None:
    """A compacted topic as key -> last value, tombstoned keys left out; None when it does not exist."""
    records = read_to_end(bootstrap, topic, timeout)
    if records is None:
        return None
    latest: dict[bytes, bytes] = {}
    for m in records:
        if m.value() is None:
            latest.pop(m.key(), None)
        else:
            latest[m.key()] = m.value()
    return latest
