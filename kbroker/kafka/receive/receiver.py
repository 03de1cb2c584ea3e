"""RECEIVE on one queue, for every reader of a process: key-level concurrency over one consumer.

A poll thread owns the queue's consumer and only ever buffers records per conversation group, so
a reader that holds a group for minutes never stalls polling. A RECEIVE leases one ready,
unlocked group (highest priority first, then oldest) and takes up to TOP(n) of its messages;
other readers lease other groups of the same partition at the same time. A lease ends when its
transaction commits (offsets complete) or rolls back (its records go back, in order, to the head
of the group). Memory is bounded: past `max_buffered` records the consumer pauses.

On a rebalance, leases on revoked partitions get `revoke_grace` seconds to finish; the rest are
doomed (their commit fails and nothing they did becomes visible), and the revocation waits for
any Kafka transaction already carrying their offsets, so the next owner never overlaps them.

QueueReceiver is the composition the rest of kbroker uses, over three parts that share its one
lock: the partitions this process owns (kafka/receive/partition_assignment.py), the leases of what
transactions took (kafka/receive/receive_leases.py) and the poll thread (kafka/receive/poll_loop.py). The
per-group bookkeeping (buffered records, the ready heap, group locks) is the pure
kbroker.core.receive.group_buffer.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import Message as KafkaRecord

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.conversation_endpoint import handle_for
from kbroker.core.dialogs.envelope import Envelope, Message
from kbroker.core.frozen import built
from kbroker.core.receive.group_buffer import Buffered, GroupBuffer
from kbroker.core.receive.receive_lease import lost_partition
from kbroker.kafka.receive.open_transaction_fence import OpenTransactionFence
from kbroker.kafka.receive.partition_assignment import HANGING_AFTER, PartitionAssignment
from kbroker.kafka.receive.poll_loop import QUEUED_MAX_KBYTES, PollLoop, consumer_settings, decode_envelope
from kbroker.kafka.receive.receive_leases import Lease, LeaseBook

__all__ = ["HANGING_AFTER", "QUEUED_MAX_KBYTES", "Lease", "QueueReceiver", "decode_envelope"]


class QueueReceiver:
    """RECEIVE on one queue topic for every transaction of the process. Built without I/O;
    start() creates the consumer (with `new_consumer`, given the consumer settings) and its poll
    thread."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        queue: str,
        *,
        dead_letter: Callable[["QueueReceiver", KafkaRecord, str], None],
        max_buffered: int = 20_000,
        revoke_grace: float = 5.0,
        commit_barrier: Callable[[Callable[[], None]], None] = lambda serve: None,
        topic: str | None = None,
        on_assign: Callable[[], None] = lambda: None,
        on_owned: Callable[[list[int]], None] = lambda partitions: None,
        on_disowned: Callable[[list[int]], None] = lambda partitions: None,
        report: Callable[[dict[str, Any]], None] | None = None,
        report_interval: float = 2.0,
        new_consumer: Callable[[dict[str, Any]], Consumer] = Consumer,
        decode: Callable[[KafkaRecord], Envelope] | None = None,
        committer_ids: tuple[str, ...] | None = None,
    ):
        self.queue = queue
        self.topic = topic or names.queue_topic(namespace, queue)  # or a secondary queue's topic
        self._cluster, self._new_consumer = Cluster.of(cluster), new_consumer
        self._closed = False
        self._taking = 0  # RECEIVEs under way (retire_if_idle waits for none)
        self._used_at = time.monotonic()  # when the last RECEIVE or dead letter was asked for
        self._consumer: Consumer | None = None
        self._cv = threading.Condition()  # guards the buffer, the offsets and the leases
        self._buffer: GroupBuffer[Lease] = GroupBuffer()
        # committer_ids: this process's group committer's transactional ids. Given, a partition
        # held by a dead process's open transaction gets it fenced (a queue's group is its topic).
        self._fence = (
            None if committer_ids is None else OpenTransactionFence(self._cluster, namespace, self.topic, committer_ids)
        )
        self._assignment = PartitionAssignment(
            self._cluster,
            self.topic,
            queue,
            self._cv,
            settle_revoked=lambda revoked, since, lost: self._leases.settle_revoked(revoked, since, lost=lost),
            forget_revoked=lambda revoked: self._leases.forget_revoked(revoked),
            commit_barrier=commit_barrier,
            serve_commits=lambda consumer: self._poll.commits.serve(consumer, self._cv),
            on_assign=on_assign,
            on_owned=on_owned,
            on_disowned=on_disowned,
            # Looked up on every question, so a test can stand in for the offsets reader.
            read_committed=lambda partitions: self._committed_by_reader(partitions),
            fence_hanging=self._fence,
        )
        self._leases = LeaseBook(
            self,
            self._buffer,
            self._assignment,
            self._cv,
            revoke_grace=revoke_grace,
            closed=lambda: self._closed,
            refused=lambda: self._poll.refused,
        )
        self._poll = PollLoop(
            queue,
            self._cv,
            self._buffer,
            self._assignment,
            # How a record becomes what the buffer orders and groups (MalformedRecord: dead-letter
            # it): a Service Broker message by default, a transport message for transport queues.
            decode=decode or decode_envelope,
            dead_letter=lambda rec, why: dead_letter(self, rec, why),
            max_buffered=max_buffered,
            closed=lambda: self._closed,
            stats=self.stats,
            report=report,
            report_interval=report_interval,
            cluster=self._cluster,
            wake=lambda records: self._leases.wake(records),
            # A commit may come soon: records leased, or buffered while a RECEIVE waits for them.
            busy=lambda: not self._leases.quiet() or (self._taking > 0 and self._buffer.buffered > 0),
        )

    def start(self) -> "QueueReceiver":
        """Create the consumer, subscribe to the topic and start the poll thread; returns self."""
        consumer = self._consumer = self._new_consumer(consumer_settings(self._cluster, self.topic))
        self._poll.start(consumer)
        return self

    def group_metadata(self) -> Any:
        """The consumer's group metadata (generation, member) as of the last poll. Taken on the
        poll thread: the consumer handle is busy there. A stale copy only makes Kafka refuse the
        commit (fencing), never accept a wrong one."""
        return self._poll.group_meta

    def stats(self) -> dict[str, Any]:
        """What this process holds of the queue right now: the in-process half of the queue view."""
        with self._cv:
            return {
                "topic": self.topic,
                "partitions": sorted(self._assignment.offsets),
                "waiting": sorted(self._assignment.waiting),
                **self._buffer.stats(),
                "paused": self._assignment.paused,
                "expelled": self._assignment.expelled,
            }

    def _committed_by_reader(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Committed offsets of waiting partitions, asked off the poll thread
        (PartitionAssignment.committed_by_reader)."""
        return self._assignment.committed_by_reader(partitions)

    # --- RECEIVE ------------------------------------------------------------------------------

    def waiting(self) -> int:
        """Records buffered here and not taken: what a monitoring loop counts as waiting."""
        return self._leases.waiting()

    def wait_for_waiting(self, timeout: float) -> int:
        """Wait up to `timeout` s for a buffered record not taken yet; returns how many there are."""
        return self._leases.wait_for_waiting(timeout)

    def receive(
        self,
        owner: Any,
        top: int,
        wait: float | None,
        *,
        conversation_group: str | None = None,
        conversation_id: str | None = None,
        give_up: Callable[[], bool] = lambda: False,
        settled: bool = True,
    ) -> tuple[Lease | None, list[Message]]:
        """Lease a group for `owner` and take up to `top` of its messages (expired ones are
        consumed but not returned). wait=0: what is there now; None: wait without time-out.
        `give_up` is asked while waiting (every 0.5 s at most): True ends the wait empty.
        `settled`: an empty answer also waits (up to 30 s) until every partition held was read
        to its end, so a backlog not yet fetched is not taken for an empty queue; False for a
        transaction's further groups: read to its end once since it was given to this process
        is enough (the end of a partition is known only at the next empty fetch, up to 500 ms
        after each record)."""
        lease, live, _expired = self.take(
            owner,
            top,
            wait,
            conversation_group=conversation_group,
            conversation_id=conversation_id,
            give_up=give_up,
            settled=settled,
        )
        return lease, [self._to_message(b) for b in live]

    def take(
        self,
        owner: Any,
        top: int,
        wait: float | None,
        *,
        conversation_group: str | None = None,
        conversation_id: str | None = None,
        give_up: Callable[[], bool] = lambda: False,
        settled: bool = True,
    ) -> tuple[Lease | None, list[Buffered], int]:
        """receive() as the buffered records: the lease, the live records taken in RECEIVE order
        (each with the envelope the receiver's decode made), and how many expired ones were taken
        with them."""
        with self._cv:
            self._taking += 1
        try:
            return self._leases.take(
                owner,
                top,
                wait,
                conversation_group=conversation_group,
                conversation_id=conversation_id,
                give_up=give_up,
                settled=settled,
            )
        finally:
            with self._cv:
                self._taking -= 1
                self._used_at = time.monotonic()

    def take_expired_heads(
        self, owner: Any, now_ms: int, *, limit: int = 1000, wait: float = 0.0
    ) -> tuple[list[Lease], list[int] | None]:
        """The start-up purge's take: each owned partition's run of records expired at `now_ms`
        from its lowest incomplete offset up to its first live record (core/receive/expired_heads.py),
        at most `limit` in all, one lease per record (commit them, then release them). Also the
        partitions not settled yet (their head not known live, nor the partition read to its end
        with nothing left to take), None while the group has not assigned this process its
        share. Nothing to take and something unsettled: waits up to `wait` s for records first."""
        with self._cv:
            self._taking += 1
        try:
            return self._leases.take_expired_heads(owner, now_ms, limit, wait)
        finally:
            with self._cv:
                self._taking -= 1
                self._used_at = time.monotonic()

    def _to_message(self, b: Buffered) -> Message:
        env, rec = b.envelope, b.record
        return built(
            Message,
            {
                "queue": self.queue,
                "conversation_handle": handle_for(env.conversation_id, env.to_side),
                "conversation_id": env.conversation_id,
                "conversation_group_id": env.conversation_group_id,
                "message_sequence_number": env.message_sequence_number,
                "message_type_name": env.message_type_name,
                "service_name": env.to_service_name,
                "service_contract_name": env.service_contract_name,
                "message_id": env.message_id,
                "body": rec.value() or b"",
                "priority": env.priority,
                "correlation_id": env.correlation_id,
                "reply_to": env.reply_to,
                "expires": env.expires,
                "enqueued_time": b.enqueued_ms,
                "partition": b.partition,
                "offset": b.offset,
                "validation": "",  # the transaction's RECEIVE fills it in from the catalog
                "extra": {"envelope": env, "record": rec},  # the record: re-keying copies its headers
            },
        )

    def lock_group(self, owner: Any, group: str, timeout: float, partition: int | None = None) -> Lease | None:
        """Lock `group` (of `partition`, where known) for `owner` without receiving
        (core/dialogs/group_lock.py): the lease that holds it (owner's own, or a new one taking no
        record, ended by release()), waiting up to `timeout` s for another transaction's; None if
        that one did not end in time."""
        return self._leases.lock_group(owner, group, timeout, partition)

    def reserve_group(self, owner: Any, group: str) -> tuple[Lease, bool]:
        """Lock `group` for `owner` (another process's hold) now, or as soon as the transaction
        holding it ends, before anyone else here: the lease, and whether it locks the group yet
        (holds() tells later). unreserve() withdraws it; release() ends it."""
        return self._leases.reserve_group(owner, group)

    def holds(self, lease: Lease) -> bool:
        return self._leases.holds(lease)

    def unreserve(self, lease: Lease) -> None:
        self._leases.unreserve(lease)

    def has_buffered(self, group: str) -> bool:
        """Whether records of `group` wait here (a group another process holds: it is asked back)."""
        with self._cv:
            return self._buffer.has(group)

    def owns(self, partition: int) -> bool:
        """Whether this receiver serves `partition` of its topic now."""
        with self._cv:
            return partition in self._assignment.offsets or partition in self._assignment.waiting

    def split(self, lease: Lease, offsets: list[tuple[int, int]]) -> Lease:
        """Move the records at `offsets` out of `lease` into a lease of their own (same group,
        no lock), so they can commit on their own: the re-keying of a moved conversation."""
        return self._leases.split(lease, offsets)

    @property
    def closed(self) -> bool:
        """Whether close() has begun."""
        return self._closed

    def retire_if_idle(self, idle_for: float) -> bool:
        """Mark this receiver closed if nothing asked it to RECEIVE or dead-letter for `idle_for`
        s and it holds nothing a transaction still needs (no group leased, no completion waiting
        for its Kafka transaction); True if so, and the caller then close()s it. A RECEIVE that
        comes after returns empty. Its consumer leaves the group, so the queue's partitions go to
        readers that read."""
        with self._cv:
            if self._closed or self._taking or time.monotonic() - self._used_at < idle_for or not self._leases.quiet():
                return False
            self._closed = True
            self._cv.notify_all()
            return True

    def dead_letter_lease(self, rec: KafkaRecord) -> Lease:
        """A lease over one malformed record, completed when its dead letter commits."""
        self._used_at = time.monotonic()  # its commit is under way: not idle (retire_if_idle)
        return self._leases.dead_letter_lease(rec)

    # --- commit and rollback (called by the committer and by transactions) ------------------

    def include(self, leases: list[Lease]) -> list[TopicPartition] | None:
        """Mark leases as carried by a Kafka transaction and complete their offsets; returns the
        positions to commit, or None when a lease was doomed by a rebalance."""
        return self._leases.include(leases)

    def exclude(self, leases: list[Lease]) -> None:
        """The Kafka transaction aborted: the offsets are incomplete again."""
        self._leases.exclude(leases)

    def commit_offsets(
        self, offsets: list[TopicPartition], leases: list[Lease]
    ) -> concurrent.futures.Future[list[TopicPartition]]:
        """Commit `offsets` (what include(`leases`) gave) with the consumer's own offset commit,
        no Kafka transaction: the poll thread makes it (kafka/receive/poll_commits.py), unless a
        lease's partition was revoked meanwhile. The future holds Consumer.commit's answer or
        its exception."""
        return self._poll.commits.submit(
            offsets,
            lambda: (
                not any(lost_partition(lease.offsets, lease.assignments, self._assignment.offsets) for lease in leases)
            ),
        )

    def release(self, lease: Lease, committed: bool) -> None:
        """End a lease. Not committed: its records go back to the head of their group, in order
        (unless its partition was revoked: then the next owner reads them)."""
        self._leases.release(lease, committed)

    def give_back(self, lease: Lease, keep: int) -> None:
        """A rollback to a savepoint: the records `lease` took after its first `keep` go back to
        the head of their group, in order, and the group stays locked by the lease (its
        transaction's next RECEIVE of the group takes them again; nobody else until it ends)."""
        self._leases.give_back(lease, keep)

    def close(self) -> None:
        """Stop the poll thread and close the consumer (if start() made them)."""
        self._closed = True
        with self._cv:
            self._cv.notify_all()
        self._poll.join(timeout=10)
        if self._consumer is not None:
            self._consumer.close()
        self._assignment.close()
        if self._fence is not None:
            self._fence.close()
