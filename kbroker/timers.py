"""Dialog timers and dialog lifetimes: BEGIN CONVERSATION TIMER and LIFETIME.

Kafka has no delayed delivery, so a timer is a record in the compacted timers topic, written in
the transaction that armed it, and a timer service fires it:

    timer:<handle>:<arm id>     a DialogTimer for one side (its own queue only; the peer is never told)
    lifetime:<conversation id>  an Error -8489 for each side still open when the lifetime ends

Each arm of a dialog timer has its own key, and re-arming tombstones the previous key in the same
transaction. A firing therefore never races a re-arm for the same key: compaction keeps exactly
the live arms. The service fires a timer by one Kafka transaction holding the system message,
the timer's tombstone, and the timers consumer group's offsets; sending those offsets fences a
service instance that lost the partition (KIP-447), so a timer fires once.

The service instances share the topic's partitions through a consumer group. On assignment an
instance reads its partitions from the beginning (a compacted topic holds one record per armed
timer) into a TimerSchedule; it keeps all armed timers of its partitions in memory.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from . import names
from .committer import Record, produce
from .config import KAFKA_LOG
from .catalog.models import DIALOG_TIMER, ERROR as ERROR_TYPE
from .endpoints import CLOSED, STARTED_OUTBOUND, Endpoint, EndpointStore, handle_for, other
from .envelope import SYSTEM_SEQUENCE, Envelope, error_body
from .ids import new_id
from .timer_schedule import Entry, TimerSchedule

log = logging.getLogger("kbroker.timers")

LIFETIME_EXPIRED = -8489  # Service Broker's system error code for an expired dialog lifetime


def timer_key(handle: str, arm_id: str) -> str:
    return f"timer:{handle}:{arm_id}"


def lifetime_key(conversation_id: str) -> str:
    return f"lifetime:{conversation_id}"


def arm_record(namespace: str, ep: Endpoint, arm_id: str, due: float, queue_topic: str) -> Record:
    """The record arming a DialogTimer for endpoint `ep`, delivered to its own queue."""
    value = {"kind": "timer", "due": due, "conversation_id": ep.conversation_id, "side": ep.side,
             "contract": ep.service_contract_name, "service": ep.service_name,
             "far_service": ep.far_service_name, "topic": queue_topic, "key": ep.conversation_group_id}
    return (names.timers_topic(namespace), timer_key(ep.conversation_handle, arm_id), orjson.dumps(value), None)


def disarm_record(namespace: str, ep: Endpoint) -> Record | None:
    if not ep.dialog_timer_id:
        return None
    return (names.timers_topic(namespace), timer_key(ep.conversation_handle, ep.dialog_timer_id), None, None)


def lifetime_record(namespace: str, ep: Endpoint, initiator_topic: str, target_topic: str) -> Record:
    """Written with BEGIN DIALOG ... LIFETIME: the Error -8489 for both sides when it runs out."""
    value = {"kind": "lifetime", "due": ep.lifetime, "conversation_id": ep.conversation_id,
             "contract": ep.service_contract_name,
             "INITIATOR": {"service": ep.service_name, "topic": initiator_topic, "key": ep.conversation_group_id},
             "TARGET": {"service": ep.far_service_name, "topic": target_topic, "key": ep.far_conversation_group_id}}
    return (names.timers_topic(namespace), lifetime_key(ep.conversation_id), orjson.dumps(value), None)


def _system_message(conversation_id: str, side: str, contract: str, to_service: str, from_service: str,
                    topic: str, key: str, message_type: str, body: bytes) -> Record:
    env = Envelope(message_id=new_id(), conversation_id=conversation_id, conversation_group_id=key,
                   message_sequence_number=SYSTEM_SEQUENCE, message_type_name=message_type,
                   service_contract_name=contract, from_service_name=from_service,
                   to_service_name=to_service, to_side=side)
    return (topic, key, body, env.headers())


def firing_records(value: dict[str, Any], endpoint: Any) -> list[Record]:
    """The system messages a due timer delivers. `endpoint(handle)` gives an endpoint or None;
    sides whose endpoint is closed or gone get nothing."""
    conv = value["conversation_id"]
    if value["kind"] == "timer":
        ep = endpoint(handle_for(conv, value["side"]))
        if ep is None or ep.state == CLOSED:
            return []
        return [_system_message(conv, value["side"], value["contract"], value["service"], value["far_service"],
                                value["topic"], value["key"], DIALOG_TIMER, b"")]
    initiator = endpoint(handle_for(conv, "INITIATOR"))
    target = endpoint(handle_for(conv, "TARGET"))
    body = error_body(LIFETIME_EXPIRED, "The conversation lifetime has expired.")
    out = []
    for side, ep in (("INITIATOR", initiator), ("TARGET", target)):
        open_here = ep is not None and ep.state != CLOSED
        # A target without an endpoint yet still gets the Error if the initiator sent it anything:
        # it arrives after those messages and closes the dialog there too.
        unseen_target = side == "TARGET" and ep is None and initiator is not None and \
            initiator.state not in (STARTED_OUTBOUND, CLOSED)
        if open_here or unseen_target:
            me, peer = value[side], value[other(side)]
            out.append(_system_message(conv, side, value["contract"], me["service"], peer["service"],
                                       me["topic"], me["key"], ERROR_TYPE, body))
    return out


class TimerService:
    """Fires due timers of the namespace. Run one or more per cluster (the worker runs one);
    they share the timers topic's partitions."""

    def __init__(self, bootstrap: str, namespace: str, *, poll_interval: float = 0.25,
                 endpoints: EndpointStore | None = None):
        """`endpoints`: a store to share (the worker's Broker has one); else the service reads
        the endpoints topic with a store of its own."""
        self.namespace = namespace
        self.topic = names.timers_topic(namespace)
        self._own_endpoints = endpoints is None
        self._endpoints = endpoints or EndpointStore(
            bootstrap, namespace, Producer({"bootstrap.servers": bootstrap, "logger": KAFKA_LOG}))
        self._poll_interval = poll_interval
        self.schedule = TimerSchedule()
        self.fired = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        group = names.timers_group(namespace)
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "logger": KAFKA_LOG,
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "session.timeout.ms": 10_000, "partition.assignment.strategy": "range",
        })
        self._producer_conf = {
            "bootstrap.servers": bootstrap, "logger": KAFKA_LOG,
            "transactional.id": f"{group}.{uuid.uuid4()}", "enable.idempotence": True, "acks": "all",
            "linger.ms": 1, "transaction.timeout.ms": 10_000, "retry.backoff.ms": 5,
        }
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        p = Producer(self._producer_conf)
        p.init_transactions(30)
        return p

    # --- the loop ------------------------------------------------------------------------------

    def start(self) -> "TimerService":
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)
        self._thread = threading.Thread(target=self._run, name="kbroker-timers", daemon=True)
        self._thread.start()
        return self

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Every armed timer of a partition is a live record of the compacted topic: read them all.
        consumer.assign([TopicPartition(p.topic, p.partition, OFFSET_BEGINNING) for p in partitions])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.schedule.drop_partitions({p.partition for p in partitions})

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # keep firing: one bad batch must not stop every timer
                log.exception("timer service step failed")
                time.sleep(1.0)

    def step(self) -> None:
        nxt = self.schedule.next_due()
        wait = self._poll_interval if nxt is None else min(self._poll_interval, max(nxt - time.time(), 0.0))
        for msg in self._consumer.consume(500, wait):
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("timers topic: %s", msg.error())
                continue
            key = msg.key().decode()
            if msg.value() is None:
                self.schedule.remove(key)
                continue
            try:
                value = orjson.loads(msg.value())
                self.schedule.put(Entry(key, float(value["due"]), msg.partition(), msg.offset(), value))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("timers topic: unreadable record %s at %s/%s", key, msg.partition(), msg.offset())
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
        try:
            self._producer.begin_transaction()
            for topic, key, value, headers in records:
                produce(self._producer, topic, key=key, value=value, headers=headers)
            if positions:
                self._producer.send_offsets_to_transaction(positions, self._consumer.consumer_group_metadata(), 30)
            self._producer.commit_transaction(30)
        except KafkaException as exc:
            log.warning("firing %d timer(s) failed, will retry: %s", len(entries), exc)
            self._recover(exc)
            for e in entries:
                self.schedule.put(e)
            return
        self.fired += len(entries)

    def _recover(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args else None
        try:
            if err is not None and getattr(err, "fatal", lambda: False)():
                self._producer = self._new_producer()
            else:
                self._producer.abort_transaction(30)
        except KafkaException:
            self._producer = self._new_producer()
        time.sleep(0.5)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._consumer.close()
        if self._own_endpoints:
            self._endpoints.close()

    def __enter__(self) -> "TimerService":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
