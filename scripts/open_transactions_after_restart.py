"""How often a one-node Kafka keeps a transaction open for good across a restart.

Kafka's transaction coordinator skips the markers of a transaction it completes while a
partition has no leader it knows of (it takes the partition for a deleted one) and still records
the transaction complete: its records stay open on that partition, and read_committed readers
stop there, until a later transaction of the same producer id ends on it. On one node that
happens in two windows: a controlled shutdown leaves the partitions leaderless before the node
stops, and at start-up the coordinator completes transactions while the metadata is still being
replayed.

Each round: three producers commit small transactions (one record on each of four partitions);
the node is stopped mid-stream and the producers with it; the node starts again; once every
partition answers, each transactional id is initialised again, which ends any transaction left
Ongoing, markers and all; then a partition whose last stable offset stays behind its high
watermark for 30 s counts as left open.

    .venv/bin/python scripts/open_transactions_after_restart.py --rounds 5 [--controlled-shutdown]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kbroker.embedded import ports
from kbroker.embedded.broker import EmbeddedBroker

TOPIC, PARTITIONS, WRITERS = "restart-transactions", 4, 3


def committing(bootstrap: str, writer: int, stop: threading.Event, commits: list[int]) -> None:
    while not stop.is_set():
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"restart-writer-{writer}",
                "transaction.timeout.ms": 60_000,
                "linger.ms": 0,
            }
        )
        try:
            producer.init_transactions(10)
            while not stop.is_set():
                producer.begin_transaction()
                for partition in range(PARTITIONS):
                    producer.produce(TOPIC, b"x", partition=partition)
                producer.commit_transaction(10)
                commits[writer] += 1
        except KafkaException:
            time.sleep(0.2)


def open_partitions(admin: AdminClient) -> dict[int, tuple[int, int]]:
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    ends = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        found = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=level, request_timeout=10)
        ends[level] = {tp.partition: f.result(15).offset for tp, f in found.items()}
    stable, high = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
    return {p: (stable[p], high[p]) for p in range(PARTITIONS) if stable[p] < high[p]}


def one_round(data_dir: Path, controlled_shutdown: bool) -> dict[str, object]:
    broker, port, cport = EmbeddedBroker(data_dir), ports.free_port(), ports.free_port()
    settings = {"controlled.shutdown.enable": str(controlled_shutdown).lower()}
    bootstrap = broker.start(port=port, controller_port=cport, settings=settings).bootstrap
    assert bootstrap is not None
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        stop, commits = threading.Event(), [0] * WRITERS
        writers = [
            threading.Thread(target=committing, args=(bootstrap, w, stop, commits), daemon=True) for w in range(WRITERS)
        ]
        for w in writers:
            w.start()
        while min(commits) < 50:
            time.sleep(0.1)
        broker.stop()
        stop.set()
        for w in writers:
            w.join(timeout=30)
        broker.start(port=port, controller_port=cport, settings=settings)
        deadline = time.monotonic() + 60
        while True:
            try:
                open_partitions(admin)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        for writer in range(WRITERS):
            Producer(
                {"bootstrap.servers": bootstrap, "transactional.id": f"restart-writer-{writer}"}
            ).init_transactions(30)
        deadline = time.monotonic() + 30
        held = open_partitions(admin)
        while held and time.monotonic() < deadline:
            time.sleep(1)
            held = open_partitions(admin)
        return {"commits_before_stop": sum(commits), "left_open": {str(p): list(v) for p, v in held.items()}}
    finally:
        broker.stop(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--controlled-shutdown",
        action="store_true",
        help="stop the node with Kafka's controlled shutdown (Kafka's default)",
    )
    args = parser.parse_args()
    left = 0
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="kbroker-restart-txn-") as tmp:
            result = one_round(Path(tmp), args.controlled_shutdown)
        left += bool(result["left_open"])
        print(json.dumps({"round": i + 1, **result}), flush=True)
    print(
        json.dumps(
            {
                "controlled_shutdown": args.controlled_shutdown,
                "rounds": args.rounds,
                "rounds_with_a_transaction_left_open": left,
            }
        )
    )


if __name__ == "__main__":
    main()
