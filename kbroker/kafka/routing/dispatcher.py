"""The dispatcher: saves the messages other namespaces sent to this one (the inbound topic) to
their queues, in per-dialog order and exactly once, and acknowledges them.

One Kafka transaction per batch holds the saved queue records, the acknowledgements (the acks
topic: the next sequence number each dialog direction expects) and the inbound offsets, so a
message is saved and acknowledged together or not at all. A retransmitted copy of a saved message
is below its direction's expected number and is dropped; one that arrives ahead of a gap waits in
memory (core/dispatch.Inbox) until its predecessor comes or the tick's sweep drops it (the sender
sends it again). No transaction spans two clusters: the sender learns of the save by reading the
acks topic here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Consumer, Message, TopicPartition

from kbroker import metrics
from kbroker.core import names
from kbroker.core.activation.tick import EVERY_2ND, EVERY_5TH, EVERY_TICK, TickCounter, TickSchedule, advance
from kbroker.core.catalog.models import END_DIALOG, ERROR, Catalog
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.arrival import REFUSE, SAVE, WAIT, check_arrival
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.records import Record
from kbroker.core.routing.directions import FORGET_AFTER, Directions, read_acks
from kbroker.core.routing.dispatch import Inbox, declared_follows, describe_drops, gap_status, next_in_line
from kbroker.core.routing.forwarding import MB
from kbroker.core.routing.kept import kept
from kbroker.core.routing.routes import address
from kbroker.core.routing.signing import MAX_AGE, RecordRefused, verified
from kbroker.core.routing.transmission import ack_key
from kbroker.core.security.dialog_security import SealRefused, Security, received_security
from kbroker.core.txn.faults import Deadline
from kbroker.errors import BrokerUnavailableError, denied_code
from kbroker.kafka import clients, messages
from kbroker.kafka.routing.forwarder import Forwarder
from kbroker.kafka.routing.inbound import forwarded, next_hop, queue_records
from kbroker.kafka.routing.keys import Keys
from kbroker.kafka.routing.sealing import Opener
from kbroker.kafka.security.certificates import CertificateStore
from kbroker.kafka.snapshot import latest_values
from kbroker.kafka.steps import FailureSink, report, run_steps
from kbroker.kafka.txn.guarded import (
    GuardedProducer,
    TransactionFailed,
    aborted,
    replace_producer,
    started_for,
    transact,
)

log = logging.getLogger("kbroker.dispatcher")
COMPONENT = "dispatcher"
BATCH_SECONDS = 10.0  # kbroker's deadline on one batch's transaction
ACKS_READ_SECONDS = 30.0


class Dispatcher:
    """Reads the namespace's inbound topic. Run one or more per cluster (each worker runs one);
    they share its partitions. `catalog()` gives the namespace's current catalog."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        catalog: Callable[[], Catalog],
        *,
        guard: FailureSink | None = None,
        poll_interval: float = 0.05,
        tick: float = 5.0,
        keys: Keys | None = None,
        max_age: float = MAX_AGE,
        forget_after: float = FORGET_AFTER,
        certificates: CertificateStore | None = None,
    ):
        """`keys`: the public keys of the namespaces whose messages are accepted (config.keys_dir()
        by default); `certificates`: the services' certificates that open sealed dialogs (there
        too); `max_age`: how old a signature may be; `forget_after`: how long after a
        direction ended its acknowledgement is tombstoned (core/routing/directions.py)."""
        self.cluster, self.namespace = Cluster.of(cluster), namespace
        self._keys, self._max_age = keys or Keys(), max_age
        # The master secret only when a reply comes sealed: a namespace that never begins a
        # secured dialog needs no master key to receive.
        self.opener = Opener(namespace, lambda m: self._keys.secret(namespace, m), certificates or CertificateStore())
        self.directions = Directions(forget_after)
        self.kept = self.forgotten = 0  # records refused and kept; acknowledgements tombstoned
        self.here = address(self.cluster.bootstrap, namespace)  # where LOCAL routes lead
        self._catalog = catalog
        self._guard = guard
        self._poll_interval = poll_interval
        self.topic = names.inbound_topic(namespace)
        self.inbox = Inbox()
        self.saved = self.duplicates = self.refused = self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.denied: BaseException | None = None  # the authorizer's refusal that stopped it
        self._refused: set[str] = set()
        group = names.dispatcher_group(namespace)
        self._consumer = clients.consumer(
            cluster,
            group,
            **{"session.timeout.ms": 10_000, "partition.assignment.strategy": "range", "auto.offset.reset": "earliest"},
        )
        self._reading_refused = clients.reading_refused(
            self.cluster, "the dispatcher reading its inbound topic", self.topic, group
        )
        self._transactional_id = f"{group}.{uuid.uuid4()}"
        self._producer = self._new_producer()
        self._assigned = False
        self.forwarder: Forwarder | None = None
        self.schedule = TickSchedule(interval=tick)
        self._ticks = TickCounter()

    def _new_producer(self) -> GuardedProducer:
        return started_for(
            self.cluster,
            clients.idempotent_producer(
                self.cluster, **{"transactional.id": self._transactional_id, "transaction.timeout.ms": 10_000}
            ),
            self._transactional_id,
            30,
        )

    def start(self) -> "Dispatcher":
        self._consumer.subscribe(
            [self.topic], on_assign=self._on_rebalance, on_revoke=self._on_rebalance, on_lost=self._on_rebalance
        )
        self._thread = threading.Thread(target=self._run, name="kbroker-dispatcher", daemon=True)
        self._thread.start()
        return self

    def _on_rebalance(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = False  # the acks are read again before the next batch (others wrote some)

    def _load_acks(self) -> None:
        """The expected sequence numbers, from the acks topic: the dispatcher's duplicate check
        survives restarts, rebalances and in-doubt commits because it is the acknowledgements
        themselves (read to the end, or not at all)."""
        topic = names.acks_topic(self.namespace)
        raw = latest_values(self.cluster, topic, ACKS_READ_SECONDS, must_finish=True)
        if raw is None:
            raise BrokerUnavailableError(f"{topic} does not exist (is the namespace's catalog applied?)")
        acks, skipped = read_acks(raw)
        for why in skipped:  # another client's record: its direction's next ack replaces it
            log.warning("%s: skipped a record that is no acknowledgement, %s", topic, why)
        self.directions.load(acks)
        self.inbox.expected = {k: int(v["next"]) for k, v in acks.items()}
        self.inbox.buffered = []
        self._refused = {k for k, v in acks.items() if v.get("error")}
        self._assigned = True

    def _run(self) -> None:
        self.denied = run_steps(self.step, self._stop, COMPONENT, self._guard, log)

    def step(self) -> None:
        batch = messages.records(
            clients.consume_soon(self._consumer, 500, self._poll_interval),
            lambda err: log.warning("inbound topic: %s", err),
            refused=self._reading_refused,
        )
        now = time.time()
        self._ticks, run = advance(self._ticks, now, self.schedule)
        due = run.due if run is not None else frozenset()
        if EVERY_TICK in due:
            self.sweep(now)
            if self._assigned:
                self._forget(now)
        if self.forwarder is not None:
            self.forwarder.pump(now, EVERY_2ND in due)
            if EVERY_5TH in due:
                self.forwarder.sweep(now)
        if not batch:
            return
        if not self._assigned:
            self._load_acks()
        self._dispatch(batch, now)

    def sweep(self, now: float) -> None:
        """The every-tick sweep (docs/sources.md#periodic-tasks): out-of-order and stale buffered messages go."""
        dropped = self.inbox.sweep(now)
        if dropped:
            self.dropped += len(dropped)
            metrics.of(metrics.DISPATCHED, self.namespace, "dropped").inc(len(dropped))
            for key, what in sorted(describe_drops(dropped, self.inbox.expected).items()):
                log.info("dispatcher dropped from direction %s: %s; its sender sends them again", key, what)

    def _dispatch(self, batch: list[Message], now: float) -> None:
        catalog = self._catalog()
        saved_state, refused_before = self.inbox.checkpoint(), set(self._refused)
        directions_before = self.directions.checkpoint()
        records: list[Record] = []
        acks: dict[str, dict[str, Any]] = {}
        counts = {"saved": 0, "duplicates": 0, "refused": 0, "kept": 0}
        first: dict[int, int] = {}  # partition -> the batch's first offset, and its last
        last: dict[int, int] = {}
        for msg in batch:
            records.extend(self._one(msg, catalog, now, acks, counts))
            p, o = messages.position(msg)
            first.setdefault(p, o)
            last[p] = o
        records.extend(
            (names.acks_topic(self.namespace), k, orjson.dumps(self._ack(k, v, now)), None) for k, v in acks.items()
        )
        positions = [TopicPartition(self.topic, p, o + 1) for p, o in last.items()]
        try:
            transact(
                self._producer,
                records,
                [(positions, self._consumer.consumer_group_metadata())],
                Deadline(BATCH_SECONDS),
                BATCH_SECONDS,
            )
        except TransactionFailed as failed:
            if self._recover():  # aborted: the batch's state goes back
                self.inbox.restore(saved_state)
                self._refused = refused_before
                self.directions.restore(directions_before)
            for p, o in first.items():  # read the batch again
                self._consumer.seek(TopicPartition(self.topic, p, o))
            if failed.error is not None and denied_code(failed.error):
                # Not this message's fault, nor its sender's: an ACL this namespace's router
                # lacks. The dispatcher stops with the refusal, as every kbroker service does; its
                # senders keep their messages (unacknowledged) until it runs again.
                written = ", ".join(sorted({r[0] for r in records}))
                raise clients.denied(
                    self.cluster, failed.error, "the dispatcher saving routed messages", topic=("WRITE", written)
                ) from None
            raise  # run_steps reports the failure
        self.saved += counts["saved"]
        self.duplicates += counts["duplicates"]
        self.refused += counts["refused"]
        self.kept += counts["kept"]
        for outcome, n in counts.items():
            if n:
                metrics.of(metrics.DISPATCHED, self.namespace, outcome).inc(n)

    def _one(
        self, msg: Message, catalog: Catalog, now: float, acks: dict[str, dict[str, Any]], counts: dict[str, int]
    ) -> list[Record]:
        """The records one inbound message adds to the batch's transaction."""
        record: Any = msg  # a consumed record: what kept() reads of it
        sender: str | None = None
        try:
            env = verified(
                msg.key(),
                msg.value(),
                messages.headers(msg),
                public_keys=self._keys.public,
                now=now,
                max_age=self._max_age,
            )
            assert env.from_broker is not None  # verified() refuses a record without one
            mine = self.directions.refusal(env.from_broker, env.conversation_id)
            if mine is not None:
                raise RecordRefused(mine, env.from_broker)
            sender = env.from_broker
            # A service hosted here: opened before its checks (a forwarder passes it on sealed).
            opened = (
                self.opener.open(env, messages.value(msg), messages.headers(msg))
                if env.to_service_name in catalog.services
                else None
            )
        except SealRefused as exc:
            reason = f"dialog security: {exc.reason}"
            log.warning("inbound record %s/%s refused: %s", msg.partition(), msg.offset(), reason)
            counts["kept"] += 1
            return kept(self.namespace, record, reason, COMPONENT, sender=sender, now_ms=int(now * 1000))
        except RecordRefused as exc:
            log.warning("inbound record %s/%s refused: %s", msg.partition(), msg.offset(), exc.reason)
            counts["kept"] += 1
            return kept(self.namespace, record, exc.reason, COMPONENT, sender=exc.sender, now_ms=int(now * 1000))
        key = ack_key(env.from_broker, env.conversation_id, env.to_side)
        body = messages.value(msg) if opened is None else opened[0]
        if key in self._refused:
            counts["refused"] += 1
            return []
        security = received_security(messages.headers(msg)) if opened is not None else Security.NONE
        verdict = check_arrival(catalog, env, body, security.value)
        if verdict.action == WAIT and env.to_service_name not in catalog.services and catalog.forwarding:
            hop = next_hop(catalog, env, self.here, now)
            if hop is not None:
                self._forward(catalog, env, msg, hop, now)
                return []
        if verdict.action == WAIT:
            acks[key] = {"next": self.inbox.expected.get(key, 0), "status": verdict.reason}
            return []
        follows = declared_follows(messages.headers(msg))
        if verdict.action == REFUSE and not next_in_line(
            env.message_sequence_number, follows, self.inbox.waiting_for(key)
        ):
            counts["duplicates"] += 1  # refused when its turn comes (its sender sends it again)
            return []
        if verdict.action == REFUSE:
            counts["refused"] += 1
            self._refused.add(key)
            self.directions.end(key, now)
            acks[key] = {
                "next": env.message_sequence_number + 1,
                "error": {"code": verdict.code, "description": verdict.reason},
            }
            log.warning(
                "message %s from %s refused (%d): %s", env.message_id, env.from_broker, verdict.code, verdict.reason
            )
            return []
        assert verdict.action == SAVE
        ready, dropped = self.inbox.offer(key, env.message_sequence_number, now, (env, msg, opened), follows)
        if dropped is not None:
            counts["duplicates"] += 1
        elif not ready:  # it waits for an earlier message: the sender's view says why
            acks[key] = {
                "next": self.inbox.waiting_for(key),
                "status": gap_status(self.inbox.waiting_for(key), env.message_sequence_number),
            }
        out: list[Record] = []
        for e, m, o in ready:
            out.extend(queue_records(self.namespace, e, m, catalog, o))
            counts["saved"] += 1
            if e.message_type_name in (END_DIALOG, ERROR):  # its sender sends no more on it
                self.directions.end(key, now)
        if ready or dropped is not None:  # a duplicate's ack again: its sender may have missed it
            acks[key] = {"next": self.inbox.expected.get(key, 0)}
        return out

    def _recover(self) -> bool:
        """After a failed transaction, leave a producer ready: True when it aborted. Else it is
        replaced, whose start ends the old transaction; committed or not, nobody can say, but
        the acks topic can, once the new producer is up: it is read again."""
        if aborted(self._producer, BATCH_SECONDS):
            return True
        self._producer = replace_producer(
            self._producer, self._new_producer, self._stop, lambda exc: report(self._guard, COMPONENT, exc, log)
        )
        self._assigned = False
        return False

    def _ack(self, key: str, ack: dict[str, Any], now: float) -> dict[str, Any]:
        ended = self.directions.ended.get(key)
        return {**ack, "at": now} if ended is None else {**ack, "at": now, "ended": ended}

    def _forget(self, now: float) -> None:
        """The tick's tombstones for the acknowledgements of directions that ended long enough
        ago (core/routing/directions.py), in a transaction of their own."""
        due = self.directions.due(now)[:1000]
        if not due:
            return
        try:
            transact(
                self._producer,
                [(names.acks_topic(self.namespace), k, None, None) for k in due],
                [],
                Deadline(BATCH_SECONDS),
                BATCH_SECONDS,
            )
        except TransactionFailed:
            self._recover()  # the next tick tombstones them again
            raise
        self.directions.forget(due)
        for k in due:
            self.inbox.expected.pop(k, None)
            self._refused.discard(k)
        self.forgotten += len(due)
        log.info("dispatcher forgot %d ended dialog direction(s)", len(due))

    # --- forwarding -----------------------------------------------------------------------------

    def _forward(self, catalog: Catalog, env: Envelope, msg: Message, hop: str, now: float) -> None:
        endpoint = catalog.forwarding
        assert endpoint is not None
        limit = endpoint.message_forward_size * MB
        if self.forwarder is None:
            self.forwarder = Forwarder(self.cluster, self.namespace, limit)
        self.forwarder.queue.limit = limit  # ALTER ENDPOINT ... MESSAGE_FORWARD_SIZE
        self.forwarder.offer(forwarded(env, msg, hop, now))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
        if self.forwarder is not None:
            self.forwarder.close()
        self._consumer.close()
        self._producer.abandon()

    def __enter__(self) -> "Dispatcher":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
