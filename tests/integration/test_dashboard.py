"""The worker's live dashboard (`/dashboard`, kbroker/worker/web/dashboard.py) in a real browser:
Debian's chromium driven by Playwright, on a real `kbroker worker` and the real broker. The page
must show the test's queues, each with its charts, and follow them as messages are sent and
received; with the analytics job running, its stale counts must rise for messages left
unreceived past the queue's `stale_after`.

Chromium is Debian's (`scripts/prereqs.sh` installs it); Playwright never downloads a browser
of its own here."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import DATA
from tests.integration.test_worker import Worker

CATALOG = DATA / "dashboard.yaml"
CLIENT, PINGS, PING = "//kbroker/test/dash/Client", "//kbroker/test/dash/Pings", "//kbroker/test/dash/Ping"
HELD, STALE = "//kbroker/test/dash/Held", "//kbroker/test/dash/Stale"
QUEUES = {"DashClientQueue", "DashHeldQueue", "DashStaleQueue"}
CHARTS = ("backlog", "throughput", "stale", "age")
CHROMIUM = os.environ.get("KBROKER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Where the stale test writes its screenshot of the page: its tmp dir, unless this names a file
# (the README's docs/dashboard.png is one, taken so once and copied by hand).
SCREENSHOT = os.environ.get("KBROKER_DASHBOARD_SCREENSHOT")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, under Playwright (never `playwright install`)."""
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"no {CHROMIUM}: scripts/prereqs.sh installs Debian's chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def start_worker(bootstrap: str, ns: str, tmp: Path) -> Worker:
    apply_paths(bootstrap, ns, [CATALOG])
    w = Worker(bootstrap, ns, tmp)
    try:
        w.wait_ready()
    except BaseException:
        w.stop()
        raise
    return w


@pytest.fixture(scope="module")
def dash_worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Worker]]:
    """A worker of a fresh namespace with tests/data/dashboard.yaml applied."""
    ns = "d" + uuid.uuid4().hex[:10]
    w = start_worker(kafka_bootstrap, ns, tmp_path_factory.mktemp("dashboard"))
    try:
        yield ns, w
    finally:
        w.stop()


def open_dashboard(browser: Any, url: str) -> tuple[Any, list[str]]:
    """A new page on the worker's dashboard, once its first snapshot arrived; and the list the
    page's uncaught script errors go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url + "/dashboard", wait_until="load")
    page.wait_for_function("() => window.kbrokerDashboard && window.kbrokerDashboard.snapshots > 0", timeout=30_000)
    return page, errors


def wait_page(page: Any, expression: str, arg: Any, timeout: float, what: str) -> Any:
    """The first truthy value of the JS function `expression(arg)` in the page, polled every 200 ms."""
    try:
        return page.wait_for_function(expression, arg=arg, timeout=timeout * 1000, polling=200).json_value()
    except Exception as exc:  # Playwright's TimeoutError: say what was awaited, and what the page had
        last = page.evaluate("(q) => window.kbrokerDashboard.last(q)", arg[0] if isinstance(arg, list) else arg)
        raise AssertionError(f"the dashboard did not show {what} in {timeout:g} s; it had {last}") from exc


def backlog_shown(page: Any, queue: str, n: int, timeout: float) -> None:
    """Wait until both the data and the queue's backlog chart show `n` as the newest backlog."""
    wait_page(
        page,
        """([q, n]) => {
        const d = window.kbrokerDashboard, last = d.last(q), plotted = d.plotted(q, "backlog");
        return last && last.backlog === n && plotted && plotted[1] === n;
    }""",
        [queue, n],
        timeout,
        f"a backlog of {n} on {queue}",
    )


def send_pings(broker: Broker, service: str, conversations: int, per_conversation: int) -> int:
    with broker.transaction() as tx:
        for c in range(conversations):
            h = tx.begin_dialog(CLIENT, service, PINGS)
            for i in range(per_conversation):
                tx.send(h, PING, {"c": c, "i": i})
    return conversations * per_conversation


def test_the_dashboard_charts_the_queues_as_messages_come_and_go(dash_worker, kafka_bootstrap, browser, tmp_path):
    ns, w = dash_worker
    started = time.monotonic()
    page, errors = open_dashboard(browser, w.url)
    loaded = time.monotonic() - started

    # Every queue of the catalog has its card, with its four charts drawn (uPlot canvases).
    wait_page(
        page,
        "(qs) => qs.every((q) => window.kbrokerDashboard.queues().includes(q))",
        sorted(QUEUES),
        20,
        "every queue of the catalog",
    )
    for queue in QUEUES:
        card = page.locator(f'.queue-card[data-queue="{queue}"]')
        assert card.locator("h3").inner_text() == queue
        assert sorted(card.locator(".chart").evaluate_all("(es) => es.map((e) => e.dataset.chart)")) == sorted(CHARTS)
        assert card.locator(".chart canvas").count() == len(CHARTS)
    assert page.locator("#namespace").inner_text() == ns and page.locator("#worker").inner_text() == w.id
    assert page.evaluate("() => window.kbrokerDashboard.connected") is True

    # The activated queue's monitor: its row in the table, and an empty backlog on its chart.
    wait_page(
        page,
        "(q) => { const l = window.kbrokerDashboard.last(q); return l && l.monitor_state; }",
        "DashHeldQueue",
        60,
        "the monitor of DashHeldQueue",
    )
    backlog_shown(page, "DashHeldQueue", 0, 30)
    assert page.locator('#monitors tr[data-queue="DashHeldQueue"]').count() == 1

    # Sent: the backlog rises on the chart (the stub procedure never RECEIVEs, so it stays).
    with Broker(kafka_bootstrap, ns) as client:
        t_sent = time.monotonic()
        sent = send_pings(client, HELD, conversations=6, per_conversation=5)
        backlog_shown(page, "DashHeldQueue", sent, 30)
        rise_s = time.monotonic() - t_sent
        state = page.evaluate("() => window.kbrokerDashboard.last('DashHeldQueue')")
        assert state["monitor_state"] in ("NOTIFIED", "RECEIVES_OCCURRING"), state
        assert state["backlog_source"] in ("monitor", "analytics"), state
        row = page.locator('#monitors tr[data-queue="DashHeldQueue"] td').all_inner_texts()
        assert row[0] == "DashHeldQueue" and row[2] == state["monitor_state"] and row[5] == str(sent), row

        # Received (by the test, a transaction each): the backlog falls back to 0.
        got = 0
        while got < sent:
            msgs = client.receive("DashHeldQueue", top=100, wait=10)
            assert msgs, f"only {got} of {sent} came back"
            got += len(msgs)
        t_received = time.monotonic()
        backlog_shown(page, "DashHeldQueue", 0, 30)
        fall_s = time.monotonic() - t_received

    # The history the charts plot went up and came down again.
    history = page.evaluate("() => window.kbrokerDashboard.history['DashHeldQueue'].backlog")
    assert max(h for h in history if h is not None) == sent and history[-1] == 0
    assert errors == [], errors
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)

    # The same snapshot as JSON, with every field the stream carries.
    snap = httpx.get(w.url + "/dashboard/snapshot", timeout=10).json()
    assert snap["namespace"] == ns and set(snap["queues"]) >= QUEUES
    assert set(snap["queues"]["DashHeldQueue"]) >= {
        "backlog",
        "arrivals_per_s",
        "receives_per_s",
        "stale_10s",
        "stale_60s",
        "stale_queue",
        "oldest_age_s",
        "monitor_state",
        "readers",
    }
    # Assets come from the package, and only its static files.
    assert httpx.get(w.url + "/dashboard/static/uPlot.iife.min.js", timeout=10).status_code == 200
    assert httpx.get(w.url + "/dashboard/static/..%2Fapp.py", timeout=10).status_code == 404
    page.close()
    print(
        f"\ndashboard: loaded in {loaded:.1f} s; backlog {sent} shown {rise_s:.1f} s after the send, "
        f"0 shown {fall_s:.1f} s after the last receive; screenshot {shot}"
    )


def test_the_stream_sends_a_snapshot_every_second(dash_worker):
    _, w = dash_worker
    snaps: list[dict] = []
    started = time.monotonic()
    with httpx.stream("GET", w.url + "/dashboard/stream", timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                snap = orjson.loads(line[len("data: ") :])
                if not snaps and not set(snap["queues"]) >= QUEUES:
                    # A worker just started on a busy machine may not have read its catalog yet:
                    # what is measured is the cadence from the first full snapshot on.
                    assert time.monotonic() - started < 30, snap["queues"]
                    continue
                if not snaps:
                    started = time.monotonic()
                snaps.append(snap)
                if len(snaps) == 6:
                    break
    took = time.monotonic() - started
    # The current snapshot at once, then one a second (their times a second apart, give or take
    # a loaded machine's scheduling).
    gaps = [b["at"] - a["at"] for a, b in zip(snaps, snaps[1:])]
    assert all(0.7 <= g <= 1.6 for g in gaps), gaps
    assert 3.5 <= took <= 8, took  # five gaps after the first
    assert all(set(s["queues"]) >= QUEUES for s in snaps)


@pytest.mark.long  # 30 s of Spark triggers: `make test-long`
def test_stale_counts_rise_for_messages_left_past_stale_after(
    start_analytics, kafka_bootstrap, browser, tmp_path_factory
):
    """With the analytics job running (Spark, the conftest's `start_analytics`): the job's backlog
    and arrivals of a queue without activation appear on its charts; messages left unreceived on
    it (`stale_after: 3`) show on its stale chart once older than 3 s; received, they leave it."""
    ns = "s" + uuid.uuid4().hex[:10]
    w = start_worker(kafka_bootstrap, ns, tmp_path_factory.mktemp("dashboard-stale"))
    queue = "DashStaleQueue"
    try:
        start_analytics(ns)
        page, errors = open_dashboard(browser, w.url)
        wait_page(page, "(q) => window.kbrokerDashboard.queues().includes(q)", queue, 30, f"the {queue} card")
        analytics_backlog = """([q, n]) => { const l = window.kbrokerDashboard.last(q);
            return l && l.backlog_source === "analytics" && l.backlog === n && l.stale_after_s === 3; }"""
        with Broker(kafka_bootstrap, ns) as client:
            # Two bursts a few seconds apart: the backlog steps up on the chart.
            first = send_pings(client, STALE, conversations=2, per_conversation=3)
            wait_page(page, analytics_backlog, [queue, first], 120, f"the analytics job's backlog of {first}")
            time.sleep(2)
            sent = first + send_pings(client, STALE, conversations=2, per_conversation=3)
            t_sent = time.monotonic()
            wait_page(page, analytics_backlog, [queue, sent], 60, f"the analytics job's backlog of {sent}")
            wait_page(
                page,
                "(q) => window.kbrokerDashboard.history[q].arrivals_per_s.some((v) => v > 0)",
                queue,
                30,
                "arrivals per second above 0",
            )
            # Past stale_after (3 s): all of them stale, on the chart too.
            wait_page(
                page,
                """([q, n]) => {
                const l = window.kbrokerDashboard.last(q), p = window.kbrokerDashboard.plotted(q, "stale");
                return l && l.stale_queue === n && p && p[3] === n && l.oldest_age_s >= 3;
            }""",
                [queue, sent],
                60,
                f"{sent} stale messages",
            )
            stale_s = time.monotonic() - t_sent
            assert stale_s >= 3, f"all {sent} stale {stale_s:.1f} s after the last send; stale_after is 3 s"
            # Received, half and then the rest (top=3: one conversation group each): the backlog
            # and the stale count step down, and the receives show on the throughput chart.
            for left in (sent // 2, 0):
                got = 0
                while got < sent // 2:
                    msgs = client.receive(queue, top=3, wait=10)
                    assert msgs, f"only {got} of {sent // 2} came back"
                    got += len(msgs)
                wait_page(
                    page,
                    """([q, n]) => { const l = window.kbrokerDashboard.last(q);
                    return l && l.backlog === n && l.stale_queue === n; }""",
                    [queue, left],
                    60,
                    f"a backlog of {left}, all stale",
                )
                time.sleep(2)
            wait_page(
                page,
                "(q) => window.kbrokerDashboard.history[q].receives_per_s.some((v) => v > 0)",
                queue,
                30,
                "receives per second above 0",
            )
        history = page.evaluate("(q) => window.kbrokerDashboard.history[q]", queue)
        assert max(v for v in history["stale_queue"] if v is not None) == sent
        assert errors == [], errors
        shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path_factory.mktemp("shot") / "dashboard-stale.png"
        page.screenshot(path=str(shot), full_page=True)
        page.close()
        print(
            f"\ndashboard: {sent} messages shown stale {stale_s:.1f} s after the last send (stale_after 3 s); "
            f"screenshot {shot}"
        )
    finally:
        w.stop()
