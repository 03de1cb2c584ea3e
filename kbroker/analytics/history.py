"""Closed windows to Parquet: one directory per window (`window_start=<ms>`, a partition column to
Spark), overwritten as a whole, so a window written again after a crash is still one row per queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

SCHEMA = StructType(
    [
        StructField("namespace", StringType()),
        StructField("queue", StringType()),
        StructField("window_end", LongType()),
        StructField("window_s", DoubleType()),
        StructField("arrivals", LongType()),
        StructField("receives", LongType()),
        StructField("backlog", LongType()),
        StructField("oldest_unreceived_age_s", DoubleType()),
        StructField("stale_10s", LongType()),
        StructField("stale_60s", LongType()),
        StructField("stale_queue", LongType()),
        StructField("stale_after_s", DoubleType()),
        StructField("top_groups", StringType()),
        StructField("as_of", LongType()),
    ]
)


def history_row(w: dict[str, Any]) -> tuple[Any, ...]:
    age = w["oldest_unreceived_age_s"]
    return (
        w["namespace"],
        w["queue"],
        int(w["window_end"]),
        float(w["window_s"]),
        w["arrivals"],
        w["receives"],
        w["backlog"],
        None if age is None else float(age),
        w["stale"]["dispatcher_10s"],
        w["stale"]["forwarder_60s"],
        w["stale"]["queue"],
        float(w["stale_after_s"]),
        orjson.dumps(w["top_groups"]).decode(),
        int(w["as_of"]),
    )


def write_closed_windows(spark: Any, history: Path, closed: list[dict[str, Any]]) -> None:
    by_window: dict[int, list[tuple[Any, ...]]] = {}
    for w in closed:
        by_window.setdefault(int(w["window_start"]), []).append(history_row(w))
    for start, rows in sorted(by_window.items()):
        path = str(Path(history) / "queue_windows" / f"window_start={start}")
        spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("overwrite").parquet(path)
