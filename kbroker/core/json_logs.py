"""Structured logs (`--log-format json`): one JSON object a line, for a log shipper to index
without parsing text.

Each line has the time (ISO 8601, UTC, milliseconds), the level, the logger and the message as
written, the process's own fields (the namespace, the worker's id), and the fields a line is
about where it names them: kbroker's log lines say `queue=Orders dialog=...` for what a reader
searches by, so those `key=value` pairs are copied out as fields (only the keys in FIELDS, so
the set of keys stays small), and so is anything passed as `extra={...}` under those keys. A
line with an exception carries its traceback as one `exception` field, not as more lines.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from typing import Any

import orjson

# What a line may be about, as its fields: the names kbroker's log lines use.
FIELDS = (
    "namespace",
    "queue",
    "conversation",
    "conversation_id",
    "dialog",
    "group",
    "worker",
    "topic",
    "partition",
    "destination",
    "procedure",
    "generation",
    "batch",
    "component",
)
_PAIR = re.compile(r"\b(" + "|".join(FIELDS) + r")=([^\s,;()]+)")


class JsonFormatter(logging.Formatter):
    """Formats each record as one JSON object (see the module); `fixed` fields go on every line."""

    def __init__(self, **fixed: Any):
        super().__init__()
        self.fixed = {k: v for k, v in fixed.items() if v is not None}

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
            **self.fixed,
        }
        for key, value in _PAIR.findall(message):
            line.setdefault(key, value)
        for key in FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return orjson.dumps(line, default=str).decode()


def use_json_logs(**fixed: Any) -> None:
    """Format every handler of the root logger as JSON lines (called again after a framework
    replaced the handlers: Faust does at its start)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter(**fixed))
