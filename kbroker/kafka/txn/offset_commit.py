"""A transaction that wrote nothing commits its offsets without a Kafka transaction.

A RECEIVE whose transaction sends nothing (the requester's RECEIVE of a reply, a handler that
only reads) has nothing for a Kafka transaction to make atomic: the queue consumer's own offset
commit records the same positions, with the same metadata, in one request instead of a
transaction's four. It is fenced as the transactional commit is: the group coordinator refuses it
from a member of an older generation (classic protocol) or epoch (consumer protocol); a partition
revoked meanwhile is never in it (the poll thread that makes it checks the leases first, and a
revocation waits for the committer's barrier, making the handed-over commits while it waits).

Kafka keeps, for a partition, the offset commit written last, and both kinds of commit go
through the one committing thread, each waiting for the one before, so the later always carries
the later positions. A commit not answered within the deadline is in doubt; until it returns no
other commit of that receiver goes out, so that it can never land after a later one.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kbroker.errors import (
    RebalanceAbortedError,
    TransactionAbortedError,
    TransactionInDoubtError,
    denied_code,
)
from kbroker.kafka.txn.commit_requests import CommitRequest, Lease
from kbroker.kafka.txn.settling import GROUP_FENCES

# librdkafka's own errors where the request may have reached the coordinator: in doubt.
IN_DOUBT = frozenset({"_TIMED_OUT", "_TRANSPORT", "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT"})
Denied = Callable[[KafkaError, list[TopicPartition]], Exception]


class OffsetCommits:
    """The direct commits of one group committer, each bounded by `deadline` seconds;
    `denied(err, offsets)` builds the error for the authorizer's refusal."""

    def __init__(self, deadline: float, denied: Denied):
        self._deadline, self._denied = deadline, denied
        self._doubtful: dict[int, concurrent.futures.Future[list[TopicPartition]]] = {}
        self.commits = 0

    def settled(self, receivers: list[Any]) -> Exception | None:
        """None once no commit of `receivers` is in doubt (waiting up to the deadline for one
        that is); else the error that fails the commit that would follow it."""
        for receiver in receivers:
            pending = self._doubtful.get(id(receiver))
            if pending is None:
                continue
            try:
                pending.result(timeout=self._deadline)
            except concurrent.futures.TimeoutError:
                return TransactionAbortedError("the queue's previous offset commit has not returned")
            except Exception:  # noqa: BLE001 - its outcome went to its own transaction
                pass
            del self._doubtful[id(receiver)]
        return None

    def took(self, batch: list[CommitRequest], leases: dict[Any, list[Lease]], positions: dict[Any, Any]) -> bool:
        """Commit `batch` directly if it may be (it wrote nothing, holds no conversation lease,
        and its offsets are one receiver's), finishing its requests; False: it needs a Kafka
        transaction. `leases` and `positions`: the batch's, per receiver (committer.py)."""
        if len(positions) != 1 or any(req.records or req.generation is not None for req in batch):
            return False
        ((receiver, offsets),) = positions.items()
        if not hasattr(receiver, "commit_offsets"):
            return False
        error = self._commit(receiver, offsets, leases[receiver])
        if error is not None:
            receiver.exclude(leases[receiver])
        for req in batch:
            req.finish(error)
        return True

    def _commit(self, receiver: Any, offsets: list[TopicPartition], leases: list[Lease]) -> Exception | None:
        if not offsets:  # nothing completed (GET CONVERSATION GROUP, a rollback to a savepoint)
            self.commits += 1
            return None
        future = receiver.commit_offsets(offsets, leases)
        try:
            done = future.result(timeout=self._deadline)
        except concurrent.futures.TimeoutError:
            self._doubtful[id(receiver)] = future
            return TransactionInDoubtError(f"the queue's offset commit did not answer within {self._deadline:g} s")
        except KafkaException as exc:
            return self._failure(exc.args[0], offsets)
        except Exception as exc:  # noqa: BLE001 - a closed consumer: nothing was sent
            return TransactionAbortedError(f"the queue's offset commit failed: {exc}")
        failed = [tp for tp in done if tp.error is not None]
        if failed:
            return self._failure(failed[0].error, offsets)
        self.commits += 1
        return None

    def _failure(self, err: KafkaError, offsets: list[TopicPartition]) -> Exception | None:
        if err.code() == KafkaError._NO_OFFSET:  # none of them moved: nothing to commit
            self.commits += 1
            return None
        if denied_code(err):
            return self._denied(err, offsets)  # refused again if retried: not retriable
        if err.code() in GROUP_FENCES:
            return RebalanceAbortedError(f"the queue's group rebalanced during the commit: {err.str()}")
        if err.name() in IN_DOUBT:
            return TransactionInDoubtError(f"the queue's offset commit: {err.str()}")
        return TransactionAbortedError(f"the queue's offset commit failed: {err.str()}")
