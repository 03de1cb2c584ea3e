"""What a transport endpoint's transactions use of it (`EndpointRuntime`). A protocol here, rather
than the endpoint class, keeps the endpoint module the only one that imports the others:
transaction.py depends on this contract, and sdk/transport/endpoint.TransportEndpoint fulfils it
(mypy checks that where it passes itself)."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from kbroker.core.records import Record
from kbroker.core.transport.endpoint import EndpointSettings, FailedDeliveries
from kbroker.kafka.committer import GroupCommitter, OpenTransactions
from kbroker.kafka.receiver import Lease, QueueReceiver


class EndpointRuntime(Protocol):
    """The endpoint as its transactions see it."""

    settings: EndpointSettings
    open_transactions: OpenTransactions
    failures: FailedDeliveries

    @property
    def committer(self) -> GroupCommitter: ...

    def receiver(self, queue: str) -> QueueReceiver: ...

    def closing(self) -> bool: ...

    def count(self, what: str, n: int = 1) -> None: ...

    def record(self, destination: str, body: bytes | None, headers: Mapping[str, str] | None, *,
               correlation_id: str | None, reply_to_address: str | None, recoverable: bool,
               time_to_be_received: float | None, message_id: str | None) -> Record: ...

    def dead_letter(self, lease: Lease, record: Any, reason: str) -> None: ...
