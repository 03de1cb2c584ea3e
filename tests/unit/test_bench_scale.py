"""The pure parts of `kbroker bench scale`: its point lists, the catalog of its queue curve, and
the plot drawn from a results file (points with errors left out)."""

from __future__ import annotations

import pytest
import yaml

from kbroker.bench.scale import parse_points
from kbroker.bench.scale_plot import _series, plot
from kbroker.bench.scale_queues import catalog, queue_name
from kbroker.core.catalog.loader import load_definitions


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
    assert all(q.partitions == 2 and q.activation.max_queue_readers == 2 and q.activation.procedure == "m:f"
               for q in activated.values())
    assert {s.queue for s in loaded.services.values()} == {"InitiatorQueue", *activated}


def test_the_plot_skips_failed_points_and_writes_a_png(tmp_path):
    points = [{"queues": 10, "worker_rss_mb": 100.0, "activation_ms": {"p99": 900.0}},
              {"n": 100, "error": "RuntimeError: no rows"},
              {"queues": 500, "worker_rss_mb": 180.0, "activation_ms": {"p99": None}}]
    assert _series(points, "queues", "worker_rss_mb") == ([10, 500], [100.0, 180.0])
    assert _series(points, "queues", "activation_ms", "p99") == ([10], [900.0])
    doc = {"curves": {"queues": {"points": points, "machine": {"cores": 2, "kafka": "Apache Kafka 4.4.0"}}}}
    path = plot(doc, tmp_path / "scale.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
