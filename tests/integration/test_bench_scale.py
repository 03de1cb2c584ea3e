"""`kbroker bench scale` at small sizes on the session's broker: each curve's points are measured
(no point failed), the results file holds them, and the workers it started are gone. Minutes, so
opt-in (`make test-long`, run by CI after `make test`). Its tick reader, on the events topic
anyone may write, is in the default run."""

from __future__ import annotations

import json
import os
import sys
import uuid

import psutil
import pytest

from tests.helpers import ROOT, run_bench_cli


@pytest.mark.bench_scale
@pytest.mark.timeout(600)
def test_the_scaling_curves_are_measured_at_small_sizes(kafka_bootstrap, tmp_path):
    env = {
        **os.environ,
        "KBROKER_BOOTSTRAP": kafka_bootstrap,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    stdout, _ = run_bench_cli(
        [
            sys.executable,
            "-m",
            "kbroker",
            "bench",
            "scale",
            "--queues",
            "2,4",
            "--dialogs",
            "300",
            "--workers",
            "1,2",
            "--drain-messages",
            "600",
            "--ramp-up",
            "1",
            "--json",
            "--out",
            str(tmp_path / "results"),
            "--no-docs",
            "--quiet",
        ],
        env,
        timeout=540,
    )

    doc = json.loads(stdout)
    assert doc == json.loads((tmp_path / "results" / "scale.json").read_text())
    curves = {c: d["points"] for c, d in doc["curves"].items()}
    for points in curves.values():
        assert not [p for p in points if "error" in p], points

    queues = curves["queues"]
    assert [p["queues"] for p in queues] == [2, 4]
    for p in queues:
        # Each queue is a topic of 4 partitions; the namespace has its system topics beside.
        assert p["namespace_partitions"] > 4 * p["queues"] and p["worker_start_s"] > 0 and p["worker_rss_mb"] > 0
        activation = p["activation_ms"]
        assert activation["samples"] == p["queues"] and 0 < activation["p50"] <= activation["p99"]
        assert p["tick_ms"]["ticks"] >= 2 and p["tick_ms"]["p50"] >= 0
    assert queues[1]["namespace_partitions"] - queues[0]["namespace_partitions"] == 2 * 4

    (dialogs,) = curves["dialogs"]
    assert dialogs["dialogs"] == 300
    for side in ("send", "receive"):
        assert dialogs[side]["msg_per_s"] > 0 and dialogs[side]["peak_rss_mb"] > 0

    workers = curves["workers"]
    assert [(p["workers"], p["messages"]) for p in workers] == [(1, 600), (2, 600)]
    assert workers[0]["monitor_owners"] == 1 and all(p["msg_per_s"] > 0 for p in workers)

    # The workers the curves started were stopped.
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "worker" in (p.info["cmdline"] or []) and any("bench-scale" in a for a in p.info["cmdline"] or [])
    ]
    assert not left, [p.info["cmdline"] for p in left]


def test_the_tick_reader_skips_what_another_client_wrote_and_reads_on(kafka_bootstrap):
    """Garbage, an oversize record, forged headers and TICK events of the wrong shape on the
    events topic: the reader skips each, keeps the ticks around them, and reads on from where it
    stopped."""
    from confluent_kafka import Producer

    from kbroker.bench.scale.many_queues import TickWatch
    from kbroker.core import names
    from kbroker.kafka.topics import create_missing_topics

    namespace = f"scale-{uuid.uuid4().hex[:8]}"
    topic = names.events_topic(namespace)
    create_missing_topics(kafka_bootstrap, {topic: 2}, {"max.message.bytes": str(2 * 2**20)}, replication_factor=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2 * 2**20})

    def tick(asked, done, **extra) -> bytes:
        return json.dumps({"event": "TICK", "number": 1, "requested_ms": asked, "time": done, **extra}).encode()

    since = 1_000_000
    records = [
        tick(since - 10, since + 5),  # asked before the watch's start: not this run's
        b"\xff\x00 not json",
        None,
        b"{" * 1_500_000,
        b"[1, 2]",
        b'{"event": "TICK"}',
        tick("1000000", since + 50),
        tick(since, True),
        tick(since + 100, since + 90),  # ends before it began
        tick(since + 1, since + 26),  # 25 ms
        json.dumps({"event": "QUEUE_ACTIVATION", "queue": "Q", "time": since}).encode(),
    ]
    for i, value in enumerate(records):
        producer.produce(topic, value=value, partition=i % 2, headers=[("kb.forged", b"\xff" * 100)])
    assert producer.flush(30) == 0
    watch = TickWatch(kafka_bootstrap, namespace, since)
    try:
        assert watch.poll() == [25.0]
        producer.produce(topic, value=b"\xfe garbage again", partition=0)
        producer.produce(topic, value=tick(since + 200, since + 240), partition=1)
        assert producer.flush(30) == 0
        assert watch.poll() == [25.0, 40.0]  # read on, nothing counted twice
    finally:
        watch.close()
