"""The timer service: fires the due timers of a namespace's timers topic (see core/dialogs/timers.py for
the records and why each arm has its own key)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.timer_schedule import Entry, TimerSchedule
from kbroker.core.dialogs.timers import firing_records, timer_key_of, timer_value
from kbroker.core.records import Record
from kbroker.core.rejected import Rejected
from kbroker.core.txn.faults import Action, Deadline, committed_by_offsets, decide
from kbroker.kafka import clients, messages
from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.steps import FailureSink, report, run_steps
from kbroker.kafka.txn.guarded import (
    GuardedProducer,
    TransactionFailed,
    aborted,
    replace_producer,
    service_producer,
    transact,
)

log = logging.getLogger("kbroker.timers")
COMPONENT = "timer service"
# kbroker's own deadline on one firing transaction (librdkafka may not honour its timeouts after a
# broker restart): as long as Kafka keeps a transaction open before aborting it.
FIRE_SECONDS = 10.0


class TimerService:
    """Fires due timers of the namespace. Run one or more per cluster (the worker runs one);
    they share the timers topic's partitions."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        *,
        poll_interval: float = 0.25,
        endpoints: EndpointStore | None = None,
        guard: FailureSink | None = None,
    ):
        """`endpoints`: a store to share (the worker's Broker has one); else the service reads
        the endpoints topic with a store of its own."""
        self.namespace = namespace
        self._guard = guard
        self.topic = names.timers_topic(namespace)
        self._own_endpoints = endpoints is None
        self._endpoints = endpoints or EndpointStore(cluster, namespace, clients.producer(cluster))
        self._poll_interval = poll_interval
        self.schedule = TimerSchedule()
        self.fired = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.denied: BaseException | None = None  # the authorizer's refusal that stopped it
        group = names.timers_group(namespace)
        self._consumer = clients.consumer(
            cluster, group, **{"session.timeout.ms": 10_000, "partition.assignment.strategy": "range"}
        )
        self._cluster = Cluster.of(cluster)
        self._reading_refused = clients.reading_refused(
            self._cluster, "the timer service reading the timers topic", self.topic, group
        )
        # One transactional id for the service's life: a producer made after a fatal error
        # fences the old one (and aborts its open transaction) instead of waiting it out.
        self._transactional_id = f"{group}.{uuid.uuid4()}"
        self._producer = self._new_producer()
        # The service reads its partitions whole at each assignment: a bad record is recorded
        # once per service (its Rejects remembers it), not at every rebalance.
        self.rejects = Rejects(cluster, namespace, COMPONENT)

    def _new_producer(self) -> GuardedProducer:
        """A producer under the service's transactional id (fencing any earlier one, whose open
        transaction the coordinator then aborts), initialised within kbroker's deadline."""
        return service_producer(self._cluster, self._transactional_id)

    # --- the loop ------------------------------------------------------------------------------

    def start(self) -> "TimerService":
        self._consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        self._thread = threading.Thread(target=self._run, name="kbroker-timers", daemon=True)
        self._thread.start()
        return self

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Every armed timer of a partition is a live record of the compacted topic: read them all.
        consumer.assign([TopicPartition(p.topic, p.partition, OFFSET_BEGINNING) for p in partitions])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.schedule.drop_partitions({p.partition for p in partitions})

    def _run(self) -> None:
        self.denied = run_steps(self.step, self._stop, COMPONENT, self._guard, log)

    def step(self) -> None:
        nxt = self.schedule.next_due()
        wait = self._poll_interval if nxt is None else min(self._poll_interval, max(nxt - time.time(), 0.0))
        # At once when a record comes: a timer armed for sooner than `wait` fires on time.
        batch = clients.consume_soon(self._consumer, 500, wait)
        for msg in messages.records(
            batch, lambda err: log.warning("timers topic: %s", err), refused=self._reading_refused
        ):
            try:  # anyone who may write the topic may write anything: set aside, never fired
                key = timer_key_of(msg.key(), msg.value())
                value = None if msg.value() is None else timer_value(self.namespace, msg.value())
            except Rejected as exc:
                self.rejects.reject(msg, exc.reason)
                continue
            if value is None:
                self.schedule.remove(key)
            else:
                self.schedule.put(Entry(key, float(value["due"]), *messages.position(msg), value))
        due = self.schedule.pop_due(time.time())
        if due:
            self._fire(due)

    def _fire(self, entries: list[Entry]) -> None:
        store = self._endpoints
        store.refresh()  # the sides' current states decide who gets the message
        records: list[Record] = []
        for e in entries:
            records.extend(firing_records(e.value, store.cached))
            records.append((self.topic, e.key, None, None))
        positions = [tp for tp in self._consumer.position(self._consumer.assignment()) if tp.offset >= 0]
        offsets = [(positions, self._consumer.consumer_group_metadata())] if positions else []
        deadline = Deadline(FIRE_SECONDS)
        try:
            transact(self._producer, records, offsets, deadline, FIRE_SECONDS)
        except TransactionFailed as failed:
            if self._recover(failed, deadline, positions):
                self.fired += len(entries)  # it committed after all
            else:
                for e in entries:
                    self.schedule.put(e)
            raise  # run_steps reports the failure
        self.fired += len(entries)

    def _recover(self, failed: TransactionFailed, deadline: Deadline, positions: list[TopicPartition]) -> bool:
        """Leave the producer ready after a failed firing (txn_faults decides how, as for the
        group committer); whether the firing committed after all (then firing again would repeat
        it). An in-doubt commit is settled as the committer does: the replacement's init returns
        once the coordinator finished the old transaction, which carried the consumer's
        positions, so the group's committed offsets say which. Unsure (no offsets to compare):
        the timers fire again, which a DialogTimer tolerates better than never firing."""
        action = decide(failed.failure, deadline.left())
        if action is Action.ABORT:
            if aborted(self._producer, FIRE_SECONDS):
                return False
            action = Action.REPLACE
        self._producer = replace_producer(
            self._producer, self._new_producer, self._stop, lambda exc: report(self._guard, COMPONENT, exc, log)
        )
        if action is Action.REPLACE or not positions or self._stop.is_set():
            return False
        try:
            found = self._consumer.committed(
                [TopicPartition(tp.topic, tp.partition) for tp in positions], timeout=FIRE_SECONDS
            )
        except KafkaException:
            return False
        return committed_by_offsets(
            [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in positions],
            [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in found],
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._consumer.close()
        self._producer.abandon()  # its thread ends and drops the producer
        self.rejects.close()
        if self._own_endpoints:
            self._endpoints.close()

    def __enter__(self) -> "TimerService":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
