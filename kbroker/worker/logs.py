"""The worker process's logging: the limit on repeated lines (installed on the handlers Faust
sets up, summarised once a tick) and Faust's logging set-up for JSON lines. Apart from
worker/app.py, which wires the worker's services: this is the process's output only."""

from __future__ import annotations

import logging
from typing import Any

from kbroker.core.json_logs import JsonFormatter
from kbroker.core.log_limit import RateLimitFilter
from kbroker.kafka.clients import KAFKA_LOG_LIMIT
from kbroker.worker.settings import WorkerSettings

log = logging.getLogger("kbroker.worker")

# Every line the worker process writes passes this filter (installed on the root logger's handlers
# once Faust has set them up): aiokafka and Faust report each failed connection attempt while a
# broker is down, so repeats are held back and summarised once per window. librdkafka's lines are
# limited on their own logger already (kafka/clients.py).
LOG_LIMIT = RateLimitFilter(always=("aiokafka",))


def install_log_limit() -> None:
    """Put LOG_LIMIT on every handler of the root logger that lacks it (Faust replaces them)."""
    for handler in logging.getLogger().handlers:
        if LOG_LIMIT not in handler.filters:
            handler.addFilter(LOG_LIMIT)


def write_log_summaries() -> None:
    """Once a tick: the counts of repeated lines held back in windows that have ended."""
    LOG_LIMIT.write_summaries(log)
    KAFKA_LOG_LIMIT.write_summaries(log)


def json_logging_config(s: WorkerSettings, loglevel: str) -> dict[str, Any]:
    """Faust's logging set-up (merged into its own) with JSON lines on its stream handler, so
    every line after its start is JSON too (core/json_logs.py)."""
    return {
        "merge": True,
        "version": 1,
        "formatters": {"json": {"()": JsonFormatter, "namespace": s.namespace, "worker": s.worker_id}},
        "handlers": {
            "default": {
                "level": loglevel.upper(),
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stdout",
            }
        },
    }
