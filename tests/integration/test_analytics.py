"""The analytics job end to end: the real Spark job (Spark's Kafka source, local master) on the
real broker, with a real worker publishing receive progress and reading the control topic."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import httpx
import orjson
import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from prometheus_client import REGISTRY

from kbroker.core import names
from kbroker.core.dialogs.envelope import (
    H_CONVERSATION_ID,
    H_GROUP_ID,
    H_MESSAGE_ID,
    H_MESSAGE_TYPE,
    H_TO_SIDE,
)
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.kafka import clients
from kbroker.kafka.analytics.store import dialog_rows
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.kafka.receive.reclaim import reclaim_namespace
from kbroker.kafka.snapshot import committed_offsets, latest_values
from kbroker.sdk.broker import Broker
from tests.helpers import DATA, KBROKER, ROOT, free_port, wait_for
from tests.integration.test_worker import Worker

CLIENT, STALE, FRESH, CONTRACT, WORK = (
    "//kbroker/test/Client",
    "//kbroker/test/Stale",
    "//kbroker/test/Fresh",
    "//kbroker/test/WorkContract",
    "//kbroker/test/Work",
)


@pytest.fixture
def analytics_ns(kafka_bootstrap, tmp_path):
    ns = "a" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [DATA / "analytics.yaml"])
    w = Worker(kafka_bootstrap, ns, tmp_path)
    b = Broker(kafka_bootstrap, ns)
    try:
        w.wait_ready()
        yield kafka_bootstrap, ns, w, b
    finally:
        b.close()
        w.stop()


def windows(bootstrap: str, ns: str, queue: str) -> list[dict]:
    latest = latest_values(bootstrap, names.analytics_topic(ns), 10) or {}
    rows = [orjson.loads(v) for k, v in latest.items() if k.startswith(f"queue/{queue}/".encode())]
    return sorted(rows, key=lambda r: r["window_start"])


def totals(bootstrap: str, ns: str, queue: str) -> dict:
    """Arrivals and receives over every window; the gauges of the newest."""
    rows = windows(bootstrap, ns, queue)
    if not rows:
        return {}
    return {
        "arrivals": sum(r["arrivals"] for r in rows),
        "receives": sum(r["receives"] for r in rows),
        **{k: rows[-1][k] for k in ("backlog", "stale", "oldest_unreceived_age_s", "top_groups", "as_of")},
    }


def partitions_led(bootstrap: str, ns: str) -> bool:
    """Whether every partition of the namespace's topics has a leader."""
    try:
        topics = clients.admin(bootstrap).list_topics(timeout=5).topics
    except KafkaException:
        return False
    mine = [t for name, t in topics.items() if name.startswith(names.prefix(ns))]
    return bool(mine) and all(
        t.error is None and all(p.leader >= 0 and p.error is None for p in t.partitions.values()) for t in mine
    )


def send(b: Broker, to: str, dialogs: int, each: int) -> list[str]:
    handles = []
    for _ in range(dialogs):
        h = b.begin_dialog(CLIENT, to, CONTRACT)
        for i in range(each):
            b.send(h, WORK, f"m{i}")
        handles.append(h)
    return handles


def receive_all(b: Broker, queue: str, count: int) -> int:
    got, deadline = 0, time.time() + 30
    while got < count and time.time() < deadline:
        with b.transaction() as tx:
            got += len(tx.receive(queue, top=50, wait=1.0))
    return got


def known_workload(b: Broker) -> float:
    """The messages whose aggregates check_known_aggregates knows: 30 on StaleQueue nobody receives
    (5 dialogs of 6: stale after 3 s, the queue's), 20 on FreshQueue all received (4 of 5), and 5
    SENDs rolled back. Returns when the stale ones were sent."""
    stale_sent = time.time()
    send(b, STALE, dialogs=5, each=6)
    send(b, FRESH, dialogs=4, each=5)
    with pytest.raises(RuntimeError):  # a rolled-back SEND is never counted (read_committed)
        with b.transaction() as tx:
            h = tx.begin_dialog(CLIENT, STALE, CONTRACT)
            for i in range(5):
                tx.send(h, WORK, f"aborted{i}")
            raise RuntimeError("roll back")
    assert receive_all(b, "FreshQueue", 20) == 20
    return stale_sent


def check_known_aggregates(bootstrap: str, ns: str, stale_sent: float, history: Path, seen: Callable[[], Any]) -> None:
    """What a job with 5 s windows reports of known_workload, exactly, wherever it runs (`seen`:
    the job's state, shown when the fresh queue's counts do not come)."""
    fresh = wait_for(
        lambda: (t := totals(bootstrap, ns, "FreshQueue")) and t["receives"] == 20 and t,
        90,
        "the 20 fresh messages received in the analytics topic",
        seen=lambda: (
            totals(bootstrap, ns, "FreshQueue"),
            (latest_values(bootstrap, names.progress_topic(ns), 10) or {}).get(b"FreshQueue"),
            seen(),
        ),
    )
    assert fresh["arrivals"] == 20 and fresh["backlog"] == 0
    assert fresh["stale"] == {"dispatcher_10s": 0, "forwarder_60s": 0, "queue": 0}
    stale = wait_for(
        lambda: (t := totals(bootstrap, ns, "StaleQueue")) and t["stale"]["dispatcher_10s"] == 30 and t,
        60,
        "the 30 unreceived messages past 10 s",
    )
    assert (stale["arrivals"], stale["receives"], stale["backlog"]) == (30, 0, 30), stale
    assert stale["stale"]["queue"] == 30 and stale["stale"]["forwarder_60s"] == 0, stale
    assert stale["oldest_unreceived_age_s"] >= 10
    assert sum(g["backlog"] for g in stale["top_groups"]) == 30 and len(stale["top_groups"]) == 5
    # Every dialog of the stale queue is classified stale, and none of the fresh one.
    rows = dialog_rows(bootstrap, ns)
    assert sorted(r["class"] for r in rows if r["queue"] == "StaleQueue") == ["stale"] * 5
    assert all(r["class"] != "stale" for r in rows if r["queue"] == "FreshQueue")
    # `kbroker dialogs --class stale` lists exactly those five, from the analytics topic.
    out = subprocess.run(
        [KBROKER, "dialogs", "--bootstrap", bootstrap, "--namespace", ns, "--class", "stale", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    listed = orjson.loads(out)
    assert sorted((r["queue"], r["backlog"]) for r in listed) == [("StaleQueue", 6)] * 5
    # Their ages are the ages now (over 10 s: the wait above), not at classification (about 3 s).
    now_age = time.time() - stale_sent
    assert all(10 <= r["oldest_age_s"] <= now_age + 1 for r in listed), (now_age, listed)
    # The reclaim keeps what the job has not read: its group's offsets reach the queues' ends.
    read = committed_offsets(
        bootstrap,
        names.analytics_group(ns),
        [TopicPartition(names.queue_topic(ns, "FreshQueue"), p) for p in (0, 1)],
        10,
        stable=False,
    )
    assert sum(tp.offset for tp in read) >= 20, read
    # Closed windows reach the Parquet history, one row per queue and window, the same counts.
    rows = wait_for(
        lambda: (r := history_rows(history, "FreshQueue")) and sum(w["receives"] for w in r) == 20 and r,
        60,
        "the fresh queue's closed windows in the Parquet history",
        seen=lambda: history_rows(history, "FreshQueue"),
    )
    assert sum(w["arrivals"] for w in rows) == 20
    assert len({w["window_start"] for w in rows}) == len(rows)  # a window once


def history_rows(history: Path, queue: str) -> list[dict]:
    """The queue's rows of the job's Parquet history (read with pyarrow, as any reader may), []
    before a window has closed or while one is being rewritten."""
    import pyarrow.dataset as ds

    try:
        table = ds.dataset(str(history / "queue_windows"), format="parquet", partitioning="hive").to_table()
    except (OSError, ValueError):  # no window closed yet; a window's files replaced under the reader
        return []
    return [r for r in table.to_pylist() if r["queue"] == queue]


def test_known_stale_and_fresh_messages_give_exactly_those_aggregates(analytics_ns, start_analytics):
    bootstrap, ns, w, b = analytics_ns
    job = start_analytics(ns, window=5.0)  # short windows: they close, and reach the history, within the test
    wait_for(lambda: job.batches >= 1, 60, "the job's first batch")
    stale_sent = known_workload(b)
    check_known_aggregates(
        bootstrap, ns, stale_sent, job.s.history, seen=lambda: (job.batches, job.failure(), w.log.read_text()[-4000:])
    )
    # The job's metrics (kbroker/metrics.py; the job runs in this process) say the same, once the
    # batch that wrote those records has set them (just after its transaction).
    gauge = lambda name, **labels: REGISTRY.get_sample_value(name, {"namespace": ns, **labels})  # noqa: E731
    wait_for(
        lambda: gauge("kbroker_analytics_queue_stale_messages", queue="StaleQueue", threshold="dispatcher_10s") == 30,
        10,
        "the stale gauge",
        seen=lambda: gauge("kbroker_analytics_queue_stale_messages", queue="StaleQueue", threshold="dispatcher_10s"),
    )
    assert gauge("kbroker_analytics_queue_backlog_messages", queue="StaleQueue") == 30
    assert gauge("kbroker_analytics_queue_backlog_messages", queue="FreshQueue") == 0
    assert gauge("kbroker_analytics_queue_oldest_unreceived_seconds", queue="StaleQueue") >= 10
    assert gauge("kbroker_analytics_batch_seconds_count") >= job.batches >= 1
    assert gauge("kbroker_analytics_rows_total") >= 50 and gauge("kbroker_analytics_delay_seconds") >= 0
    # Several producers SENDing to one partition append records whose timestamps go backwards: six
    # records on ClientQueue's partition 0 (nothing else writes there), each stamped 100 ms before
    # the one before it, are six arrivals and six unreceived, not the one the timestamp order leaves.
    topic, conv, stamp = names.queue_topic(ns, "ClientQueue"), str(uuid.uuid4()), int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        producer.produce(
            topic,
            b"",
            partition=0,
            timestamp=stamp - 100 * i,
            headers=[
                (H_MESSAGE_ID, str(uuid.uuid4())),
                (H_CONVERSATION_ID, conv),
                (H_GROUP_ID, conv),
                (H_TO_SIDE, "INITIATOR"),
                (H_MESSAGE_TYPE, WORK),
            ],
        )
    assert producer.flush(10) == 0
    wait_for(
        lambda: (
            committed_offsets(bootstrap, names.analytics_group(ns), [TopicPartition(topic, 0)], 10, stable=False)[
                0
            ].offset
            >= 6
        ),
        30,
        "the job's read of the six records",
    )
    client = totals(bootstrap, ns, "ClientQueue")  # written in the transaction that moved the read position
    assert (client["arrivals"], client["backlog"]) == (6, 6), client


LATE_QUEUE = """
queues:
  - name: LateQueue
    partitions: 2
services:
  - {name: //kbroker/test/Late, queue: LateQueue, contracts: [//kbroker/test/WorkContract]}
"""


def test_what_the_job_has_not_read_yet_outlives_a_reclaim_between_its_batches(analytics_ns, start_analytics, tmp_path):
    """The 5th-tick reclaim deletes what readers received, but keeps what the analytics job has not
    counted: a queue its first batch had nothing of (that batch knows no end offsets, so commits no
    position), and a queue created after it (its Spark source has not found it yet). The job is
    stopped right after its first batch (the next would come 30 s later) and started again from its
    checkpoint after the reclaim, so the reclaim falls between its first and second batches however
    slow the machine; it deleted both queues' records before."""
    bootstrap, ns, w, b = analytics_ns
    job = start_analytics(ns, trigger=30.0, window=5.0)
    wait_for(lambda: job.batches >= 1, 60, "the job's first batch")
    job.stop()
    late = tmp_path / "late.yaml"
    late.write_text(LATE_QUEUE)
    apply_paths(bootstrap, ns, [DATA / "analytics.yaml", late])
    late_b = Broker(bootstrap, ns)
    try:
        send(b, FRESH, dialogs=2, each=5)
        send(late_b, "//kbroker/test/Late", dialogs=2, each=3)
        assert receive_all(b, "FreshQueue", 10) == 10
        assert receive_all(late_b, "LateQueue", 6) == 6
    finally:
        late_b.close()
    reclaimed = reclaim_namespace(bootstrap, read_catalog(bootstrap, ns))
    touched = {r.topic for r in reclaimed}
    assert names.queue_topic(ns, "FreshQueue") not in touched and names.queue_topic(ns, "LateQueue") not in touched, (
        reclaimed
    )
    start_analytics(ns, window=5.0)  # from the first job's checkpoint: its second batch
    counted = wait_for(
        lambda: (
            all(
                (t := totals(bootstrap, ns, q)) and t["arrivals"] == n
                for q, n in (("FreshQueue", 10), ("LateQueue", 6))
            )
            and True
        ),
        90,
        "both queues' arrivals counted",
        seen=lambda: (totals(bootstrap, ns, "FreshQueue"), totals(bootstrap, ns, "LateQueue")),
    )
    assert counted

    # Once the job has read them, a reclaim deletes them (the worker's, or this one).
    def log_starts() -> list[int]:
        reclaim_namespace(bootstrap, read_catalog(bootstrap, ns))
        c = clients.consumer(bootstrap, "kbroker-test-watermarks")
        try:
            return [
                c.get_watermark_offsets(TopicPartition(names.queue_topic(ns, q), p), timeout=10)[0]
                for q in ("FreshQueue", "LateQueue")
                for p in (0, 1)
            ]
        finally:
            c.close()

    wait_for(lambda: sum(log_starts()) == 16, 60, "the counted records reclaimed", seen=log_starts)


def test_a_dialog_that_stops_being_received_is_reclassified_stale_and_the_worker_hears_of_it(
    analytics_ns, start_analytics
):
    bootstrap, ns, w, b = analytics_ns
    start_analytics(ns)
    h = b.begin_dialog(CLIENT, STALE, CONTRACT)
    b.send(h, WORK, "first")
    with b.transaction() as tx:
        assert len(tx.receive("StaleQueue", top=1, wait=10.0)) == 1
    key = None

    def dialog(klass: str):
        rows = [r for r in dialog_rows(bootstrap, ns) if r["queue"] == "StaleQueue" and r["class"] == klass]
        return rows[0] if rows else None

    # The job's first batches (state store, code generation) take most of a minute when the other
    # test process runs a cluster's kill test beside it on the same two cores: by then one receive
    # is older than a window and the dialog is rightly idle. So it stays active (a message sent and
    # received every 2 s) until the job has classified it so.
    kept = [time.monotonic()]

    def kept_active():
        row = dialog("active")
        if row is None and time.monotonic() - kept[0] >= 2:
            b.send(h, WORK, "keep active")
            with b.transaction() as tx:
                assert len(tx.receive("StaleQueue", top=1, wait=10.0)) == 1
            kept[0] = time.monotonic()
        return row

    active = wait_for(kept_active, 150, "the dialog classified active")
    key = f"{active['conversation_id']}/{active['side']}"
    b.send(h, WORK, "never received")  # from now on nobody receives
    stale = wait_for(lambda: dialog("stale"), 60, "the dialog classified stale")
    assert f"{stale['conversation_id']}/{stale['side']}" == key and stale["previous"] == "active"
    told = wait_for(
        lambda: next(
            (
                r
                for r in httpx.get(w.url + "/dialogs/", timeout=5).json()["rows"]
                if f"{r['conversation_id']}/{r['side']}" == key and r["to"] == "stale"
            ),
            None,
        ),
        30,
        "the worker's /dialogs/ showing the RECLASSIFY to stale",
    )
    assert told["from"] == "active" and told["queue"] == "StaleQueue"


class JobProcess:
    """`kbroker analytics run` as a process of its own (with its Spark JVM), killed with -9."""

    def __init__(self, bootstrap: str, ns: str, tmp: Path, n: int, master: str = "local[2]", args: Sequence[str] = ()):
        self.log, self.history = tmp / f"analytics-{n}.log", tmp / "history"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    KBROKER,
                    "analytics",
                    "run",
                    "--bootstrap",
                    bootstrap,
                    "--namespace",
                    ns,
                    "--master",
                    master,
                    "--checkpoint",
                    str(tmp / "checkpoint"),
                    "--history",
                    str(self.history),
                    "--trigger",
                    "1",
                    *args,
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def batches(self) -> int:
        return self.log.read_text(errors="replace").count("analytics batch=")

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the job and its JVM, at once
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()


@pytest.fixture
def private_ns(tmp_path):
    """A broker of the test's own (so it can be stopped), a namespace and a worker on it."""
    embedded = EmbeddedBroker(tmp_path / "kafka")
    port, cport = free_port(), free_port()
    bootstrap = embedded.start(port=port, controller_port=cport).bootstrap
    ns = "k" + uuid.uuid4().hex[:10]
    w = b = None
    try:
        apply_paths(bootstrap, ns, [DATA / "analytics.yaml"])
        w = Worker(bootstrap, ns, tmp_path)
        b = Broker(bootstrap, ns)
        w.wait_ready()
        yield embedded, port, cport, bootstrap, ns, b
    finally:
        if b is not None:
            b.close()
        if w is not None:
            w.stop()
        embedded.stop()


@pytest.mark.long  # about 2 minutes: `make test-long`
@pytest.mark.timeout(600)  # its waits, bounded one by one, add up past the default 300 s; a CI run under load took 298
def test_a_job_killed_and_restarted_counts_nothing_twice_and_rides_through_a_broker_restart(private_ns, tmp_path):
    embedded, port, cport, bootstrap, ns, b = private_ns
    first = JobProcess(bootstrap, ns, tmp_path, 1)
    try:
        wait_for(lambda: first.batches() >= 2, 120, f"the job's first batches: {first.log}")
        send(b, STALE, dialogs=20, each=5)  # 100 messages
        wait_for(lambda: totals(bootstrap, ns, "StaleQueue").get("arrivals", 0) > 0, 60, "a first count")
        sending = threading.Thread(target=lambda: [send(b, STALE, 1, 5) or time.sleep(0.05) for _ in range(40)])
        sending.start()  # 200 more, while it dies
        time.sleep(1.0)
        first.kill9()
        sending.join()
    finally:
        first.stop()
    killed_at = totals(bootstrap, ns, "StaleQueue").get("arrivals", 0)
    assert 0 < killed_at < 300, f"the kill did not come mid-stream: {killed_at} counted"
    second = JobProcess(bootstrap, ns, tmp_path, 2)
    try:
        wait_for(
            lambda: totals(bootstrap, ns, "StaleQueue").get("arrivals") == 300,
            120,
            f"all 300 arrivals counted after the restart ({second.log})",
        )
        n = second.batches()
        wait_for(lambda: second.batches() >= n + 3, 60, "three more batches")
        after = totals(bootstrap, ns, "StaleQueue")
        assert (after["arrivals"], after["backlog"]) == (300, 300), (killed_at, after)
        # The broker goes away for 15 s: the job stays up, says so in a bounded number of lines,
        # and counts what is sent after it comes back, once.
        lines = len(second.log.read_text(errors="replace").splitlines())
        embedded.stop()
        time.sleep(15)
        embedded.start(port=port, controller_port=cport)
        assert second.proc.poll() is None, second.log.read_text()[-3000:]
        # A broker just started may not have led every partition yet (a SEND then fails with a
        # typed, retriable error: a fresh run hit "Unknown partition" on the endpoints topic).
        wait_for(lambda: partitions_led(bootstrap, ns), 60, "every partition of the namespace led again")
        send(b, STALE, dialogs=10, each=5)
        after = wait_for(
            lambda: (t := totals(bootstrap, ns, "StaleQueue")).get("arrivals") == 350 and t,
            240,
            f"the 50 sent after the restart counted ({second.log})",
        )
        assert after["backlog"] == 350 and after["receives"] == 0, after
        assert second.proc.poll() is None
        outage = second.log.read_text(errors="replace").splitlines()[lines:]
        noisy = [ln for ln in outage if "analytics batch=" not in ln]
        assert len(noisy) < 200, f"{len(noisy)} log lines for a 15 s outage:\n" + "\n".join(noisy[:40])
    finally:
        second.stop()


def test_the_bench_keep_up_measurement_gives_the_job_and_both_send_rates(kafka_bootstrap, spark):
    """`kbroker bench analytics`'s throughput rows, small: the job's rate against each SEND path's
    rate (a number each, with the sender's CPU in the baseline's detail), every SEND read."""
    from kbroker.bench.context import BenchContext
    from kbroker.bench.harness import samples_dir
    from kbroker.bench.params import Params
    from kbroker.bench.progress import Reporter
    from kbroker.bench.scenarios.analytics import keep_up
    from kbroker.core.cluster import Cluster

    ctx = BenchContext(
        Cluster(kafka_bootstrap), Params(repeat=1, conversations=50), Reporter(quiet=True), samples_dir(), "test"
    )
    try:
        rows = keep_up(ctx, spark, batch=400)
    finally:
        ctx.cleanup()
    one, pipelined = rows["analytics-throughput"], rows["analytics-throughput-pipelined"]
    assert one["kbroker"] == pipelined["kbroker"] > 0
    assert 0 < one["kbroker_detail"]["rows"] < 2000  # every SEND was read; the first batch is left out
    for row, sent in ((one, 400), (pipelined, 1600)):
        assert isinstance(row["baseline"], float) and row["baseline"] > 0, row
        assert row["baseline_detail"]["messages"] == sent and row["baseline_detail"]["cpu_ms_per_msg"] > 0
