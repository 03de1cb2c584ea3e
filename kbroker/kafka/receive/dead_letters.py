"""Dead letters through the group committer, such that no record holds its partition.

A record a receiver cannot decode goes to the dead-letter topic with its offset, in one Kafka
transaction of the group committer. Should that fail, its offset stays open and the partition's
committed offset cannot pass it, so a dead letter is never just dropped:

- Kafka refused the copy for itself (too large for the dead-letter topic): the record is set
  aside (core/dead_letter.set_aside), its dead letter without the body and a RECORD_SET_ASIDE
  event, and if even that is refused, the event alone. Each commits the offset.
- the transaction failed for any other reason (the committer's other requests with it): the
  same dead letter is submitted again, unless the partition moved to another reader (it reads
  the record again), the reader or the committer is closing (the next reader does), or the
  outcome is in doubt (it may have committed; the next reader finds out).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from kbroker import metrics
from kbroker.core import names
from kbroker.core.dead_letter import dead_letter_record, set_aside
from kbroker.core.records import Record
from kbroker.core.transport.endpoint import transport_queue_prefix
from kbroker.errors import RecordRefusedError, TransactionInDoubtError
from kbroker.kafka.receive.receiver import Lease, QueueReceiver
from kbroker.kafka.txn.commit_requests import CommitRequest
from kbroker.kafka.txn.committer import GroupCommitter

log = logging.getLogger("kbroker.deadletter")

MALFORMED, POISON = "malformed", "poison"  # why a record is dead-lettered (the metric's reason label)
# What a record's way out holds, from the whole copy to the event alone.
COPY, WITHOUT_BODY, EVENT_ONLY = "copy", "without body", "event only"
_NEXT = {COPY: WITHOUT_BODY, WITHOUT_BODY: EVENT_ONLY}


class DeadLetters:
    """Dead-letters a namespace's records through `committer()` (the process's group committer)."""

    def __init__(self, namespace: str, committer: Callable[[], GroupCommitter]):
        self._namespace, self._committer = namespace, committer

    def submit(self, receiver: QueueReceiver, record: Any, reason: str) -> None:
        """The dead letter of a record `receiver` could not decode, its offset committed with
        it. Does not wait: called on the receiver's poll thread."""
        self._submit(self._committer(), receiver, receiver.dead_letter_lease(record), record, reason, COPY)

    def commit(self, lease: Lease, record: Any, reason: str) -> None:
        """The dead letter of `record`, committed with `lease` before returning (set aside if
        Kafka refuses the copy); TransactionAbortedError when it did not commit."""
        stage = COPY
        while True:
            try:
                self._committer().commit(CommitRequest(self._records(record, reason, stage), [lease]))
                self._count(record, POISON, stage)
                return
            except RecordRefusedError as exc:
                if stage not in _NEXT:
                    raise
                self._note_refused(record, stage, exc)
                stage = _NEXT[stage]

    def _records(self, record: Any, reason: str, stage: str) -> list[Record]:
        if stage == COPY:
            return [dead_letter_record(self._namespace, record, reason)]
        letter, event = set_aside(self._namespace, record, reason)
        return [letter, event] if stage == WITHOUT_BODY else [event]

    def _submit(
        self, committer: GroupCommitter, receiver: QueueReceiver, lease: Lease, record: Any, reason: str, stage: str
    ) -> None:
        request = CommitRequest(
            self._records(record, reason, stage),
            [lease],
            then=lambda req: self._after(committer, req, receiver, record, reason, stage),
        )
        committer.submit(request)

    def _after(
        self,
        committer: GroupCommitter,
        request: CommitRequest,
        receiver: QueueReceiver,
        record: Any,
        reason: str,
        stage: str,
    ) -> None:
        """On the committer's thread, once the dead letter has its outcome: the next way out."""
        error = request.error
        if error is None:
            self._count(record, MALFORMED, stage)
            return
        lease = cast(Lease, request.leases[0])  # the one this module's _submit put there
        if isinstance(error, RecordRefusedError) and stage in _NEXT:
            self._note_refused(record, stage, error)
            self._submit(committer, receiver, lease, record, reason, _NEXT[stage])
        elif isinstance(error, RecordRefusedError) or isinstance(error, TransactionInDoubtError):
            log.error(
                "the dead letter of %s[%s]@%s did not commit (%s); the partition is read again from it "
                "when its reader restarts",
                record.topic(),
                record.partition(),
                record.offset(),
                error,
            )
        elif not (lease.doomed or receiver.closed or committer.closed):
            self._submit(committer, receiver, lease, record, reason, stage)

    def _count(self, record: Any, why: str, stage: str) -> None:
        topic, transport = str(record.topic()), transport_queue_prefix(self._namespace)
        queue = topic[len(transport) :] if topic.startswith(transport) else names.queue_of_topic(self._namespace, topic)
        metrics.of(metrics.DEAD_LETTERS, self._namespace, queue or "", why, stage.replace(" ", "_")).inc()

    @staticmethod
    def _note_refused(record: Any, stage: str, error: Exception) -> None:
        log.warning(
            "Kafka refused the dead letter (%s) of %s[%s]@%s, %d bytes: %s; setting the record aside",
            stage,
            record.topic(),
            record.partition(),
            record.offset(),
            len(record.value() or b""),
            error,
        )
