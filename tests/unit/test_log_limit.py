"""The rate-limited log summariser and the degraded reasons with back-off, on a fake clock."""

from __future__ import annotations

import logging

from kbroker.core.health import Health, backoff
from kbroker.core.log_limit import LogLimiter, RateLimitFilter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_first_occurrence_is_written_repeats_are_counted_and_summarised_once_per_window():
    clock = FakeClock()
    lim = LogLimiter(window=30, clock=clock)
    assert lim.admit("down") == 0
    for _ in range(1000):
        clock.now += 0.01
        assert lim.admit("down") is None
    assert lim.due_summaries() == []  # the window (30 s) has not ended
    clock.now = 1031.0
    [summary] = lim.due_summaries()
    assert (summary.key, summary.count) == ("down", 1000)
    assert lim.due_summaries() == []  # once
    clock.now += 5
    assert lim.admit("down") is None  # a new window started with the summary
    clock.now += 30
    assert lim.admit("down") == 1  # written, carrying the one held back


def test_other_keys_are_independent_and_recovery_is_reported_once():
    clock = FakeClock()
    lim = LogLimiter(window=10, clock=clock)
    assert lim.admit("a") == 0 and lim.admit("b") == 0 and lim.admit("a") is None
    clock.now += 7
    rec = lim.recovered("a")
    assert rec is not None and rec.failures == 2 and rec.seconds == 7
    assert lim.recovered("a") is None
    assert lim.admit("a") == 0  # failing again after a recovery: written at once


def test_filter_holds_back_repeats_that_differ_only_in_numbers():
    clock = FakeClock()
    filt = RateLimitFilter(LogLimiter(window=30, clock=clock), always=("noisy",))
    records = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("noisy.client")
    logger.propagate = False
    handler = Keep()
    handler.addFilter(filt)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        for port in range(500):
            logger.info("Connect to 127.0.0.1:%d failed (after %dms)", port, port % 7)
        logging.getLogger("quiet").info("not limited")
        assert records == ["Connect to 127.0.0.1:0 failed (after 0ms)"]
        clock.now += 31
        assert filt.write_summaries(logger) == 1
        assert records[1].startswith("499 more like this in the last 31 s (noisy.client): Connect to")
        logger.info("Connect to 127.0.0.1:1 failed (after 1ms)")  # a new window: held back
        assert len(records) == 2
        clock.now += 31
        logger.info("Connect to 127.0.0.1:2 failed (after 2ms)")  # written, after its count
        assert records[2:] == [
            "1 more like this in the last 30 s, before:",
            "Connect to 127.0.0.1:2 failed (after 2ms)",
        ]
    finally:
        logger.removeHandler(handler)


def test_filter_passes_lines_below_its_level_from_other_loggers():
    filt = RateLimitFilter(LogLimiter(window=30, clock=FakeClock()))
    rec = logging.LogRecord("kbroker.worker", logging.INFO, __file__, 1, "launch reader", None, None)
    assert all(filt.filter(rec) for _ in range(10))
    warn = logging.LogRecord("kbroker.worker", logging.WARNING, __file__, 1, "refresh failed", None, None)
    assert [filt.filter(warn) for _ in range(3)] == [True, False, False]


def test_health_backs_off_exponentially_and_clears_on_success():
    assert [backoff(n, 0.5, 10) for n in (1, 2, 3, 4, 5, 6, 20)] == [0.5, 1, 2, 4, 8, 10, 10]
    h = Health(base_delay=0.5, max_delay=10)
    assert h.due("catalog refresh", 0) and not h.degraded and not h.failing("catalog refresh")
    h.failed("catalog refresh", "BrokerUnavailableError: down", True, 100.0)
    assert not h.due("catalog refresh", 100.4) and h.due("catalog refresh", 100.5)
    assert h.failing("catalog refresh") and not h.failing("tick")
    r = h.failed("catalog refresh", "BrokerUnavailableError: down", True, 101.0)
    assert (r.failures, r.since, r.retry_at) == (2, 100.0, 102.0)
    snap = h.snapshot()
    assert snap["degraded"] and snap["reasons"][0]["component"] == "catalog refresh"
    assert snap["reasons"][0]["failures"] == 2
    assert h.succeeded("catalog refresh") is not None and not h.degraded and not h.failing("catalog refresh")
    assert h.succeeded("catalog refresh") is None and h.snapshot() == {"degraded": False, "reasons": []}


def test_a_queues_health_holds_the_process_wide_reasons_and_its_own_not_another_queues():
    h = Health()
    h.failed("procedure m:f on queue A", "RuntimeError: boom", False, 1.0, queue="A")
    h.failed("counting queue B", "KafkaException: timed out", True, 1.0, queue="B")
    assert [r["component"] for r in h.snapshot("A")["reasons"]] == ["procedure m:f on queue A"]
    assert h.snapshot("A")["reasons"][0]["queue"] == "A"
    assert h.snapshot("C") == {"degraded": False, "reasons": []}  # no reason of C's, none process-wide
    h.failed("catalog refresh", "BrokerUnavailableError: down", True, 2.0)  # the whole process's
    assert [r["component"] for r in h.snapshot("C")["reasons"]] == ["catalog refresh"]
    assert [r["component"] for r in h.snapshot("B")["reasons"]] == ["catalog refresh", "counting queue B"]
    assert len(h.snapshot()["reasons"]) == 3  # the process's view: every reason
