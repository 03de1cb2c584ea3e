"""The worker's JSON pages on its HTTP API (the dashboard's are in dashboard.py):

GET /monitors/        the queue monitors' rows (views.py), read from the monitor table's changelog
GET /conversations/   sys.conversation_endpoints, kept in memory by an EndpointStore
GET /dialogs/         the dialogs the analytics job reclassified, the most recently told first
GET /tasks/           this worker's task handlers, activated readers and degraded reasons
GET /metrics          Prometheus's text format (metrics.py)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Self

import faust

from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore
from kbroker.kafka.queue_views import conversation_rows
from kbroker.worker.activation.handlers import TaskHandlers
from kbroker.worker.guard import Guard
from kbroker.worker.settings import WorkerSettings
from kbroker.worker.web.metrics import WorkerCollector, exposition, register

log = logging.getLogger("kbroker.worker")


class Pages:
    """The pages and the endpoint store behind /conversations/: start() reads it a first time
    (on a thread, before anyone asks for the view), close() closes it."""

    def __init__(
        self,
        s: WorkerSettings,
        handlers: TaskHandlers,
        guard: Guard,
        reclassified: dict[str, dict[str, Any]],
        monitors: Callable[[], Iterable[tuple[str, Any]]],
        routing: Callable[[], Any] = lambda: None,
    ):
        self.s, self.handlers, self.guard, self.reclassified = s, handlers, guard, reclassified

        def owned() -> list[tuple[str, dict[str, Any]]]:
            return [(q, m) for q, m in monitors() if isinstance(m, dict) and m.get("owner") == s.worker_id]

        def transmission() -> tuple[dict[str, tuple[int, float]], dict[str, str]] | None:
            transmitter = routing()
            return None if transmitter is None else (transmitter.backlog, transmitter.link_states)

        self._unregister = register(
            WorkerCollector(s.namespace, s.worker_id, owned, handlers.rows, handlers.size, transmission)
        )
        # sys.conversation_endpoints kept in memory (read-only, sequences as written): after the
        # first read, /conversations/ reads only what changed since, whatever the topic holds.
        self.conversations = EndpointStore(s.cluster, s.namespace, None, continue_sequences=False)

    def start(self) -> Self:
        asyncio.get_running_loop().run_in_executor(None, self._warm_conversations)
        return self

    def close(self) -> None:
        self._unregister()
        self.conversations.close()

    def _warm_conversations(self) -> None:
        """The first read of the endpoints topic, before anyone asks for the view."""
        try:
            self.conversations.all()
        except Exception as exc:  # noqa: BLE001 - the page reads again when asked
            log.warning("reading the conversation endpoints failed (%s); /conversations/ reads when asked", exc)

    def register(self, app: faust.App) -> None:
        """The pages, on the app's web server."""
        s, handlers, guard, conversations, reclassified = (
            self.s,
            self.handlers,
            self.guard,
            self.conversations,
            self.reclassified,
        )

        @app.page("/monitors/")
        async def monitors_page(web: Any, request: Any) -> Any:
            from kbroker.worker.web.views import monitor_rows

            return web.json(await asyncio.to_thread(monitor_rows, s.cluster, s.namespace))

        @app.page("/conversations/")
        async def conversations_page(web: Any, request: Any) -> Any:
            rows = await asyncio.to_thread(lambda: conversation_rows(conversations.all()))
            return web.json({"namespace": s.namespace, "worker": s.worker_id, "rows": rows, "as_of": time.time()})

        @app.page("/dialogs/")
        async def dialogs_page(web: Any, request: Any) -> Any:
            rows = sorted(reclassified.values(), key=lambda r: (r.get("queue") or "", r["conversation_id"], r["side"]))
            return web.json({"namespace": s.namespace, "worker": s.worker_id, "rows": rows, "as_of": time.time()})

        @app.page("/metrics")
        async def metrics_page(web: Any, request: Any) -> Any:
            body, content_type = exposition()  # its charset parameter: as a header (aiohttp refuses it apart)
            return web.bytes(body, headers={"Content-Type": content_type})

        @app.page("/tasks/")
        async def tasks_page(web: Any, request: Any) -> Any:
            return web.json(
                {
                    "worker": s.worker_id,
                    "handlers": handlers.size,
                    "waiting": handlers.waiting(),
                    "tasks": handlers.rows(),
                    **guard.health.snapshot(),
                    "as_of": time.time(),
                }
            )
