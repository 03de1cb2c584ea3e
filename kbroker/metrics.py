"""kbroker's Prometheus metrics: every family in one place, named and labelled in Prometheus's
conventions (a `kbroker_` prefix, base units, `_total` on counters). Each process counts what it
does itself, in prometheus_client's default registry: the worker serves it on `/metrics`, any
other process (an SDK or transport application) with `serve_metrics` (kbroker/sdk/metrics.py).

Labels stay bounded: a namespace, a queue, a destination and an outcome, all named in a catalog
or here; never a conversation, a message or a process id. The worker's gauges that describe
state rather than count events (readers running, monitor states) are collected when scraped
(worker/web/metrics.py), so nothing has to keep them current between scrapes.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def of(family: Any, *labels: str) -> Any:
    """`family.labels(*labels)`, looked up once: prometheus_client's labels() costs about 3 us a
    call, a third of the metrics' cost per transaction (measured in docs/benchmarks.md). The
    label values are bounded (see above), so this map is too."""
    key = (id(family), labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = family.labels(*labels)
    return child


# Seconds, from a local commit (a few ms) to a transaction held up by a slow broker (seconds).
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

MESSAGES_SENT = Counter(
    "kbroker_messages_sent_total",
    'Messages SENT in committed transactions, per queue they go to ("" for a routed message: '
    "another namespace's queue).",
    ["namespace", "queue"],
)
MESSAGES_RECEIVED = Counter(
    "kbroker_messages_received_total", "Messages RECEIVEd by committed transactions, per queue.", ["namespace", "queue"]
)
TRANSACTIONS = Counter(
    "kbroker_transactions_total",
    "Transactions ended, by outcome: committed, aborted (Kafka aborted it), in_doubt (the outcome "
    "could not be learnt), rolled_back (ROLLBACK or an exception in the block).",
    ["namespace", "outcome"],
)
ROLLBACKS = Counter(
    "kbroker_rollbacks_total",
    "Rollbacks of transactions that had RECEIVEd from the queue (the poison-message count's input).",
    ["namespace", "queue"],
)
COMMIT_SECONDS = Histogram(
    "kbroker_commit_seconds",
    "COMMIT's latency as the application sees it: the wait for the group commit and its Kafka transaction.",
    ["namespace"],
    buckets=LATENCY_BUCKETS,
)
KAFKA_TRANSACTION_SECONDS = Histogram(
    "kbroker_kafka_transaction_seconds",
    "One group commit's Kafka transaction, from its first record to its end (committed or not).",
    ["namespace"],
    buckets=LATENCY_BUCKETS,
)
OFFSET_COMMIT_SECONDS = Histogram(
    "kbroker_offset_commit_seconds",
    "One group commit that wrote nothing: the queue consumer's offset commit, no Kafka transaction.",
    ["namespace"],
    buckets=LATENCY_BUCKETS,
)
GROUP_COMMIT_SIZE = Histogram(
    "kbroker_group_commit_transactions",
    "kbroker transactions committed together in one Kafka transaction.",
    ["namespace"],
    buckets=SIZE_BUCKETS,
)
ACTIVATIONS = Counter(
    "kbroker_activations_total",
    "Readers the queue monitors started (internal activation) or asked an external activator for.",
    ["namespace", "queue", "kind"],
)
DEAD_LETTERS = Counter(
    "kbroker_dead_letters_total",
    "Records moved to the dead-letter topic, by reason (malformed: not a message of the queue; poison: "
    "a transport message that failed its handler too often) and by what the dead letter kept (copy; "
    "without body or event only: Kafka refused the copy, see RECORD_SET_ASIDE).",
    ["namespace", "queue", "reason", "kept"],
)
POISON_DISABLES = Counter(
    "kbroker_poison_disables_total",
    "Queues disabled after five rollbacks in a row (poison-message handling).",
    ["namespace", "queue"],
)
TRANSMISSIONS = Counter(
    "kbroker_transmissions_total",
    "Routed messages by what happened to them at this side's transmitter: sent (each attempt), "
    "acknowledged (the far side saved them), refused (the far side refused their dialog).",
    ["namespace", "destination", "outcome"],
)
DISPATCHED = Counter(
    "kbroker_dispatched_total",
    "Inbound routed messages by what this side's dispatcher did: saved, duplicates (copies already "
    "saved), refused, kept (set aside: not a valid message), dropped (out of order, swept; sent again).",
    ["namespace", "outcome"],
)

# The analytics job's (`kbroker analytics run --metrics-port`): its pace, and the queue figures it
# measures for every queue (the worker's monitors count only activated ones).
ANALYTICS_BATCH_SECONDS = Histogram(
    "kbroker_analytics_batch_seconds",
    "One micro-batch of the analytics job, from its rows to its results written.",
    ["namespace"],
    buckets=LATENCY_BUCKETS,
)
ANALYTICS_ROWS = Counter("kbroker_analytics_rows_total", "Records the analytics job read.", ["namespace"])
ANALYTICS_DELAY = Gauge(
    "kbroker_analytics_delay_seconds",
    "How far the analytics job's figures are behind: now minus the time of the newest record its last batch read.",
    ["namespace"],
)
ANALYTICS_BACKLOG = Gauge(
    "kbroker_analytics_queue_backlog_messages",
    "Unreceived messages per queue, as the analytics job measured them.",
    ["namespace", "queue"],
)
ANALYTICS_OLDEST = Gauge(
    "kbroker_analytics_queue_oldest_unreceived_seconds",
    "Age of the oldest unreceived message per queue, as the analytics job measured it (0 when none waits).",
    ["namespace", "queue"],
)
ANALYTICS_STALE = Gauge(
    "kbroker_analytics_queue_stale_messages",
    "Unreceived messages older than a threshold per queue: dispatcher_10s, forwarder_60s, or the queue's own.",
    ["namespace", "queue", "threshold"],
)
ACTIVATOR_EVENTS = Counter(
    "kbroker_activator_events_total",
    "The external activator's events, as its log lines name them (start, exit, notification, ...).",
    ["namespace", "queue", "event"],
)
