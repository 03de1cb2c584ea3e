"""The thread that reads a queue: it owns the queue's consumer, decodes what it fetches and only
ever buffers it per conversation group, so a reader that holds a group for minutes never stalls
polling. Memory is bounded: past `max_buffered` records the consumer pauses, and it resumes at
half (core/receive/group_buffer.pause_change). A record that does not decode is dead-lettered.

Part of kafka/receive/receiver.QueueReceiver, which holds the one lock (`cv`) all its parts share; the
rebalance callbacks run inside this thread's consume() (kafka/receive/partition_assignment.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from confluent_kafka import Consumer, KafkaError
from confluent_kafka import Message as KafkaRecord

from kbroker.core.cluster import Cluster
from kbroker.core.dialogs.envelope import Envelope, MalformedRecord
from kbroker.core.receive.group_buffer import Buffered, GroupBuffer, pause_change
from kbroker.errors import PermissionDeniedError, denied_code
from kbroker.kafka import clients, messages
from kbroker.kafka.receive.group_protocol import group_settings
from kbroker.kafka.receive.partition_assignment import PartitionAssignment
from kbroker.kafka.receive.poll_commits import PollCommits

log = logging.getLogger("kbroker.receiver")

QUEUED_MAX_KBYTES = 16 * 1024  # librdkafka read-ahead per consumer (see consumer_settings)
POLL_RECORDS, POLL_WAIT = 500, 0.1  # records per poll at most; seconds a poll waits for the first
# While a transaction holds messages: the wait for a commit to be handed over (poll_commits.py),
# and so the most a record fetched meanwhile waits to be buffered.
COMMIT_WAIT = 0.001


def decode_envelope(rec: KafkaRecord) -> Envelope:
    """A Service Broker message: its envelope, keyed by its receiving conversation group."""
    env = Envelope.from_headers(messages.raw_headers(rec))
    key = rec.key()
    if key is None or key.decode() != env.conversation_group_id:
        raise MalformedRecord("record key does not match the conversation group header")
    return env


def consumer_settings(cluster: Cluster, topic: str) -> dict[str, Any]:
    """The settings of a queue's consumer: in the queue's group, offsets committed only with the
    transactions that complete them, committed records only, and the group protocol that moves a
    killed process's partitions soonest (kafka/receive/group_protocol.py)."""
    return clients.base(
        cluster,
        **{
            "group.id": topic,  # names.queue_group: a queue's group is named as its topic
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            **group_settings(cluster, topic),
            # librdkafka's read-ahead beyond what this process buffered (default 64 MiB): 16 MiB
            # keeps fetches ahead of any reader here and leaves the memory to the buffer, where
            # it makes RECEIVEs return more of each group.
            "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
        },
    )


class PollLoop:
    """Consumes `assignment.topic` into `buffer` on a thread of its own (start()) until `closed`
    says so. `dead_letter(record, why)` takes a record `decode` refused; `report(stats())` is
    called every `report_interval` seconds when given."""

    def __init__(
        self,
        queue: str,
        cv: threading.Condition,
        buffer: GroupBuffer[Any],
        assignment: PartitionAssignment,
        *,
        decode: Callable[[KafkaRecord], Envelope],
        dead_letter: Callable[[KafkaRecord, str], None],
        max_buffered: int,
        closed: Callable[[], bool],
        stats: Callable[[], dict[str, Any]],
        report: Callable[[dict[str, Any]], None] | None,
        report_interval: float,
        cluster: Cluster,
        wake: Callable[[int], None] | None = None,
        busy: Callable[[], bool] = lambda: False,
    ):
        self._queue, self._cv, self._buffer, self._assignment = queue, cv, buffer, assignment
        self._cluster = cluster  # a refusal names its principal
        self._decode, self._dead_letter, self._max_buffered = decode, dead_letter, max_buffered
        self._closed, self._stats = closed, stats
        # Called under cv with how many records a poll buffered (the lease book wakes that many
        # RECEIVEs); None: every waiter, on every poll.
        self._wake = wake
        self._report, self._report_interval, self._reported_at = report, report_interval, 0.0
        self.group_meta: Any = None
        # The authorizer's refusal this loop met (the queue's topic or group, or a read its
        # callbacks made): RECEIVE raises it rather than wait. Cleared once a record comes.
        self.refused: Exception | None = None
        self._thread: threading.Thread | None = None
        self._failed_duty = ""  # the last failed duty logged (_duty_failed)
        # The committer's offset commits, made here between polls (kafka/receive/poll_commits.py);
        # `busy` (asked under cv): a transaction holds messages, so one may come at any moment.
        self.commits, self._busy = PollCommits(), busy

    def start(self, consumer: Consumer) -> None:
        """Subscribe `consumer` to the queue topic (with the assignment's rebalance callbacks)
        and start polling it."""
        assignment = self._assignment
        self.group_meta = consumer.consumer_group_metadata()
        consumer.subscribe(
            [assignment.topic],
            on_assign=assignment.on_assign,
            on_revoke=assignment.on_revoke,
            on_lost=assignment.on_lost,
        )
        self._thread = threading.Thread(
            target=self._run, args=(consumer,), name=f"kbroker-poll-{self._queue}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (once `closed` says so), if start() made it."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self, consumer: Consumer) -> None:
        try:
            self._loop(consumer)
        finally:
            self.commits.close()

    def _loop(self, consumer: Consumer) -> None:
        while not self._closed():
            try:
                self.commits.serve(consumer, self._cv)
                with self._cv:
                    soon = self._busy() or self.commits.waiting()
                if soon:  # a commit may be handed over at any moment: wait where it wakes us
                    records = consumer.consume(POLL_RECORDS, 0)
                    if not records:
                        self.commits.wait(COMMIT_WAIT)
                else:
                    # Back as soon as one record is there (consume(500, 0.1) waits out the 100 ms
                    # unless 500 come: every delivery waited), with what else is fetched already;
                    # the wait bounds how long the rebalance, pause and report duties below wait.
                    records = clients.consume_soon(consumer, POLL_RECORDS, POLL_WAIT)
                self.group_meta = consumer.consumer_group_metadata()
            except BaseException as exc:  # closed under us, a fatal consumer error, or a callback's
                # error re-raised by librdkafka's binding (not always an Exception subclass)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                if isinstance(exc, PermissionDeniedError):
                    self._refuse(exc)  # an on_assign callback's read was refused
                elif not self._closed():
                    log.error("poll of %s failed: %s", self._assignment.topic, exc)
                if not self._closed():
                    time.sleep(0.5)
                continue
            with self._cv:
                before = self._buffer.buffered
                for rec in records:
                    self._accept(rec)
                change = pause_change(self._assignment.paused, self._buffer.buffered, self._max_buffered)
                if change is not None:
                    self._assignment.set_paused(consumer, change)
                if self._wake is None:
                    self._cv.notify_all()
                else:  # a RECEIVE past its wait that waits for a partition's end looks every 10 ms
                    self._wake(self._buffer.buffered - before)
            try:
                if self._assignment.asking():
                    self._assignment.ask_waiting(consumer)
            except Exception as exc:  # noqa: BLE001 - the poll thread outlives any one duty
                self._duty_failed("assigning partitions that waited for their committed offsets", exc)
            # Only a reader that reads: a refused one (or one never given a partition) writes nothing.
            reads = self.refused is None and self._assignment.assigned_once
            if self._report is not None and reads and time.monotonic() - self._reported_at >= self._report_interval:
                self._reported_at = time.monotonic()
                self._report(self._stats())

    def _duty_failed(self, what: str, exc: Exception) -> None:
        """Log a failed duty of the poll thread once while it fails the same way."""
        said = f"{what} on {self._assignment.topic} failed: {exc}"
        if said != self._failed_duty:
            self._failed_duty = said
            log.error("%s", said)

    def _refuse(self, exc: Exception) -> None:
        """Record a refusal and wake the waiting RECEIVEs, which raise it: the caller's error is
        the one report (a CLI printed it twice), the log has it at info once while it stands."""
        if self.refused is None or str(self.refused) != str(exc):
            log.info("%s", exc)
        with self._cv:  # re-entrant: _accept holds it already
            self.refused = exc
            self._cv.notify_all()

    def _accept(self, rec: KafkaRecord) -> None:
        err, p, off = rec.error(), rec.partition(), rec.offset()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF and p is not None:
                self._assignment.reached_end(p)
            elif denied_code(err):
                topic = self._assignment.topic  # a queue's group is named as its topic
                self._refuse(
                    clients.denied(
                        self._cluster, err, f"reading queue {self._queue}", topic=("READ", topic), group=("READ", topic)
                    )
                )
            else:
                log.warning("consumer error on %s: %s", self._assignment.topic, err)
            return
        self.refused = None
        if p is None or off is None:
            return  # only error events lack a position
        tracker = self._assignment.fetched(p, off)
        if tracker is None:
            return
        try:
            env = self._decode(rec)
        except (MalformedRecord, UnicodeDecodeError) as exc:
            self._dead_letter(rec, str(exc))
            return
        self._buffer.accept(Buffered(env, rec, p, off, rec.timestamp()[1], tracker))
