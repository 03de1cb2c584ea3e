"""kbroker's Prometheus metrics: every family in one place, named and labelled in Prometheus's
conventions (a `kbroker_` prefix, base units, `_total` on counters). Each process counts what it
does itself, in prometheus_client's default registry: the worker serves it on `/metrics`, any
other process (an SDK or transport application) with `serve_metrics` (kbroker/sdk/metrics.py).

Labels stay bounded: a namespace, a queue, a destination and an outcome, all named in a catalog
or here; never a conversation, a message or a process id. The worker's gauges that describe
state rather than count events (readers running, monitor states) are collected when scraped
(worker/metrics.py), so nothing has to keep them current between scrapes.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# Seconds, from a local commit (a few ms) to a transaction held up by a slow broker (seconds).
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

MESSAGES_SENT = Counter(
    "kbroker_messages_sent_total",
    "Messages SENT in committed transactions (records on their way to a queue or a route).",
    ["namespace"])
MESSAGES_RECEIVED = Counter(
    "kbroker_messages_received_total",
    "Messages RECEIVEd by committed transactions, per queue.",
    ["namespace", "queue"])
TRANSACTIONS = Counter(
    "kbroker_transactions_total",
    "Transactions ended, by outcome: committed, aborted (Kafka aborted it), in_doubt (the outcome "
    "could not be learnt), rolled_back (ROLLBACK or an exception in the block).",
    ["namespace", "outcome"])
ROLLBACKS = Counter(
    "kbroker_rollbacks_total",
    "Rollbacks of transactions that had RECEIVEd from the queue (the poison-message count's input).",
    ["namespace", "queue"])
COMMIT_SECONDS = Histogram(
    "kbroker_commit_seconds",
    "COMMIT's latency as the application sees it: the wait for the group commit and its Kafka transaction.",
    ["namespace"], buckets=LATENCY_BUCKETS)
KAFKA_TRANSACTION_SECONDS = Histogram(
    "kbroker_kafka_transaction_seconds",
    "One group commit's Kafka transaction, from its first record to its end (committed or not).",
    ["namespace"], buckets=LATENCY_BUCKETS)
GROUP_COMMIT_SIZE = Histogram(
    "kbroker_group_commit_transactions",
    "kbroker transactions committed together in one Kafka transaction.",
    ["namespace"], buckets=SIZE_BUCKETS)
ACTIVATIONS = Counter(
    "kbroker_activations_total",
    "Readers the queue monitors started (internal activation) or asked an external activator for.",
    ["namespace", "queue", "kind"])
POISON_DISABLES = Counter(
    "kbroker_poison_disables_total",
    "Queues disabled after five rollbacks in a row (poison-message handling).",
    ["namespace", "queue"])
