"""sys.transmission_queue, sys.dm_broker_connections and sys.dm_broker_forwarded_messages: what
the namespace's transmitters and forwarders report on the link reports topic (ReportWriter writes
it), and the transmission topic's messages no transmitter holds yet, each read as a transmitter
reads it (`outgoing`).

A message shows a blank transmission_status until a transmitter tried to send it, as in Service
Broker (docs/sources.md, item 48); after that, why it still waits. The transmission topic past the
transmitter group's committed offsets is read for the messages no live transmitter reports (no
worker runs, or it has not read them yet)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import KafkaException, Message, Producer, TopicPartition

from kbroker.core import names
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.envelope import Envelope, MalformedRecord
from kbroker.core.routing.transmission import Outgoing
from kbroker.kafka import clients, messages
from kbroker.kafka.snapshot import (
    committed_offsets,
    latest_values,
    read_partitions,
    reading_consumer,
    topic_partitions,
)

REPORT_FRESH = 30.0  # a transmitter silent this long has stopped: its report is not shown
REPORT_EVERY = 2.0  # a report is looked at this often, and published when it changed
HEARTBEAT = 10.0  # ... and this often regardless, well inside REPORT_FRESH


class ReportWriter:
    """One process's report on the link reports topic, under `<kind>/<process>`: published when it
    changed (leaving out the fields that change on every look), and every HEARTBEAT regardless,
    so the topic keeps few of them and the views' read stays small; a tombstone on close."""

    def __init__(self, producer: Producer, namespace: str, kind: str, volatile: tuple[str, ...] = ("at",)):
        self._producer, self._volatile = producer, volatile
        self.topic = names.link_reports_topic(namespace)
        self.key = f"{kind}/{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._next, self._last_at = 0.0, 0.0
        self._last: dict[str, Any] | None = None

    def publish(self, now: float, report: Callable[[], dict[str, Any]]) -> None:
        if now < self._next:
            return
        self._next = now + REPORT_EVERY
        current = report()
        same = {k: v for k, v in current.items() if k not in self._volatile}
        if same == self._last and now - self._last_at < HEARTBEAT:
            return
        self._last, self._last_at = same, now
        clients.produce(self._producer, self.topic, key=self.key, value=orjson.dumps(current))
        self._producer.poll(0)

    def close(self) -> None:
        """The report's tombstone (best effort: a report left behind ages out of the views)."""
        try:
            self._producer.produce(self.topic, key=self.key, value=None)
        except (BufferError, KafkaException):
            pass


def outgoing(msg: Message, skipped: Callable[[str], object] | None = None) -> Outgoing | None:
    """A record of the transmission topic as a message to transmit; None (and why, to `skipped`)
    for one without a well-formed envelope (another client's record: the transmitter keeps it)."""
    p, o = messages.position(msg)
    try:
        env = Envelope.from_headers(messages.headers(msg))
        key = messages.key(msg).decode()
    except (MalformedRecord, UnicodeDecodeError) as exc:
        if skipped is not None:
            skipped(str(exc) if isinstance(exc, MalformedRecord) else "its key is not UTF-8")
        return None
    value = messages.value(msg)
    return Outgoing(
        p,
        o,
        env.conversation_id,
        env.to_side,
        env.message_sequence_number,
        env.to_service_name,
        env.to_broker,
        env.from_service_name,
        env.message_type_name,
        env.service_contract_name,
        key,
        msg.timestamp()[1] / 1000.0,
        len(value),
        record=(value, messages.headers(msg)),
        priority=env.priority,
    )


def reports(cluster: ClusterLike, namespace: str, kind: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The latest reports of the live `kind` ("transmitter" or "forwarder") processes."""
    now = time.time()
    out = []
    for key, value in (latest_values(cluster, names.link_reports_topic(namespace), timeout) or {}).items():
        if not key.startswith(kind.encode() + b"/"):
            continue
        report = _report(value)
        if report is not None and now - report["at"] <= REPORT_FRESH:
            out.append({**report, kind: key.decode(errors="replace").partition("/")[2]})
    return out


def _report(value: bytes | None) -> dict[str, Any] | None:
    """A report as ReportWriter wrote it, or None for any other record (another client's: the
    views skip it; the next report of its key replaces it)."""
    try:
        report = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(report, dict) or type(report.get("at")) not in (int, float):
        return None
    rows = [report.get(k, []) for k in ("messages", "connections", "forwarded")]
    read_to = report.get("read_to", {})
    if not all(isinstance(r, list) and all(isinstance(x, dict) for x in r) for r in rows):
        return None
    if not all(type(x.get("partition")) is int and type(x.get("offset")) is int for x in rows[0]):
        return None
    if not isinstance(read_to, dict) or not all(
        type(v) is int and k.isascii() and k.isdigit() for k, v in read_to.items()
    ):
        return None
    return report


def transmitter_reports(cluster: ClusterLike, namespace: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The live transmitters' latest reports."""
    return reports(cluster, namespace, "transmitter", timeout)


def forwarded_rows(cluster: ClusterLike, namespace: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """sys.dm_broker_forwarded_messages: what the live forwarders hold (at most 200 each)."""
    return [
        {**row, "forwarder": r["forwarder"]}
        for r in reports(cluster, namespace, "forwarder", timeout)
        for row in r.get("forwarded", [])
    ]


def connection_rows(cluster: ClusterLike, namespace: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """sys.dm_broker_connections: one row per connection of each live transmitter."""
    return [
        {**row, "transmitter": r["transmitter"]}
        for r in transmitter_reports(cluster, namespace, timeout)
        for row in r.get("connections", [])
    ]


def transmission_rows(
    cluster: ClusterLike, namespace: str, limit: int = 1000, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """sys.transmission_queue: every message not yet acknowledged (at most `limit`), with its
    transmission_status."""
    held: dict[tuple[int, int], dict[str, Any]] = {}
    read_to: dict[int, int] = {}
    for report in transmitter_reports(cluster, namespace, timeout):
        for row in report.get("messages", []):
            held[(row["partition"], row["offset"])] = row
        for part, position in report.get("read_to", {}).items():
            read_to[int(part)] = max(read_to.get(int(part), 0), int(position))
    topic = names.transmission_topic(namespace)
    consumer = reading_consumer(cluster, names.reader_group(namespace))
    try:
        partitions = topic_partitions(consumer, topic, timeout) or []
        heads = committed_offsets(
            cluster, names.transmitter_group(namespace), [TopicPartition(topic, p) for p in partitions], timeout
        )
        starts = {tp.partition: max(tp.offset, 0) for tp in heads}
        read = read_partitions(consumer, topic, starts, timeout)
    finally:
        consumer.close()
    rows = list(held.values())
    for msg in read.records:
        p, o = messages.position(msg)
        # Below read_to: a live transmitter read it and does not hold it (acknowledged already).
        if (p, o) in held or o < read_to.get(p, 0) or len(rows) >= limit:
            continue
        m = outgoing(msg)
        if m is not None:
            rows.append(m.row())
    rows.sort(key=lambda r: (r["partition"], r["offset"]))
    return rows[:limit]
