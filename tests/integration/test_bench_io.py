"""The io-bound rows' kbroker sides, small, against the session's broker: every message handled,
with the side's CPU time and peak RSS, from one process and from two."""

from __future__ import annotations

from kbroker.bench.context import BenchContext
from kbroker.bench.harness import samples_dir
from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.bench.scenarios import io as scenarios_io
from kbroker.core.cluster import Cluster


def context(bootstrap: str) -> BenchContext:
    return BenchContext(
        Cluster.of(bootstrap), Params(conversations=40), Reporter(quiet=True), samples_dir(), "session broker"
    )


def test_one_process_of_reader_threads_handles_every_message_and_says_what_it_used(kafka_bootstrap):
    out = scenarios_io.measure_io_bound(context(kafka_bootstrap), "kbroker")
    assert out["value"] > 0
    assert out["detail"]["cpu_seconds"] > 0 and out["detail"]["peak_rss_mb"] > 10


def test_two_processes_share_the_queue_and_report_each_ones_cpu_and_rss(kafka_bootstrap):
    out = scenarios_io.measure_processes(context(kafka_bootstrap), 2)  # raises unless all 80 are handled
    d = out["detail"]
    assert out["value"] > 0 and d["processes"] == 2
    assert len(d["peak_rss_mb_per_process"]) == 2 and min(d["peak_rss_mb_per_process"]) > 10
    assert d["cpu_seconds"] > 0


def test_batched_readers_take_several_groups_a_transaction_and_handle_every_message(kafka_bootstrap):
    out = scenarios_io.measure_io_bound(context(kafka_bootstrap), "batched")  # raises unless all 80 are handled
    assert out["value"] > 0 and out["detail"]["cpu_seconds"] > 0
