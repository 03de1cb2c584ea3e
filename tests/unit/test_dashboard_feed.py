"""The dashboard's snapshots (kbroker/worker/web/feed.py) without a broker: per-second rates from
successive copies of the analytics job's windows, the merge of windows, monitor rows and tasks,
and a feed whose sources fail (logged once, the last data kept)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from kbroker.worker.web.feed import DashboardFeed, Rates, merge

T0 = 1_764_000_000_000  # epoch ms, on a window boundary


def window(
    queue: str, start: int, as_of: int, arrivals: int, receives: int = 0, backlog: int = 0, **more: Any
) -> dict[str, Any]:
    return {
        "kind": "queue_window",
        "queue": queue,
        "window_start": start,
        "window_end": start + 60_000,
        "window_s": 60,
        "arrivals": arrivals,
        "receives": receives,
        "backlog": backlog,
        "as_of": as_of,
        "stale": {"dispatcher_10s": 0, "forwarder_60s": 0, "queue": 0},
        "stale_after_s": 30,
        "oldest_unreceived_age_s": None,
        **more,
    }


def test_rates_are_the_growth_of_a_window_between_copies_over_the_jobs_clock():
    r = Rates(span=10)
    r.update({"Q": [window("Q", T0, T0 + 2_000, arrivals=4)]})
    assert r.rates("Q") is None  # one copy: no difference yet
    r.update({"Q": [window("Q", T0, T0 + 4_000, arrivals=14, receives=2)]})
    assert r.rates("Q") == (5.0, 1.0)
    r.update({"Q": [window("Q", T0, T0 + 4_000, arrivals=99)]})  # no new batch (same as_of): ignored
    assert r.rates("Q") == (5.0, 1.0)


def test_rates_carry_across_a_new_window_and_fall_to_zero_when_nothing_moves():
    r = Rates(span=10)
    r.update({"Q": [window("Q", T0, T0 + 58_000, arrivals=100)]})
    # The old window's last copy and the new window's first, in one read: 10 + 10 in 4 s.
    r.update({"Q": [window("Q", T0, T0 + 60_000, arrivals=110), window("Q", T0 + 60_000, T0 + 62_000, arrivals=10)]})
    assert r.rates("Q") == (5.0, 0.0)
    # The job goes on (another queue's windows move its clock); Q's windows stay as they were.
    for s in range(1, 7):
        r.update(
            {
                "Q": [window("Q", T0, T0 + 60_000, arrivals=110), window("Q", T0 + 60_000, T0 + 62_000, arrivals=10)],
                "R": [window("R", T0 + 60_000, T0 + 62_000 + 2_000 * s, arrivals=s)],
            }
        )
    arrivals, receives = r.rates("Q")
    assert arrivals == 0.0 and receives == 0.0
    assert r.rates("R") == (0.5, 0.0)


def test_merge_takes_the_newer_backlog_and_the_monitor_and_task_columns():
    rates = Rates()
    latest = {
        "A": window(
            "A",
            T0,
            T0 + 30_000,
            arrivals=30,
            backlog=7,
            oldest_unreceived_age_s=12.5,
            stale={"dispatcher_10s": 3, "forwarder_60s": 0, "queue": 1},
            stale_after_s=12,
        )
    }
    monitors = [
        {
            "queue": "A",
            "state": "NOTIFIED",
            "readers": 1,
            "max_queue_readers": 2,
            "activation": "ON",
            "backlog": 9,
            "ready_groups": 2,
            "as_of": "2025-11-24T16:00:20+00:00",
            "degraded": False,
        },  # older
        {
            "queue": "B",
            "state": "RECEIVES_OCCURRING",
            "readers": 2,
            "max_queue_readers": 2,
            "activation": "ON",
            "backlog": 4,
            "ready_groups": 1,
            "as_of": "2025-11-24T16:00:40+00:00",
            "degraded": False,
        },
    ]
    tasks = [{"queue": "B", "task_id": "t1", "started_at": 1.0}, {"queue": "B", "task_id": "t2", "started_at": 2.0}]
    out = merge(["A", "B", "C"], latest, rates, monitors, tasks)
    assert set(out) == {"A", "B", "C"}
    a = out["A"]
    assert (a["backlog"], a["backlog_source"]) == (7, "analytics")  # T0 + 30 s is after the monitor's count
    assert (a["stale_10s"], a["stale_60s"], a["stale_queue"], a["stale_after_s"]) == (3, 0, 1, 12)
    assert a["oldest_age_s"] == 12.5 and a["monitor_state"] == "NOTIFIED" and a["readers"] == 1
    assert (a["arrivals_per_s"], a["receives_per_s"]) == (1.0, 0.0)  # 30 in the window's first 30 s
    b = out["B"]
    assert (b["backlog"], b["backlog_source"], b["tasks"], b["monitor_state"]) == (
        4,
        "monitor",
        2,
        "RECEIVES_OCCURRING",
    )
    assert b["arrivals_per_s"] is None and b["stale_queue"] is None
    c = out["C"]
    assert c["backlog"] is None and c["monitor_state"] is None and c["tasks"] == 0


class FlakyFollower:
    """An AnalyticsFollower whose poll fails while `down`."""

    def __init__(self, bootstrap: str, namespace: str):
        self.down, self.closed = True, False
        self.windows = {"Q": [window("Q", T0, T0 + 1_000, arrivals=1, backlog=1)]}

    def poll(self, timeout: float = 0.5) -> int:
        if self.down:
            raise RuntimeError("broker down")
        return 0

    def queues(self) -> dict[str, list[dict[str, Any]]]:
        return self.windows

    def close(self) -> None:
        self.closed = True


def test_a_failing_source_is_logged_once_and_the_feed_goes_on(caplog):
    broker = SimpleNamespace(catalog=SimpleNamespace(queues={"Q": None}))
    handlers = SimpleNamespace(rows=lambda: [])
    calls = []

    def monitors(bootstrap: str, namespace: str, timeout: float) -> list[dict[str, Any]]:
        calls.append(timeout)
        raise ConnectionError("no leader")

    feed = DashboardFeed("b:9092", "ns", "w1", broker, handlers, follower=FlakyFollower, monitors=monitors)
    feed.watch()
    with caplog.at_level(logging.INFO, logger="kbroker.worker.web.dashboard"):
        for _ in range(3):
            snap = feed.step()
        assert snap["queues"]["Q"]["backlog"] == 1  # what the follower holds is still shown
        assert snap["analytics"]["error"] == "RuntimeError: broker down"
        assert snap["monitors"]["error"] == "ConnectionError: no leader" and len(calls) == 3
        feed._follower.down = False
        snap = feed.step()
    assert snap["analytics"]["error"] is None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("reading analytics failed" in m for m in lines) == 1
    assert sum("reading monitors failed" in m for m in lines) == 1
    assert sum("reading analytics works again" in m for m in lines) == 1
    follower = feed._follower
    feed.close()
    assert follower.closed


def test_monitor_rows_are_read_only_while_someone_watches():
    broker = SimpleNamespace(catalog=SimpleNamespace(queues={}))
    calls = []
    feed = DashboardFeed(
        "b:9092",
        "ns",
        "w1",
        broker,
        SimpleNamespace(rows=lambda: []),
        follower=FlakyFollower,
        monitors=lambda *a, **k: calls.append(1) or [],
    )
    feed.step()
    assert calls == []
    feed.watch()
    feed.step()
    assert calls == [1]
    feed.close()
