"""Fencing transactional ids: what ends another process's open Kafka transaction at once.

A producer that initialises a transactional id bumps its epoch: the coordinator aborts the
open transaction the id left (or completes one already prepared to commit), and the earlier
producer can commit nothing more. Used by a SEND lease taken over from a process that ran out of
time (kafka/dialogs/send_leases.py) and by a partition's next owner when a dead reader's group commit left
its offsets held (kafka/receive/open_transaction_fence.py).
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException, Producer

from kbroker.core.cluster import ClusterLike
from kbroker.kafka.clients import base
from kbroker.kafka.txn.guarded import reason

log = logging.getLogger("kbroker.fencing")

FENCE_TIMEOUT = 30.0  # seconds per transactional id, by default


def fence(cluster: ClusterLike, transactional_ids: tuple[str, ...], timeout: float = FENCE_TIMEOUT) -> None:
    """Fence each transactional id (within `timeout` seconds each): its open transaction is
    aborted and its producer can commit nothing more (a live one gets a new epoch the next time
    it starts)."""
    for tid in transactional_ids:
        producer = Producer(base(cluster, **{"transactional.id": tid, "enable.idempotence": True}))
        try:
            producer.init_transactions(timeout)
        except KafkaException as exc:
            log.warning("transactional id %s was not fenced (%s)", tid, reason(exc))
        finally:
            producer.flush(0)
