"""What a Transaction needs from the process it runs in. Broker is the one implementation; the
interface keeps Transaction from reaching into the rest of the facade."""

from __future__ import annotations

from typing import Protocol

from kbroker.core.locks import ConversationLocks
from kbroker.core.statements import Statements
from kbroker.kafka.committer import GroupCommitter, OpenTransactions
from kbroker.kafka.conversation_endpoints import EndpointStore
from kbroker.kafka.receiver import QueueReceiver
from kbroker.kafka.send_leases import SendLeases
from kbroker.sdk.hooks import ReceiveHooks


class Runtime(Protocol):
    """The process-wide state and services a Transaction uses."""

    @property
    def endpoints(self) -> EndpointStore:
        """The conversation endpoints this process knows (a cache over the endpoints topic)."""

    @property
    def statements(self) -> Statements:
        """Builds each statement's records."""

    @property
    def conversation_locks(self) -> ConversationLocks:
        """SEND's conversation locks, held until the transaction ends."""

    @property
    def send_leases(self) -> SendLeases:
        """The conversation leases this process holds: the conversation lock across processes."""

    @property
    def open_transactions(self) -> OpenTransactions:
        """The count of open transactions the group committer waits for."""

    @property
    def receive_hooks(self) -> ReceiveHooks:
        """Every registered hook at once; a failing hook is logged, never raised."""

    @property
    def committer(self) -> GroupCommitter:
        """The process's group committer: one Kafka transaction for many Transactions."""

    def receiver(self, queue: str, instance: str | None = None) -> QueueReceiver:
        """The receiver of `queue`, or of its secondary queue for `instance`."""

    def secondary_queue(self, queue: str, instance: str) -> str:
        """The secondary queue topic of `queue` for `instance`, created on first use."""

    def queue_open(self, queue: str) -> bool:
        """STATUS of `queue` as known now, without asking Kafka (checked while a RECEIVE waits)."""

    def queue_enabled(self, queue: str) -> bool:
        """Whether `queue` has STATUS = ON (a disabled queue is re-checked against the catalog)."""

    def note_commit(self, queue: str, taken: dict[str, list[tuple[int, int]]]) -> None:
        """A transaction that received from `queue` committed (poison-message handling); `taken`:
        topic -> (partition, offset) of the messages it received."""

    def note_rollback(self, queue: str, taken: dict[str, list[tuple[int, int]]]) -> None:
        """A transaction that received from `queue` rolled back (poison-message handling)."""
