"""Issue 10, item 1: a README reader loop rides through a broker restart. Its own single broker
(own ports and data dir) is stopped mid-run for ~5 s and started again on the same ports; the
reader, never restarted, receives every message exactly once and in order, and keeps running.
Before kbroker bounded the transaction calls itself, the reader's commit hung for ever inside
librdkafka's send_offsets_to_transaction after the restart."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kbroker.core import names
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.errors import KBrokerError, TransactionAbortedError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import free_port
from tests.helpers import invariants as inv

CONVERSATIONS, PER_CONVERSATION = 100, 20  # 2,000 messages
OUTAGE = 5.0
# Seconds after the restart for everything to be received. Recovery takes 11-23 s; an in-doubt
# commit may take up to 120 s to settle by design, so the budget is that bound plus a margin. The
# reader that stalled at 520-540 of 2,000 in about one restart in six (partitions waiting for
# offsets a transaction the broker left open held unstable) fails it at any budget.
RECOVERY_BUDGET = 180.0


@dataclass
class RestartableBroker:
    """An embedded broker of this test alone, restartable on the same ports and data dir."""

    embedded: EmbeddedBroker
    port: int
    controller_port: int
    bootstrap: str

    def restart(self, outage: float) -> float:
        """Stop, wait `outage` seconds, start again; the time it answered again."""
        self.embedded.stop()
        time.sleep(outage)
        self.embedded.start(port=self.port, controller_port=self.controller_port)
        return time.time()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[RestartableBroker]:
    embedded = EmbeddedBroker(tmp_path / "kafka")
    port, cport = free_port(), free_port()
    bootstrap = embedded.start(port=port, controller_port=cport).bootstrap
    assert bootstrap is not None
    try:
        yield RestartableBroker(embedded, port, cport, bootstrap)
    finally:
        embedded.stop(timeout=20)


@dataclass
class ReaderLoop:
    """The README reader loop on a thread: a transaction per RECEIVE TOP(10), a reply recording
    what it received, commit; a retriable error means try again."""

    broker: Broker
    commits: list[dict[str, Any]] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    with self.broker.transaction() as tx:
                        msgs = tx.receive("RequestQueue", top=10, wait=1)
                        if msgs:
                            body = {
                                "pid": 0,
                                "reader": 0,
                                "leased": time.time(),
                                "conversation_id": msgs[0].conversation_id,
                                "group": msgs[0].conversation_group_id,
                                "seqs": [m.message_sequence_number for m in msgs],
                                "ids": [m.message_id for m in msgs],
                            }
                            tx.send(msgs[0].conversation_handle, inv.REPLY, body)
                            time.sleep(0.02)  # some work, so the restart comes mid-run
                    if msgs:
                        self.commits.append({**body, "committed": tx.committed_at})
                except TransactionAbortedError as exc:
                    self.aborts.append(str(exc))
                except KBrokerError as exc:
                    if not getattr(exc, "retriable", False):
                        raise
                    self.aborts.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.failure = exc

    def received(self) -> int:
        return sum(len(c["ids"]) for c in self.commits)


def state_of(broker: Broker) -> str:
    """What a hung reader's process is doing: its receivers' state, what the group coordinator
    says of each receiver's group, the Kafka transactions open on the namespace, and every
    thread's stack."""
    from confluent_kafka.admin import AdminClient

    lines = [f"receiver {r.topic}: {r.stats()}" for r in list(broker.runtime.receivers().values())]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for r in list(broker.runtime.receivers().values()):
        try:  # a queue's group is named as its topic
            g = admin.describe_consumer_groups([r.topic], request_timeout=10)[r.topic].result(15)
            lines.append(
                f"group {r.topic}: state {g.state}, coordinator {g.coordinator}, members "
                f"{[(m.member_id, [tp.partition for tp in m.assignment.topic_partitions]) for m in g.members]}"
            )
        except Exception as exc:  # noqa: BLE001 - a diagnosis, not the test
            lines.append(f"group {r.topic}: not described: {exc}")
    try:  # a transaction left open holds read_committed readers (endpoints, leases) at its start
        from kbroker.kafka.txn.open_transactions import open_transactions

        lines += [f"open transaction: {t}" for t in open_transactions(broker.cluster, broker.namespace)] or [
            "no Kafka transaction open on the namespace's topics"
        ]
    except Exception as exc:  # noqa: BLE001 - a diagnosis, not the test
        lines.append(f"open transactions not listed: {exc}")
    names_by_id = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        lines.append(f"--- thread {names_by_id.get(ident, ident)}")
        lines += [line.rstrip() for line in traceback.format_stack(frame)[-8:]]
    return "\n".join(lines)


@pytest.mark.long  # 45 s: `make test-long`
@pytest.mark.timeout(480)  # the start, the restart and the recovery budget
def test_reader_loop_rides_through_a_broker_restart(own_broker: RestartableBroker, namespace: str) -> None:
    bootstrap = own_broker.bootstrap
    apply_paths(bootstrap, namespace, [inv.YAML])
    with Broker(bootstrap, namespace) as sender:
        sent = inv.send_requests(sender, CONVERSATIONS, PER_CONVERSATION)
    total = len(sent)
    reader = ReaderLoop(Broker(bootstrap, namespace))
    thread = threading.Thread(target=reader.run, name="reader-loop", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while reader.received() < total // 4:
            assert reader.failure is None, f"the reader failed: {reader.failure!r}"
            assert time.monotonic() < deadline, "the reader never got going"
            time.sleep(0.05)
        assert reader.received() < total, "the reader finished before the restart: slow it down"

        back_at = own_broker.restart(OUTAGE)

        deadline = time.monotonic() + RECOVERY_BUDGET
        while reader.received() < total and time.monotonic() < deadline:
            assert reader.failure is None, f"the reader failed: {reader.failure!r}"
            time.sleep(0.2)
        after = sorted(c["committed"] for c in reader.commits if c["committed"] >= back_at)
        recovery = after[0] - back_at if after else None
        print(
            f"\nrecovery {recovery and round(recovery, 2)} s after the broker answered again; "
            f"{reader.received()} of {total} received; aborted transactions {len(reader.aborts)}: "
            f"{sorted(set(a[:70] for a in reader.aborts))[:4]}"
        )
        if reader.received() < total:
            print(state_of(reader.broker))
        assert reader.received() >= total, (
            f"the reader hung: {reader.received()} of {total} received {RECOVERY_BUDGET:g} s after the "
            f"broker came back (aborts: {reader.aborts[:3]})"
        )
        assert thread.is_alive() and reader.failure is None, "the reader loop is still running"
    finally:
        reader.stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the reader loop did not stop when asked"
    reader.broker.close()

    replies = inv.read_replies(bootstrap, names.queue_topic(namespace, "ReplyQueue"))
    report = inv.check(sent, replies, reader.commits, PER_CONVERSATION)
    summary = (
        f"sent={report.sent} lost={len(report.lost)} duplicated={len(report.duplicated)} "
        f"order={len(report.order_violations)} lock={len(report.lock_violations)} "
        f"unknown={len(report.unknown)}"
    )
    print(summary)
    assert report.ok(), summary + f"\n{report.lost[:3]} {report.duplicated[:3]} {report.order_violations[:3]}"
