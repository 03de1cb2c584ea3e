"""Which partitions of a queue this process reads, from where, and whether it reads them now.

The queue's consumer group hands this process partitions (cooperative-sticky rebalances). Each is
assigned to the consumer at the committed offsets read for it here, never left for the consumer
to fetch itself (after a broker restart that fetch was seen to leave partitions unread for good);
a partition whose committed offsets a still open Kafka transaction holds waits on its own while
the others are read. On a revocation the leases on the revoked partitions are settled first (the
receiver's lease book), and any Kafka transaction already carrying their offsets finishes before
the next owner may start. Back-pressure pauses and resumes every assigned partition.

Part of kafka/receive/receiver.QueueReceiver, which holds the one lock (`cv`) all its parts share.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from kbroker.core.cluster import Cluster
from kbroker.core.receive.offsets import PartitionOffsets, caught_up
from kbroker.kafka.receive.open_transaction_fence import FENCE_AFTER
from kbroker.kafka.snapshot import group_offsets, offsets_reader

log = logging.getLogger("kbroker.receiver")

# A partition whose committed offsets stay unreadable this long is held by a hanging transaction
# (Kafka aborts an open one after transaction.timeout.ms, 10 s for kbroker's producers).
HANGING_AFTER = 60.0

# Seconds the rebalance callback asks for the committed offsets of the partitions it is given; any
# still unanswered wait, asked again off the poll thread. It was 10 s: a partition held by a dead
# reader's open transaction kept the poll thread, the other partitions and the fence waiting.
ASSIGN_ASK = 1.0

ReadCommitted = Callable[[list[TopicPartition]], list[TopicPartition]]


class PartitionAssignment:
    """The partitions of `topic` this process owns (with their offsets) and those that wait for
    their committed offsets. Its rebalance callbacks run on the poll thread, inside the consumer's
    poll; `settle_revoked(revoked, since, lost)` is called under `cv` when partitions go (before
    the commit barrier; `lost`: the group gave them to another member already),
    `forget_revoked(revoked)` under `cv` once they are gone, and `read_committed` asks the group
    coordinator for committed offsets (committed_by_reader when None)."""

    def __init__(
        self,
        cluster: Cluster,
        topic: str,
        queue: str,
        cv: threading.Condition,
        *,
        settle_revoked: Callable[[set[int], float, bool], None],
        forget_revoked: Callable[[set[int]], None],
        commit_barrier: Callable[[Callable[[], None]], None],
        serve_commits: Callable[[Consumer], None] = lambda consumer: None,
        on_assign: Callable[[], None],
        on_owned: Callable[[list[int]], None] = lambda partitions: None,
        on_disowned: Callable[[list[int]], None] = lambda partitions: None,
        read_committed: ReadCommitted | None = None,
        fence_hanging: Callable[[list[TopicPartition]], object] | None = None,
    ):
        self.topic, self._queue, self._cluster, self._cv = topic, queue, cluster, cv
        self._settle_revoked, self._forget_revoked = settle_revoked, forget_revoked
        # The barrier runs `serve` while it waits: the offset commits the committer handed this
        # poll thread, which is here, inside its rebalance callback (kafka/receive/poll_commits.py).
        self._commit_barrier, self._serve_commits = commit_barrier, serve_commits
        self._on_assign_hook = on_assign
        # The group holds (kafka/dialogs/group_holds.py): told before a partition is served and
        # once it is given up, so holds of other processes on its groups are kept.
        self._on_owned, self._on_disowned = on_owned, on_disowned
        self._read_committed = read_committed or self.committed_by_reader
        # Given the partitions that have waited FENCE_AFTER seconds, ends the Kafka transaction a
        # dead process left open on them (kafka/receive/open_transaction_fence.py), on a thread of its own.
        self._fence_hanging = fence_hanging
        self._fencing: concurrent.futures.Future[None] | None = None
        self._fencer: concurrent.futures.ThreadPoolExecutor | None = None
        self.offsets: dict[int, PartitionOffsets] = {}  # the partitions owned, guarded by cv
        self._eof: set[int] = set()
        self._read_once: set[int] = set()  # read to their end at least once since given to this process
        self.paused = False
        # Whether the group has assigned this process its share yet, even an empty one (the
        # cooperative protocol calls on_assign at the end of every rebalance): the start-up purge
        # of expired messages waits for it.
        self.assigned_once = False
        self.expelled = 0  # times the group expelled this process (on_lost), for its stats
        self._offsets_reader: Consumer | None = None  # reads committed offsets when the consumer does not
        # Partitions the group gave this process that wait for readable committed offsets
        # (partition -> since when, monotonic), and whether that was logged.
        self.waiting: dict[int, float] = {}
        self._waiting_noted = self._hanging_noted = False
        self._waiting_asked = 0.0
        # The question about the waiting partitions' offsets under way (on `_asker`'s thread).
        self._waiting_read: concurrent.futures.Future[list[TopicPartition]] | None = None
        self._asker: concurrent.futures.ThreadPoolExecutor | None = None

    # --- the records the poll thread fetched (called under cv) ---------------------------------

    def reached_end(self, partition: int) -> None:
        """The consumer read to the end of `partition` (its end-of-partition event)."""
        self._eof.add(partition)
        self._read_once.add(partition)

    def fetched(self, partition: int, offset: int) -> PartitionOffsets | None:
        """Note a fetched record; the partition's tracker if the record is to be buffered (the
        partition is still this process's and no earlier owner completed the record: the commit
        metadata lists it), else None."""
        tracker = self.offsets.get(partition)
        if tracker is None:
            return None  # a late record of a partition already revoked
        self._eof.discard(partition)
        done = tracker.already_done(offset)
        tracker.fetched(offset)
        return None if done else tracker

    def at_end(self, partition: int) -> bool:
        """Whether the consumer has read `partition` to its end, with nothing fetched since."""
        return partition in self._eof

    def caught_up(self) -> bool:
        """Every partition owned was read to its end (and one is owned)."""
        return caught_up(self.offsets, self._eof)

    def read_once(self) -> bool:
        """Every partition owned was read to its end at least once since this process was given
        it: what it held then is buffered, whatever came since."""
        return caught_up(self.offsets, self._read_once)

    def set_paused(self, consumer: Consumer, paused: bool) -> None:
        """Pause (True) or resume (False) every partition the consumer is assigned."""
        if paused:
            consumer.pause(consumer.assignment())
        else:
            consumer.resume(consumer.assignment())
        self.paused = paused

    # --- rebalance callbacks (on the poll thread) ----------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._on_assign_hook()
        if partitions:
            try:
                self._on_owned(sorted(tp.partition for tp in partitions))
            except Exception as exc:  # noqa: BLE001 - served anyway; the holds' own log says more
                log.warning("group holds of %s %s not read before serving them: %s", self.topic, partitions, exc)
        with self._cv:
            for tp in partitions:
                self.waiting.setdefault(tp.partition, time.monotonic())
            self.assigned_once = True  # what it gave waits (unsettled) until assigned below
        self._assign_waiting(consumer, lambda tps: consumer.committed(tps, timeout=ASSIGN_ASK))

    def _assign_waiting(self, consumer: Consumer, read: ReadCommitted) -> None:
        """Assign the partitions the group gave this process whose committed offsets `read` can
        tell now, at those offsets; the rest wait for the poll loop to ask again (ask_waiting,
        every second). One partition whose offsets stay unstable (a Kafka transaction holding them
        still open) must not keep the others from being read: after a broker restart such a
        transaction can only be closed by its producer's next commit, which may be this very
        process's, of offsets of the other partitions."""
        with self._cv:
            waiting = sorted(self.waiting)
        found: list[TopicPartition] = []
        if waiting:
            try:
                found = read([TopicPartition(self.topic, p) for p in waiting])
            except (KafkaException, concurrent.futures.TimeoutError) as exc:
                self._note_waiting(f"{exc}")
        ready = [tp for tp in found if tp.error is None]
        if len(ready) < len(found):
            self._note_waiting("; ".join(f"[{tp.partition}] {tp.error}" for tp in found if tp.error is not None))
        with self._cv:
            for tp in ready:
                self.offsets[tp.partition] = PartitionOffsets(max(tp.offset, 0), tp.metadata)
                self._eof.discard(tp.partition)
                self._read_once.discard(tp.partition)
                self.waiting.pop(tp.partition, None)
        # At the offsets just read, so the consumer does not fetch them again itself: after a
        # broker restart its own fetch was seen to meet a stale coordinator and leave the
        # partitions unfetched for good (librdkafka issue #5586), a reader idle for ever. Called
        # even with none: in the rebalance callback, assigning nothing keeps the binding from
        # assigning every partition itself at the offsets the consumer would fetch.
        start = [
            TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING) for tp in ready
        ]
        try:
            consumer.incremental_assign(start)
        except KafkaException:
            # Refused (the group expelled this process meanwhile, say): they wait again, so no
            # offsets stand for partitions the consumer does not hold.
            with self._cv:
                for tp in ready:
                    self.offsets.pop(tp.partition, None)
                    self.waiting.setdefault(tp.partition, time.monotonic())
            raise
        if not start:
            return
        if self.paused:
            consumer.pause(start)
        if self._waiting_noted:
            log.warning(
                "partitions %s of %s assigned after waiting for their committed offsets",
                [tp.partition for tp in ready],
                self.topic,
            )
        if not self.waiting:
            self._waiting_noted = self._hanging_noted = False

    def _note_waiting(self, why: str) -> None:
        """Say once that partitions wait for their committed offsets, and once more (an error)
        when one has waited long enough to be a hanging transaction rather than a slow one."""
        if not self._waiting_noted:
            self._waiting_noted = True
            log.warning("committed offsets of %s not read yet (%s); asking again", self.topic, why)
        longest = time.monotonic() - min(self.waiting.values(), default=time.monotonic())
        if longest >= HANGING_AFTER and not self._hanging_noted:
            self._hanging_noted = True
            log.error(
                "committed offsets of %s partitions %s unreadable for %.0f s (%s): a Kafka transaction "
                "holding them is still open. The next commit of its producer closes it; if that "
                "process is gone, find it with `kafka-transactions.sh find-hanging` and abort it",
                self.topic,
                sorted(self.waiting),
                longest,
                why,
            )

    def asking(self) -> bool:
        """Whether partitions wait for their committed offsets, or a question about them is out."""
        return bool(self.waiting) or self._waiting_read is not None

    def ask_waiting(self, consumer: Consumer) -> None:
        """Once a second, ask for the committed offsets of the partitions still waiting, on a
        thread of its own: while a Kafka transaction holds a partition's offsets the answer
        takes seconds (reader.group_offsets), and the poll thread must go on fetching the
        partitions it has. The answer is assigned here, on the poll thread, once it is in."""
        asked = self._waiting_read
        if asked is not None:
            if not asked.done():
                return
            self._waiting_read = None

            def answered(tps: list[TopicPartition]) -> list[TopicPartition]:
                still = {tp.partition for tp in tps}  # one may have been revoked meanwhile
                return [tp for tp in asked.result() if tp.partition in still]

            self._assign_waiting(consumer, answered)
            return
        self._fence_waiting()
        if self.waiting and time.monotonic() - self._waiting_asked >= 1.0:
            self._waiting_asked = time.monotonic()
            if self._asker is None:
                self._asker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"kbroker-offsets-{self._queue}"
                )
            with self._cv:
                waiting = [TopicPartition(self.topic, p) for p in sorted(self.waiting)]
            self._waiting_read = self._asker.submit(self._read_committed, waiting)

    def _fence_waiting(self) -> None:
        """Hand the partitions waiting FENCE_AFTER seconds or more to the fence, one call at a
        time (the fence itself does not fence the same ids twice in a row)."""
        fence = self._fence_hanging
        if fence is None or (self._fencing is not None and not self._fencing.done()):
            return
        now = time.monotonic()
        with self._cv:
            due = [
                TopicPartition(self.topic, p) for p, since in sorted(self.waiting.items()) if now - since >= FENCE_AFTER
            ]
        if not due:
            return
        if self._fencer is None:
            self._fencer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"kbroker-fence-{self._queue}")
        self._fencing = self._fencer.submit(self._fence_logged, fence, due)

    def _fence_logged(self, fence: Callable[[list[TopicPartition]], object], due: list[TopicPartition]) -> None:
        try:
            fence(due)
        except Exception:  # logged with its traceback: Kafka's own timeout still ends the transaction
            log.warning(
                "fencing the holder of %s partitions %s failed", self.topic, [tp.partition for tp in due], exc_info=True
            )

    def committed_by_reader(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Committed offsets asked of the group coordinator by a consumer that never joins the
        group (reader.group_offsets): after a broker restart the group's own consumer was seen
        never to answer."""
        if self._offsets_reader is None:
            self._offsets_reader = offsets_reader(self._cluster, self.topic)  # a queue's group is named as its topic
        return group_offsets(self._offsets_reader, partitions, 10)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._give_up(consumer, partitions, lost=False)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The group expelled this process (its session expired, say under a stall) and gave
        its partitions to others already: nothing taken from them may commit now, so no lease
        on them gets the grace a revocation gives."""
        log.warning(
            "partitions %s of %s lost: the group expelled this process and gave them to "
            "another reader; the transactions holding their messages will fail",
            sorted(tp.partition for tp in partitions),
            self.topic,
        )
        self.expelled += 1
        self._give_up(consumer, partitions, lost=True)

    def _give_up(self, consumer: Consumer, partitions: list[TopicPartition], *, lost: bool) -> None:
        revoked = {tp.partition for tp in partitions}
        since = time.monotonic()
        try:
            with self._cv:
                for p in revoked:
                    self.waiting.pop(p, None)  # never handed to the consumer
                self._settle_revoked(revoked, since, lost)
            # A Kafka transaction already carrying offsets of these partitions finishes first.
            self._commit_barrier(lambda: self._serve_commits(consumer))
            with self._cv:
                for p in revoked:
                    self.offsets.pop(p, None)
                    self._eof.discard(p)
                    self._read_once.discard(p)
                self._forget_revoked(revoked)
                self._cv.notify_all()
            self._on_disowned(sorted(revoked))
        finally:
            # Always, and only what the consumer holds. A callback that neither assigns nor
            # unassigns leaves it to the binding, and an unassign naming a partition the consumer
            # does not hold fails ("Can't subtract from empty assignment"): either way the
            # revocation stays unfinished, and librdkafka neither finishes the rebalance nor,
            # after an expulsion, joins the group again, so the queue is never read here again
            # (seen at start-up, when the first ask for offsets timed out). Called even with none.
            held = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
            consumer.incremental_unassign([tp for tp in partitions if tp.partition in held])

    def close(self) -> None:
        """Stop asking about waiting partitions and close the offsets reader (after the poll thread)."""
        if self._asker is not None:
            self._asker.shutdown(wait=True)
        if self._fencer is not None:
            self._fencer.shutdown(wait=True)
        if self._offsets_reader is not None:
            self._offsets_reader.close()
