"""The readers topic's records (each process's report of a queue topic it reads, for `kbroker
queue show`) decoded, or rejected (core/rejected.py)."""

from __future__ import annotations

from typing import Any

from kbroker.core.rejected import Rejected, json_object

# The fields the view shows, and the JSON types each must have.
FIELDS: dict[str, tuple[type, ...]] = {
    "topic": (str,),
    "process": (str,),
    "at": (int, float),
    "partitions": (list,),
    "buffered": (int,),
    "ready_groups": (int,),
    "locked_groups": (int,),
    "in_flight": (int,),
    "paused": (bool, list, int),
}
# Fields an older process's report lacks: absent is None.
OPTIONAL: dict[str, tuple[type, ...]] = {"oldest_lock_at": (int, float, type(None))}


def reader_report(raw: bytes | None) -> dict[str, Any]:
    """A report with every field the view shows, of its type; else Rejected."""
    report = json_object(raw)
    for name, types in FIELDS.items():
        if name not in report:
            raise Rejected(f"a reader report needs {name!r}")
        v = report[name]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise Rejected(f"a reader report's {name!r} is {type(v).__name__}")
    for name, types in OPTIONAL.items():
        v = report.setdefault(name, None)
        if not isinstance(v, types) or isinstance(v, bool):
            raise Rejected(f"a reader report's {name!r} is {type(v).__name__}")
    return report
