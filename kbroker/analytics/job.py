"""The analytics job (docs/analytics.md): one Structured Streaming query over the namespace's queue,
progress, timer and dead-letter topics, read with Spark's Kafka source. Spark reads and projects
each micro-batch; the pure state (core/analytics/queue_analytics.py) turns it into records; the Kafka layer
writes them in one transaction; closed windows go to Parquet. This module is the query's lifecycle
(start, one micro-batch, stop; run_forever restarts it); rows.py turns Spark's rows into the
state's inputs, failures.py reads a failure's text and asks a failed batch step again."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kbroker import metrics
from kbroker.analytics.failures import again_on_failure, first_line, refusal_in
from kbroker.analytics.rows import PROJECTION, apply_rows, collect, read_positions
from kbroker.analytics.session import spark_session
from kbroker.analytics.state_files import StateFiles
from kbroker.core import names
from kbroker.core.analytics.queue_analytics import Analytics
from kbroker.core.cluster import Cluster
from kbroker.core.log_limit import LogLimiter, RateLimitFilter
from kbroker.core.rejected import Consumed
from kbroker.errors import BrokerUnavailableError, InvalidArgumentError, PermissionDeniedError
from kbroker.kafka.analytics.results import ResultsWriter
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.kafka.clients import principal, spark_java_options, spark_options
from kbroker.kafka.rejects import Rejects
from kbroker.kafka.snapshot import check_read

# refusal_in stays importable from here (the query's failure() and run_forever use it).
__all__ = ["CATALOG_EVERY", "AnalyticsJob", "JobSettings", "JobStopping", "measured", "refusal_in", "run_forever"]

log = logging.getLogger("kbroker.analytics")
CATALOG_EVERY = 10.0  # seconds between reads of the queues' stale_after


class JobStopping(RuntimeError):
    """A batch started while the job stops: left for the next start."""


@dataclass
class JobSettings:
    cluster: Cluster  # a bootstrap string is taken as a cluster with no further settings
    namespace: str
    master: str = "local[*]"
    checkpoint: Path = Path("analytics-checkpoint")
    history: Path = Path("analytics-history")
    trigger: float = 2.0
    window: float = 60.0
    stale_after: float = 30.0
    top: int = 5
    max_per_batch: int = 20000
    spark_conf: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cluster = Cluster.of(self.cluster)
        for what, path in (("checkpoint", self.checkpoint), ("history", self.history)):
            if _URL.match(str(path)):  # a Path folds s3a://b/x to s3a:/b/x: a directory of that name
                raise InvalidArgumentError(
                    f"--{what} {path}: a path on a filesystem the driver mounts (a shared "
                    "one on a cluster), not a URL (docs/analytics.md)"
                )


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


class AnalyticsJob:
    """The query, started in `spark` (a new session when None). `batches` counts what it did."""

    def __init__(self, settings: JobSettings, spark: Any = None):
        self.s = settings
        self.spark = spark
        self.query: Any = None
        self.state: Analytics | None = None
        # One job reads the progress topic: it records a row that is not a snapshot (a batch
        # Spark runs again after a restart may record it again).
        self.rejects = Rejects(settings.cluster, settings.namespace, "analytics job")
        self.state_batch = -1
        self.files = StateFiles(Path(settings.checkpoint) / "kbroker-state")
        self.writer: ResultsWriter | None = None
        self.batches = 0
        self.rows = 0
        self.last_batch: dict[str, Any] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=1000)  # the newest batches' figures (the bench's)
        self._stale_read = 0.0
        self._stale_after: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def check_access(self) -> None:
        """PermissionDeniedError now, naming what is refused, when the principal may not run
        the job: Spark's pattern source shows topics it may not read as no topics at all, and the
        results' transactional id would be refused only at the first batch."""
        self._results().check()
        check_read(
            self.s.cluster, names.analytics_source_groups(self.s.namespace), names.progress_topic(self.s.namespace)
        )

    def failure(self) -> BaseException | None:
        """Why the query stopped, typed when the authorizer refused it (refusal_in), else
        Spark's exception; None while it runs."""
        if self.query is None or self.query.isActive:
            return None
        error = self.query.exception()
        return refusal_in(error, principal(self.s.cluster)) or error

    def start(self) -> "AnalyticsJob":
        self.check_access()
        self._results().hold_unread()
        if self.spark is None:
            self.spark = spark_session(
                self.s.master, self.s.spark_conf, say=log.info, java_options=spark_java_options(self.s.cluster)
            )
        ns = re.escape(names.prefix(self.s.namespace))
        pattern = f"{ns}(queue\\..+|progress|timers|deadletter)"
        reader = (
            self.spark.readStream.format("kafka")
            .options(**spark_options(self.s.cluster))
            .option("groupIdPrefix", names.analytics_source_groups(self.s.namespace))
            .option("subscribePattern", pattern)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "false")  # the worker reclaims received records
            .option("kafka.isolation.level", "read_committed")  # never an aborted SEND
            .option("kafka.metadata.max.age.ms", "5000")  # a new queue is read within seconds
            .option("maxOffsetsPerTrigger", str(self.s.max_per_batch))
        )
        # The headers as one map per record, looked up by name (LAST_WIN: a repeated header
        # keeps its last value, as kbroker's own decoding does).
        self.spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        frame = reader.load().selectExpr("*", "map_from_entries(headers) AS hs").selectExpr(*PROJECTION)
        self.query = (
            frame.writeStream.foreachBatch(self._batch)
            .option("checkpointLocation", str(Path(self.s.checkpoint) / "query"))
            .queryName(f"kbroker_analytics_{self.s.namespace}")
            .trigger(processingTime=f"{self.s.trigger} seconds")
            .start()
        )
        return self

    def stop(self) -> None:
        """Stop between batches: a batch under way finishes (its results, history and state
        written) and the next one is refused, so nothing is interrupted half-way."""
        if self._stopping.is_set():
            return  # stopped already
        self._stopping.set()
        with self._lock:
            pass
        if self.query is not None:
            self.query.stop()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.rejects.close()

    # --- one micro-batch ----------------------------------------------------------------------

    def _batch(self, frame: Any, batch_id: int) -> None:
        started, wall = time.monotonic(), time.time()
        if self._stopping.is_set():  # not committed by Spark: the next start runs it again
            raise JobStopping(f"batch {batch_id} refused: the job is stopping")
        rows = again_on_failure("reading its rows to the driver", lambda: collect(frame), batch_id, self._stopping)
        with self._lock:
            state = self._state_for(batch_id)
            state.stale_after = self._queue_thresholds()
            for row, reason in apply_rows(state, self.s.namespace, rows):
                self.rejects.reject(Consumed(row.topic, row.partition, row.offset, row.key, row.value), reason)
            out = state.report(batch_id)
            writer, positions = self._results(), read_positions(rows, self.s.namespace, self._read_before())
            again_on_failure(
                "writing its results",
                lambda: writer.write(out.analytics, out.commands, positions),
                batch_id,
                self._stopping,
                retriable=(BrokerUnavailableError,),
            )
            if out.closed:
                self._history(out.closed)
            self.files.save(batch_id, state.to_dict())
            self.state_batch = batch_id
            self.batches += 1
            self.rows += len(rows)
            self.last_batch = {
                "batch": batch_id,
                "rows": len(rows),
                "records": len(out.analytics),
                "commands": len(out.commands),
                "closed": len(out.closed),
                "seconds": round(time.monotonic() - started, 3),
                "as_of": state.now,
                "started": wall,
            }
            self.recent.append(self.last_batch)
            measured(self.s.namespace, out.analytics, state.now, time.monotonic() - started, len(rows))
        log.info(
            "analytics batch=%d rows=%d records=%d commands=%d closed=%d seconds=%.2f",
            batch_id,
            len(rows),
            len(out.analytics),
            len(out.commands),
            len(out.closed),
            time.monotonic() - started,
        )

    def _results(self) -> ResultsWriter:
        if self.writer is None:
            self.writer = ResultsWriter(self.s.cluster, self.s.namespace)
        return self.writer

    def _read_before(self) -> dict[str, dict[str, int]]:
        """Where the previous batch ended, every partition the query reads ({topic: {partition:
        offset}}), from the query's progress; empty before the first."""
        try:
            progress = self.query.lastProgress if self.query is not None else None
            end = (progress or {}).get("sources", [{}])[0].get("endOffset")
            return orjson.loads(end) if isinstance(end, str) else (end or {})
        except Exception:  # noqa: BLE001 - only a hint for the reclaim: the rows still count
            return {}

    def _state_for(self, batch_id: int) -> Analytics:
        settings: dict[str, Any] = {"window_s": self.s.window, "stale_after_s": self.s.stale_after, "top": self.s.top}
        if self.state is None or self.state_batch != batch_id - 1:
            saved = self.files.load_before(batch_id)
            self.state = (
                Analytics.from_dict(saved[1], self.s.namespace, **settings)
                if saved
                else Analytics(self.s.namespace, **settings)
            )
            self.state_batch = saved[0] if saved else -1
        return self.state

    def _queue_thresholds(self) -> dict[str, float]:
        if time.monotonic() - self._stale_read >= CATALOG_EVERY:
            try:
                catalog = read_catalog(self.s.cluster, self.s.namespace, 10.0)
                self._stale_after = {
                    q.name: q.stale_after for q in catalog.queues.values() if q.stale_after is not None
                }
                self._stale_read = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the last thresholds stand until it answers
                log.warning("reading the catalog's stale_after failed (%s); the last ones stand", exc)
        return dict(self._stale_after)

    def _history(self, closed: list[dict[str, Any]]) -> None:
        from kbroker.analytics.history import write_closed_windows

        write_closed_windows(self.spark, Path(self.s.history), closed)


def measured(
    namespace: str, analytics: list[tuple[str, dict[str, Any]]], as_of: int, seconds: float, rows: int
) -> None:
    """One batch's metrics (kbroker/metrics.py): its time and rows, how far behind it is, and each
    queue's gauges from the current window's record (the newest of the queue in the batch)."""
    metrics.of(metrics.ANALYTICS_BATCH_SECONDS, namespace).observe(seconds)
    metrics.of(metrics.ANALYTICS_ROWS, namespace).inc(rows)
    if as_of:
        metrics.of(metrics.ANALYTICS_DELAY, namespace).set(max(0.0, time.time() - as_of / 1000))
    newest: dict[str, dict[str, Any]] = {}
    for _, value in analytics:
        if value.get("kind") == "queue_window" and value.get("backlog") is not None:
            queue = value["queue"]
            if queue not in newest or value["window_start"] >= newest[queue]["window_start"]:
                newest[queue] = value
    for queue, w in newest.items():
        metrics.of(metrics.ANALYTICS_BACKLOG, namespace, queue).set(w["backlog"])
        metrics.of(metrics.ANALYTICS_OLDEST, namespace, queue).set(w.get("oldest_unreceived_age_s") or 0)
        for threshold, count in (w.get("stale") or {}).items():
            metrics.of(metrics.ANALYTICS_STALE, namespace, queue, threshold).set(count)


def run_forever(settings: JobSettings) -> None:
    """`kbroker analytics run`: the job until SIGINT/SIGTERM. A query that fails (the broker away
    longer than Spark's Kafka client waits) is started again from its checkpoint, with back-off;
    the failure is logged once per minute, not per attempt."""
    import signal

    limit = RateLimitFilter(LogLimiter(window=60.0))
    log.addFilter(limit)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per call between Python and the JVM
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    spark, backoff = None, 1.0
    refused: PermissionDeniedError | None = None
    while not stopping.is_set() and refused is None:
        job = AnalyticsJob(settings, spark)
        try:
            job.start()
            spark = job.spark
            log.info(
                "analytics job started namespace=%s master=%s checkpoint=%s",
                settings.namespace,
                settings.master,
                settings.checkpoint,
            )
            while not stopping.is_set() and job.query.isActive:
                job.query.awaitTermination(1.0)
                backoff = 1.0 if job.batches else backoff
            failure = job.failure()
            refused = failure if isinstance(failure, PermissionDeniedError) else None
            if not stopping.is_set() and refused is None:
                log.error(
                    "analytics query stopped (%s); starting it again from its checkpoint",
                    first_line(job.query.exception()),
                )
        except Exception as exc:  # noqa: BLE001 - the broker may be away: try again
            refused = refusal_in(exc, principal(settings.cluster))
            if refused is None:
                log.error("analytics job failed (%s); starting it again from its checkpoint", first_line(exc))
        finally:
            job.stop()
        if refused is None:
            stopping.wait(backoff)
            backoff = min(60.0, backoff * 2)
    if spark is not None:
        spark.stop()
    if refused is not None:  # not retried: it stands until an operator grants the ACL
        raise refused
