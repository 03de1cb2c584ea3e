"""QueueReceiver wakes only as many waiting RECEIVEs as a poll brings work for (no broker: a
fake consumer). It used to wake every waiter on every poll and every commit: with 64 readers in a
process, 64 wake-ups a poll, nearly all for nothing."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import pytest
from confluent_kafka import TopicPartition

from kbroker.kafka.receive import receiver as receiver_module
from kbroker.kafka.receive.receiver import QueueReceiver
from tests.unit.test_receiver_assignment import TOPIC, Position, Record

READERS = 8


class CountingCondition(threading.Condition):
    """A condition that counts the returns from wait(), for the test to read."""

    woken = 0

    def wait(self, timeout: float | None = None) -> bool:
        got = super().wait(timeout)
        CountingCondition.woken += 1
        return got


class Consumer:
    """One partition, assigned at offset 0; consume() hands out what the test puts in `incoming`
    and otherwise returns at once, as a poll loop's consumer often does."""

    def __init__(self) -> None:
        self.incoming: queue.Queue[Record] = queue.Queue()
        self._on_assign: Callable[..., None] | None = None

    def subscribe(self, topics: list[str], on_assign: Callable[..., None], **_: Any) -> None:
        self._on_assign = on_assign

    def consumer_group_metadata(self) -> str:
        return "meta"

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Position]:
        return [Position(TOPIC, tp.partition, 0, "") for tp in partitions]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        if self._on_assign is not None:
            on_assign, self._on_assign = self._on_assign, None
            on_assign(self, [TopicPartition(TOPIC, 0)])
        time.sleep(0.002)
        out = []
        while not self.incoming.empty():
            out.append(self.incoming.get())
        return out

    def close(self) -> None:
        pass


def test_one_record_wakes_one_waiting_receive_not_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receiver_module.threading, "Condition", CountingCondition)
    consumer = Consumer()
    receiver = QueueReceiver(
        "nowhere:1", "test", "Q", topic=TOPIC, dead_letter=lambda *a: None, new_consumer=lambda conf: consumer
    )  # type: ignore[arg-type,return-value]
    got: list[int] = []

    def read() -> None:
        lease, msgs = receiver.receive(object(), 10, 3.0)
        if lease is not None:
            got.extend(m.offset for m in msgs)
            receiver.release(lease, committed=True)

    receiver.start()
    readers = [threading.Thread(target=read, daemon=True) for _ in range(READERS)]
    try:
        for r in readers:
            r.start()
        time.sleep(0.3)  # every RECEIVE waits
        deadline = time.monotonic() + 5
        before = CountingCondition.woken
        consumer.incoming.put(Record(0, 0))
        while not got:
            assert time.monotonic() < deadline, "the record was not received"
            time.sleep(0.01)
        time.sleep(0.3)  # about 100 polls of the fake consumer
        woken = CountingCondition.woken - before
        # One wake-up for the record and, at most, each waiter's own 0.5 s time-out once. Waking
        # every waiter on every poll gave hundreds.
        assert woken <= READERS + 2, f"{woken} wake-ups for one record"
        assert got == [0]
    finally:
        receiver.close()
        for r in readers:
            r.join(5)
