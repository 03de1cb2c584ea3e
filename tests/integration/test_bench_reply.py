"""The request-reply rows' responders, small, against the session's broker: each form answers
every request of a closed loop, and says its CPU per reply and its latencies."""

from __future__ import annotations

import pytest

from kbroker.bench.context import BenchContext
from kbroker.bench.harness import samples_dir
from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.bench.scenarios import reply
from kbroker.core.cluster import Cluster


@pytest.mark.parametrize("side", ["kbroker", "batched"])
def test_each_responder_form_answers_every_request(kafka_bootstrap, side):
    ctx = BenchContext(
        Cluster.of(kafka_bootstrap),
        Params(messages=300, conversations=30, readers=8),
        Reporter(quiet=True),
        samples_dir(),
        "session broker",
    )
    out = reply.measure_request_reply(ctx, side)  # raises unless all 300 replies committed in time
    d = out["detail"]
    assert out["value"] > 0 and d["cpu_ms_per_msg"] > 0
    assert 0 < d["p50_ms"] <= d["p99_ms"]


@pytest.mark.parametrize("side", ["kbroker", "baseline"])
@pytest.mark.parametrize("dialogs", [1, 10])
def test_each_round_trip_side_times_every_round_trip(kafka_bootstrap, monkeypatch, side, dialogs):
    """The round-trip rows, 40 round trips a side: every one timed, none past the run's time-out."""
    from kbroker.bench.scenarios import round_trip

    monkeypatch.setattr(round_trip, "ROUND_TRIPS", 40)
    ctx = BenchContext(Cluster.of(kafka_bootstrap), Params(), Reporter(quiet=True), samples_dir(), "session broker")
    out = round_trip.measure(ctx, side, dialogs)  # raises unless every reply came back in time
    d = out["detail"]
    assert d["round_trips"] == 40
    assert 0 < out["value"] == d["p50_ms"] <= d["p99_ms"]
