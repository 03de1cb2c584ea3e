"""Queues on another cluster: the address `queue@namespace@cluster` (the SQL transport's
`queue@schema@catalog`), and the records that carry a message there. Pure: no I/O.

A Kafka transaction does not span clusters, so a send to another cluster is written, in the
send's transaction, to the sending namespace's bridge topic for that cluster
(`kbroker.<ns>.tbridge.<cluster>`), with the far queue's address in a `Destination` header. The
sending endpoint's started instances push it on (kafka/transport/bridge.py): each push is one
transaction on the far cluster holding the messages and the bridge topic's position, stored in
a compacted topic there (`kbroker.<ns>.tbridge-positions`, keyed by source cluster, topic and
partition), as MirrorMaker 2 keeps its offsets in the target for exactly-once. A pusher that
takes a partition over fences the last one (one transactional id per source partition) and
reads the position back from the far cluster: nothing pushed twice, nothing skipped.

`cluster` is the name the sender's configuration gives the far cluster (a client profile, as
routing's are); a reply finds its way back when the far side knows the sender's cluster by the
name the sender calls itself (`cluster_name=`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from kbroker.core import names
from kbroker.core.dialogs.envelope import MalformedRecord, header_text
from kbroker.core.records import Record
from kbroker.core.transport.endpoint import parse_address, transport_queue_topic
from kbroker.core.transport.message import TransportMessage, from_record, to_headers

CLUSTER_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
H_DESTINATION = "Destination"  # on a bridge record: the far queue, `queue@namespace`
POSITION_TOPIC_PARTITIONS = 1


@dataclass(frozen=True)
class Address:
    """Where a transport address leads: a queue, its namespace, and its cluster (None: this one)."""

    queue: str
    namespace: str
    cluster: str | None = None

    @property
    def local(self) -> str:
        """`queue@namespace`: the address on its own cluster."""
        return f"{self.queue}@{self.namespace}"


def address_of(address: str, namespace: str) -> Address:
    """The queue, namespace and cluster of `queue`, `queue@namespace` or
    `queue@namespace@cluster` seen from `namespace`; ValueError naming what is wrong."""
    if not isinstance(address, str):
        raise ValueError(f"transport address {address!r} must be text")
    head, cluster = address, None
    if address.count("@") == 2:
        head, _, cluster = address.rpartition("@")
        if not CLUSTER_RE.fullmatch(cluster):
            raise ValueError(f"cluster {cluster!r} of {address!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
        if "@" not in head:
            raise ValueError(f"transport address {address!r}: a queue on another cluster is queue@namespace@cluster")
    queue, ns = parse_address(head, namespace)
    return Address(queue, ns, cluster)


def bridge_prefix(ns: str) -> str:
    """What every bridge topic (and pusher group) of the namespace starts with."""
    return f"{names.prefix(ns)}tbridge."


def bridge_topic(ns: str, cluster: str) -> str:
    """The namespace's bridge topic to `cluster`: `kbroker.<ns>.tbridge.<cluster>`; its pushers
    form the consumer group of the same name."""
    if not isinstance(cluster, str) or not CLUSTER_RE.fullmatch(cluster):
        raise ValueError(f"cluster name {cluster!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
    return f"{bridge_prefix(ns)}{cluster}"


def positions_topic(ns: str) -> str:
    """On the far cluster: where the namespace's pushers keep how far each bridge partition went."""
    return f"{names.prefix(ns)}tbridge-positions"


def destination_topic(address: str, namespace: str) -> str:
    """The topic a send to `address` is written to here: the queue's, or the bridge topic of
    the queue's cluster."""
    a = address_of(address, namespace)
    if a.cluster is not None:
        return bridge_topic(namespace, a.cluster)
    return transport_queue_topic(a.namespace, a.queue)


def message_record(address: str, namespace: str, msg: TransportMessage) -> Record:
    """The record of `msg` sent to `address` from `namespace`: on the queue's topic, or on the
    bridge topic with the far queue in its Destination header."""
    a = address_of(address, namespace)
    headers = to_headers(msg)
    if a.cluster is None:
        return (transport_queue_topic(a.namespace, a.queue), msg.id.encode(), msg.body, headers)
    headers.append((H_DESTINATION, a.local.encode()))
    return (bridge_topic(namespace, a.cluster), msg.id.encode(), msg.body, headers)


def from_bridge(
    value: bytes | None, headers: Iterable[tuple[str, bytes | str | None]] | None
) -> tuple[Address, TransportMessage]:
    """The far queue and the message of a bridge record; MalformedRecord naming what is wrong
    (anyone who may write the topic may write anything)."""
    destination: str | None = None
    columns: list[tuple[str, bytes | str | None]] = []
    for name, raw in headers or ():
        if name == H_DESTINATION:
            if destination is not None:
                raise MalformedRecord(f"header {H_DESTINATION!r} appears twice")
            try:
                destination = header_text(raw)
            except UnicodeDecodeError:
                raise MalformedRecord(f"header {H_DESTINATION!r} is not UTF-8") from None
        else:
            columns.append((name, raw))
    if destination is None:
        raise MalformedRecord(f"not a bridge record: missing header {H_DESTINATION}")
    try:
        queue, ns = parse_address(destination, "x")
    except ValueError:
        raise MalformedRecord(f"Destination {destination!r} is not queue@namespace") from None
    if "@" not in destination:
        raise MalformedRecord(f"Destination {destination!r} names no namespace")
    return Address(queue, ns), from_record(columns, value)


def far_record(address: Address, msg: TransportMessage) -> Record:
    """The record of `msg` on its far queue (the bridge's Destination header left behind)."""
    return (transport_queue_topic(address.namespace, address.queue), msg.id.encode(), msg.body, to_headers(msg))


def position_key(source: str, topic: str, partition: int) -> bytes:
    """The key of a bridge partition's position: which cluster, topic and partition it is of."""
    return f"{source}|{topic}|{partition}".encode()


def position_record(ns: str, source: str, topic: str, partition: int, next_offset: int) -> Record:
    """The position after a push: the next offset of the bridge partition to push."""
    return (positions_topic(ns), position_key(source, topic, partition), orjson.dumps({"next": next_offset}), None)


def parse_position(value: bytes | None) -> int | None:
    """The next offset a position record holds; None for a tombstone or anything else."""
    if value is None:
        return None
    try:
        got = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    n = got.get("next") if isinstance(got, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63 else None
