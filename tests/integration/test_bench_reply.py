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
