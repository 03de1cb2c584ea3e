"""Purging expired messages at start-up (NServiceBus's PurgeExpiredMessagesOnStartup,
kbroker/sdk/transport/purge.py) against the real broker: the expired run at the head of each
partition goes, committed through the process's committer; what is behind a live message stays
until a receive reaches it; every live message is then received once, in order; and a purge
touches only the partitions its instance is assigned."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, KafkaError, TopicPartition

from kbroker.core.transport.endpoint import transport_queue_topic
from kbroker.sdk.transport.endpoint import TransportEndpoint
from kbroker.sdk.transport.purge import purge_expired
from tests.helpers import wait_for

TTBR = 2.0  # seconds the expiring messages live


def send_batches(ep: TransportEndpoint, queue: str, expired: int, live: int, behind: int) -> tuple[set[str], list[str]]:
    """`expired` messages that expire in TTBR s, then `live` ones (5 ms apart, so their enqueue
    times order them), then `behind` more expiring ones; returns the expiring Ids and the live
    Ids in send order, once the expiring ones have expired."""
    expiring: set[str] = set()
    live_ids: list[str] = []
    for i in range(expired):
        expiring.add(ep.send(queue, b"stale %d" % i, time_to_be_received=TTBR))
    for i in range(live):
        live_ids.append(ep.send(queue, b"live %d" % i))
        time.sleep(0.005)
    for i in range(behind):
        expiring.add(ep.send(queue, b"behind %d" % i, time_to_be_received=TTBR))
    time.sleep(TTBR + 0.3)  # every expiring one has expired
    return expiring, live_ids


def layout(bootstrap: str, topic: str) -> dict[int, list[str]]:
    """Each partition's message Ids in offset order, read back with a plain consumer (no group)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"plain-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: dict[int, list[str]] = {p: [] for p in partitions}
        at_end: set[int] = set()
        deadline = time.monotonic() + 20
        while at_end != set(partitions):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            at_end.discard(m.partition())
            out[m.partition()].append(dict(m.headers() or [])["Id"].decode())
        return out
    finally:
        c.close()


def head_runs(ids: dict[int, list[str]], expiring: set[str]) -> dict[int, int]:
    """How many expiring messages lead each partition (what a purge removes there)."""
    runs = {}
    for p, seq in ids.items():
        n = 0
        while n < len(seq) and seq[n] in expiring:
            n += 1
        runs[p] = n
    return runs


def committed(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """The queue group's committed offsets (a queue's group is named as its topic), read only."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in partitions], 10)}
    finally:
        c.close()


def owned(ep: TransportEndpoint, queue: str) -> list[int]:
    """The partitions of `queue` the endpoint's receiver holds now (none waiting for offsets)."""
    s = ep.runtime.receiver(queue).stats()
    return [] if s["waiting"] else list(s["partitions"])


def received(ep: TransportEndpoint, queue: str = "Billing") -> list[str]:
    """The Ids of what receives of `queue` hand out until one waits 2 s for nothing."""
    got = []
    while (m := ep.receive(wait=2, queue=queue)) is not None:
        got.append(m.id)
    return got


def test_the_purge_removes_only_the_expired_head_and_every_live_message_is_received_once_in_order(
    endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    ep = endpoints("Billing")
    expiring, live = send_batches(ep, "Billing", expired=16, live=16, behind=16)
    reply_expiring, reply_live = send_batches(ep, "Billing.m1", expired=3, live=1, behind=2)
    primary, secondary = (transport_queue_topic(ep.namespace, q) for q in ("Billing", "Billing.m1"))
    runs = head_runs(layout(ep.bootstrap, primary), expiring)
    reply_runs = head_runs(layout(ep.bootstrap, secondary), reply_expiring)
    assert reply_runs == {0: 3}

    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="kbroker.transport"):
        purged = purge_expired(ep, None, 30.0)
    took = time.monotonic() - started

    assert purged == sum(runs.values()) + 3
    assert took < 25, f"the purge took {took:.1f} s: it waited for its time-out"
    assert ep.stats()["counters"]["purged"] == purged
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("purged ")]
    assert said == [
        f"purged {sum(runs.values())} expired messages from Billing",
        "purged 3 expired messages from Billing.m1",
    ]
    # Removed by committed offsets: each partition's group position is now its first live message
    # (where the head was live, nothing was taken and nothing committed: the group starts there).
    ids = layout(ep.bootstrap, primary)
    assert committed(ep.bootstrap, primary, sorted(ids)) == {p: runs[p] or OFFSET_INVALID for p in ids}
    assert committed(ep.bootstrap, secondary, [0]) == {0: 3}
    assert ep.runtime.counters["expired"] == 0  # nothing was received yet

    # Every live message once, in send order (the buffer holds the rest first, so the receive
    # order across partitions is the enqueue order); never an expired one.
    left = len(expiring) + len(live) - sum(runs.values())
    receiver = ep.runtime.receiver("Billing")
    wait_for(lambda: receiver.waiting() == left, 20, "the rest of the queue buffered", seen=receiver.waiting)
    assert received(ep) == live
    reply = ep.receive(wait=5, queue="Billing.m1")
    assert reply is not None and reply.id == reply_live[0]
    assert ep.receive(wait=1, queue="Billing.m1") is None
    # The expired ones behind a live message were removed as the receive reached them.
    assert ep.runtime.counters["expired"] == len(expiring) - sum(runs.values()) + 2
    assert ep.runtime.counters["received"] == len(live) + 1
    assert ep.runtime.counters["purged"] == purged  # the receives purged nothing


def test_a_purge_touches_only_the_partitions_its_instance_is_assigned(endpoints) -> None:
    b = endpoints("Billing", machine="m2")
    a = endpoints("Billing", machine="m1")
    expiring, live = send_batches(a, "Billing", expired=24, live=8, behind=8)
    topic = transport_queue_topic(a.namespace, "Billing")
    runs = head_runs(layout(a.bootstrap, topic), expiring)

    # Both instances in the queue's group, two partitions each, before either purges.
    b.runtime.receiver("Billing")
    a.runtime.receiver("Billing")
    wait_for(
        lambda: len(owned(a, "Billing")) == 2 and len(owned(b, "Billing")) == 2,
        30,
        "the group to split the partitions",
        seen=lambda: (owned(a, "Billing"), owned(b, "Billing")),
    )
    mine, theirs = owned(a, "Billing"), owned(b, "Billing")
    assert sorted(mine + theirs) == [0, 1, 2, 3]

    assert purge_expired(a, ["Billing"], 30.0) == sum(runs[p] for p in mine)
    assert owned(a, "Billing") == mine  # no rebalance under the purge
    after = committed(a.bootstrap, topic, [0, 1, 2, 3])
    assert all(after[p] < 0 for p in theirs), after  # never committed (OFFSET_INVALID): untouched
    assert {p: after[p] for p in mine} == {p: runs[p] for p in mine}

    # The other instance's share is its own purge's.
    assert purge_expired(b, ["Billing"], 30.0) == sum(runs[p] for p in theirs)
    assert committed(a.bootstrap, topic, [0, 1, 2, 3]) == runs
    got = received(a) + received(b)
    assert sorted(got) == sorted(live) and len(got) == len(set(got))


def test_an_instance_assigned_nothing_purges_nothing_and_does_not_wait(endpoints) -> None:
    """One partition, two instances: the holder removes every (expired) message, reading the
    partition to its end; the other, whose share the group made empty, returns at once."""
    a = endpoints("Audit", partitions=1)
    b = endpoints("Audit", machine="m2", partitions=1)  # (an install with more would add partitions)
    expiring, _live = send_batches(a, "Audit", expired=5, live=0, behind=0)
    a.runtime.receiver("Audit")
    b.runtime.receiver("Audit")
    wait_for(
        lambda: sorted(owned(a, "Audit") + owned(b, "Audit")) == [0],
        30,
        "one instance holding the partition",
        seen=lambda: (owned(a, "Audit"), owned(b, "Audit")),
    )
    holder, other = (a, b) if owned(a, "Audit") else (b, a)
    started = time.monotonic()
    assert purge_expired(other, ["Audit"], 20.0) == 0
    assert time.monotonic() - started < 10
    started = time.monotonic()
    assert purge_expired(holder, ["Audit"], 20.0) == len(expiring)
    assert time.monotonic() - started < 10
    topic = transport_queue_topic(a.namespace, "Audit")
    assert committed(a.bootstrap, topic, [0]) == {0: 5}
    assert holder.receive(wait=1, queue="Audit") is None
    assert holder.runtime.counters["expired"] == 0


def test_the_purge_stops_at_its_time_out_and_never_skips_a_record_it_cannot_look_at(
    endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    """A live head held by an open transaction keeps its partition unsettled: the pass waits no
    longer than its time-out and removes nothing behind it; once the holder commits, the expired
    messages are the head and a second pass removes them."""
    ep = endpoints("Shipping", partitions=1)
    live = ep.send("Shipping", b"live")
    expiring = {ep.send("Shipping", b"stale %d" % i, time_to_be_received=TTBR) for i in range(3)}
    time.sleep(TTBR + 0.3)
    tx = ep.transaction()
    m = tx.receive(wait=15)
    assert m is not None and m.id == live
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kbroker.transport"):
        assert purge_expired(ep, ["Shipping"], 2.0) == 0
    took = time.monotonic() - started
    assert 1.9 <= took < 6, took
    assert any("stopped at its time-out" in r.getMessage() for r in caplog.records)
    tx.commit()
    assert purge_expired(ep, ["Shipping"], 20.0) == len(expiring)
    topic = transport_queue_topic(ep.namespace, "Shipping")
    assert committed(ep.bootstrap, topic, [0]) == {0: 4}
    assert ep.receive(wait=1, queue="Shipping") is None
    assert ep.runtime.counters["expired"] == 0 and ep.runtime.counters["purged"] == 3


def test_start_with_purge_expired_on_startup_purges_before_the_readers_run(endpoints) -> None:
    seen: list[bytes | None] = []
    sender = endpoints("Sender", send_only=True)
    endpoints("Purged", partitions=1).close()  # installed, one partition
    sender.send("Purged", b"stale 0", time_to_be_received=TTBR)
    sender.send("Purged", b"stale 1", time_to_be_received=TTBR)
    sender.send("Purged", b"live")
    time.sleep(TTBR + 0.3)
    ep = endpoints("Purged", purge_expired_on_startup=True, purge_timeout=20.0)
    ep.start(lambda msg, tx: seen.append(msg.body))
    assert ep.stats()["counters"]["purged"] == 2  # counted when start() returned, before any handler
    wait_for(lambda: seen, 20, "the live message")
    time.sleep(0.5)
    assert seen == [b"live"]
