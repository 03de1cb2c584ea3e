"""The worker's live dashboard, on its HTTP API:

    GET /dashboard               the page: per queue, charts of the backlog, arrivals and receives
                                 per second, stale messages and the oldest message's age; a table
                                 of the queue monitors and one of this worker's activated readers
    GET /dashboard/static/<file> its script, style sheet and charting library (uPlot, MIT), served
                                 from the package: no CDN
    GET /dashboard/stream        server-sent events: one snapshot a second
    GET /dashboard/snapshot      one snapshot, as JSON

The snapshots, what they hold and how they are built, are worker/web/feed.py's (`DashboardFeed`);
this module serves them.
"""

from __future__ import annotations

import asyncio
import mimetypes
import time
from pathlib import Path
from typing import Any

import orjson

from kbroker.worker.web.feed import DashboardFeed

__all__ = ["KEEPALIVE_S", "PAGE", "STATIC", "add_dashboard"]

STATIC = Path(__file__).resolve().parent / "static"
PAGE = "dashboard.html"
KEEPALIVE_S = 15.0  # an SSE comment this often when no new snapshot came (finds closed clients)


def _static_files() -> dict[str, tuple[Path, str]]:
    """The files the page may ask for, by name: nothing outside the package's static folder."""
    files = {}
    for p in STATIC.iterdir():
        if p.is_file():
            ctype = mimetypes.guess_type(p.name)[0] or "application/octet-stream"
            if p.suffix == ".LICENSE":
                ctype = "text/plain"
            files[p.name] = (p, ctype)
    return files


def add_dashboard(app: Any, feed: DashboardFeed) -> None:
    """Register the dashboard's pages on the worker's Faust app, and the task that starts `feed`
    with the worker (whoever made the feed closes it: `Worker.close`)."""
    from aiohttp import web as aioweb

    files = _static_files()
    closing = asyncio.Event()  # set when the web server shuts down: open streams end

    async def on_web_shutdown(_web_app: Any) -> None:
        closing.set()

    # aiohttp waits up to a minute for open handlers when the server stops; a stream ends at once.
    app.web.web_app.on_shutdown.append(on_web_shutdown)

    # Registered by calling Faust's decorators (app.task, app.page): they are untyped, and a
    # decorated handler would be untyped with them.
    async def start_dashboard_feed() -> None:
        feed.start()

    app.task(start_dashboard_feed)

    async def page(web: Any, request: Any) -> Any:
        return web.html((STATIC / PAGE).read_text(encoding="utf-8"), headers={"Cache-Control": "no-cache"})

    app.page("/dashboard", name="dashboard")(page)
    app.page("/dashboard/", name="dashboard_slash")(page)

    async def static(web: Any, request: Any, file: str) -> Any:
        found = files.get(file)
        if found is None:
            return web.text(f"no such file: {file}\n", status=404)
        path, ctype = found
        return web.bytes(
            await asyncio.to_thread(path.read_bytes), content_type=ctype, headers={"Cache-Control": "max-age=300"}
        )

    app.page("/dashboard/static/{file}", name="dashboard_static")(static)

    async def snapshot(web: Any, request: Any) -> Any:
        return web.json(await asyncio.to_thread(feed.fresh_snapshot))

    app.page("/dashboard/snapshot", name="dashboard_snapshot")(snapshot)

    async def stream(web: Any, request: Any) -> Any:
        feed.watch()
        resp = aioweb.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await resp.prepare(request)
        sent: dict[str, Any] | None = None
        quiet_since = time.monotonic()
        try:
            await resp.write(b"retry: 2000\n\n")
            while not closing.is_set():
                feed.watch()
                snap = feed.snapshot()
                if snap is not sent:
                    await resp.write(b"data: " + orjson.dumps(snap) + b"\n\n")
                    sent, quiet_since = snap, time.monotonic()
                elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                    await resp.write(b": keepalive\n\n")
                    quiet_since = time.monotonic()
                try:
                    await asyncio.wait_for(closing.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass
        except (ConnectionError, RuntimeError):  # the browser went away (RuntimeError: transport closed)
            pass
        return resp

    app.page("/dashboard/stream", name="dashboard_stream")(stream)
