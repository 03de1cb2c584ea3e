"""A stand-in for confluent-kafka's Consumer: serves scripted consume() batches, so reading code
can be driven through errors a real broker rarely produces on demand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError


@dataclass
class FakeMessage:
    """A consumed message: a record (`error` None) or an error event."""

    partition_: int = 0
    offset_: int = 0
    key_: bytes | None = None
    value_: bytes | None = None
    error_: KafkaError | None = None
    topic_: str = "t"
    timestamp_ms: int = 0

    def error(self) -> KafkaError | None:
        return self.error_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def topic(self) -> str:
        return self.topic_

    def timestamp(self) -> tuple[int, int]:
        return 1, self.timestamp_ms  # (TIMESTAMP_CREATE_TIME, ms)


def eof(partition: int, offset: int) -> FakeMessage:
    """The end-of-partition event at `offset` (the partition's end)."""
    return FakeMessage(partition, offset, error_=KafkaError(KafkaError._PARTITION_EOF))


@dataclass
class FakeConsumer:
    """Watermarks per partition, and the batches consume() returns in turn (then nothing)."""

    watermarks: dict[int, tuple[int, int]]
    batches: list[list[FakeMessage]]
    assigned: list[tuple[int, int]] = field(default_factory=list)
    unassigned: int = 0
    closed: bool = False

    def get_watermark_offsets(self, tp: Any, timeout: float = 0, cached: bool = False) -> tuple[int, int]:
        return self.watermarks[tp.partition]

    def assign(self, tps: list[Any]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in tps]

    def unassign(self) -> None:
        self.unassigned += 1

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        self.closed = True
