"""What a good Kafka user writes for an I/O-bound handler, the baseline of both faces' io-bound
rows: one consumer whose records go to a worker thread per partition, each handling its
partition's records in order, offsets committed as they complete. And the clock both sides of
those rows are timed with."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from kbroker.bench.common import IO_DELAY, join_all
from kbroker.bench.context import BenchContext
from kbroker.kafka import clients
from kbroker.kafka.baseline import commit_offsets, failure, is_partition_eof


@dataclass
class Clock:
    """When the first message was handed out and the last one committed, and the process's CPU
    time (every thread, librdkafka's included) in between."""

    first: float | None = None
    last: float | None = None
    cpu: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def started(self) -> None:
        if self.first is None:
            with self.lock:
                if self.first is None:
                    self.first, self.cpu = time.perf_counter(), time.process_time()

    def finished(self) -> None:
        self.last, self.cpu = time.perf_counter(), time.process_time() - self.cpu

    def rate(self, n: int) -> float:
        assert self.first is not None and self.last is not None, "nothing was handled"
        return n / (self.last - self.first)

    def detail(self, n: int, t_start: float) -> dict[str, float]:
        """seconds (first handed out to last committed), wall_seconds (from the start, consumer
        start-up included) and the CPU time per message, in ms."""
        assert self.first is not None and self.last is not None, "nothing was handled"
        return {
            "seconds": self.last - self.first,
            "wall_seconds": self.last - t_start,
            "cpu_ms_per_msg": self.cpu * 1000 / n,
        }


def baseline_partition_workers(ctx: BenchContext, topic: str, n: int, clock: Clock, deadline: float) -> None:
    """One consumer; its records go to one worker thread per partition, which handles them in
    partition order (IO_DELAY each); the consumer commits the offsets the workers completed
    (every 100 ms and at the end)."""
    consumer = clients.consumer(ctx.cluster, f"baseline.{topic}", **{"auto.offset.reset": "earliest"})
    work: dict[int, queue.SimpleQueue[int | None]] = {}
    completed: dict[int, int] = {}  # partition -> next offset, handled
    lock = threading.Lock()
    handled = [0]
    threads: list[threading.Thread] = []

    def worker(partition: int, inbox: queue.SimpleQueue[int | None]) -> None:
        while (offset := inbox.get()) is not None:
            time.sleep(IO_DELAY)
            with lock:
                completed[partition] = offset + 1
                handled[0] += 1

    try:
        consumer.subscribe([topic])
        committed: dict[int, int] = {}
        last_commit = time.monotonic()
        with ctx.reporter.bar("baseline: one consumer, a worker thread per partition", n) as advance:
            reported = 0
            while True:
                for rec in consumer.consume(500, 0.01):
                    if rec.error():
                        if is_partition_eof(rec):
                            continue
                        raise failure(rec)
                    clock.started()
                    p = rec.partition()
                    assert p is not None  # a record, not an error event
                    inbox = work.get(p)
                    if inbox is None:
                        inbox = work[p] = queue.SimpleQueue()
                        threads.append(
                            threading.Thread(
                                target=worker, args=(p, inbox), daemon=True, name=f"baseline-partition-{p}"
                            )
                        )
                        threads[-1].start()
                    inbox.put(rec.offset())
                with lock:
                    done, ready = handled[0], {p: o for p, o in completed.items() if committed.get(p) != o}
                if ready and (done >= n or time.monotonic() - last_commit >= 0.1):
                    commit_offsets(consumer, topic, ready)
                    committed.update(ready)
                    last_commit = time.monotonic()
                advance(done - reported)
                reported = done
                if done >= n:  # and, just above, every completed offset committed
                    clock.finished()
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"baseline: only {done:,} of {n:,} messages handled in time")
    finally:
        for inbox in work.values():
            inbox.put(None)
        join_all(threads, 5)
        consumer.close()
