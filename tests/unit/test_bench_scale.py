"""The pure parts of `kbroker bench scale`: its point lists, the catalog of its queue curve, and
the plot drawn from a results file (points with errors left out)."""

from __future__ import annotations

import json

import pytest
import yaml
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from kbroker.bench.scale.many_queues import catalog, queue_name, tick_latency
from kbroker.bench.scale.plot import _series, plot
from kbroker.bench.scale.run import parse_points
from kbroker.core.catalog.loader import load_definitions
from kbroker.worker.settings import monitor_partition


def test_points_are_whole_numbers_of_at_least_one():
    assert parse_points("10,100,500") == (10, 100, 500)
    assert parse_points("1_000_000") == (1_000_000,)
    for bad in ("", "x", "10,0", "-1", "1.5"):
        with pytest.raises(ValueError):
            parse_points(bad)


def test_the_queue_curves_catalog_is_what_apply_accepts(tmp_path):
    (tmp_path / "scale.yaml").write_text(yaml.safe_dump(catalog(3, 2, procedure="m:f", max_readers=2)))
    loaded = load_definitions([tmp_path], "scale-test")
    activated = {q.name: q for q in loaded.queues.values() if q.activation is not None}
    assert sorted(activated) == [queue_name(i) for i in range(3)]
    assert all(
        q.partitions == 2 and q.activation.max_queue_readers == 2 and q.activation.procedure == "m:f"
        for q in activated.values()
    )
    assert {s.queue for s in loaded.services.values()} == {"InitiatorQueue", *activated}


def test_the_plot_skips_failed_points_and_writes_a_png(tmp_path):
    points = [
        {"queues": 10, "worker_rss_mb": 100.0, "activation_ms": {"p99": 900.0}},
        {"n": 100, "error": "RuntimeError: no rows"},
        {"queues": 500, "worker_rss_mb": 180.0, "activation_ms": {"p99": None}},
    ]
    assert _series(points, "queues", "worker_rss_mb") == ([10, 500], [100.0, 180.0])
    assert _series(points, "queues", "activation_ms", "p99") == ([10], [900.0])
    doc = {"curves": {"queues": {"points": points, "machine": {"cores": 2, "kafka": "Apache Kafka 4.4.0"}}}}
    path = plot(doc, tmp_path / "scale.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@given(
    st.one_of(
        st.none(),
        st.binary(max_size=200),
        st.dictionaries(
            st.sampled_from(["event", "requested_ms", "time"]),
            st.one_of(
                st.just("TICK"), st.integers(), st.booleans(), st.text(max_size=5), st.floats(allow_nan=True), st.none()
            ),
            max_size=3,
        ).map(lambda d: json.dumps(d).encode()),
    )
)
def test_a_tick_latency_is_read_from_any_record_without_raising(value):
    ms = tick_latency(value, since_ms=0)
    assert ms is None or (isinstance(ms, float) and ms >= 0)


def test_a_tick_latency_is_its_events_time_less_when_it_was_asked_for():
    def tick(asked, done) -> bytes:
        return json.dumps({"event": "TICK", "requested_ms": asked, "time": done}).encode()

    assert tick_latency(tick(1_000, 1_025), since_ms=1_000) == 25.0
    assert tick_latency(tick(999, 1_025), since_ms=1_000) is None  # asked before the run
    assert tick_latency(tick(1_030, 1_025), since_ms=0) is None  # ends before it began
    assert tick_latency(tick(True, 1_025), since_ms=0) is None
    assert tick_latency(b'{"event": "TICK_NOT"}', since_ms=0) is None


def test_the_worker_curves_queues_each_have_a_monitor_partition_of_their_own():
    from kbroker.bench.scale import workers

    parts = [monitor_partition(q, workers.MONITOR_PARTITIONS) for q in workers.NAMES]
    assert len(workers.NAMES) == workers.QUEUES and sorted(parts) == list(range(workers.MONITOR_PARTITIONS))
    defined = catalog(workers.QUEUES, 4, numbers=workers.NUMBERS)
    assert [q["name"] for q in defined["queues"][1:]] == workers.NAMES


@given(st.text(min_size=1, max_size=40), st.integers(1, 64))
def test_a_monitor_partition_is_where_the_workers_producer_puts_the_queues_events(queue, partitions):
    chosen = DefaultPartitioner()(queue.encode(), list(range(partitions)), list(range(partitions)))
    assert monitor_partition(queue, partitions) == chosen
