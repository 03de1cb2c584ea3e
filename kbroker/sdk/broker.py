"""The SDK: Service Broker's statements as methods of a Broker connected to one namespace.

    broker = kbroker.connect()
    handle = broker.begin_dialog(from_service, to_service, contract)
    broker.send(handle, message_type, body)
    with broker.transaction() as tx:
        for msg in tx.receive(queue, top=10, wait=5): ...

Outside a transaction each statement commits on its own, as in Service Broker: SEND returns once
Kafka acknowledged the message (idempotent producer), and RECEIVE is a transaction of its own.
Both paths build their records with the same Statements (kbroker.core.dialogs.statements), so a
statement validates the same way inside and outside a transaction. The Broker only produces
them; the process's runtime (sdk/runtime.py: receivers, group committer, endpoint cache,
catalog view) is what its transactions share.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, overload

from kbroker import config, metrics
from kbroker.core import names
from kbroker.core.catalog.models import END_DIALOG, Catalog
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.dialogs.conversation_endpoint import must_persist
from kbroker.core.dialogs.envelope import Message
from kbroker.embedded import resolve_cluster
from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore
from kbroker.sdk.fenced_retry import receive_fenced_again
from kbroker.sdk.group_locks import GroupLocks
from kbroker.sdk.hooks import ReceiveHooks
from kbroker.sdk.partial import Handles
from kbroker.sdk.runtime import BrokerRuntime
from kbroker.sdk.send_trace import traced_record
from kbroker.sdk.transaction import Transaction

__all__ = ["END_DIALOG", "ERROR_TYPE", "Broker", "connect"]  # the message types, for callers' checks


def connect(
    bootstrap: ClusterLike | None = None,
    namespace: str | None = None,
    *,
    command_config: str | Path | None = None,
    **kwargs: Any,
) -> Broker:
    """Connect by the broker rule: `bootstrap` (an address or a Cluster), else KBROKER_BOOTSTRAP,
    else the embedded broker; with the client settings of the `command_config` properties file
    (else KBROKER_COMMAND_CONFIG) and KBROKER_KAFKA_* variables (kbroker.embedded.resolve_cluster)."""
    return Broker(resolve_cluster(bootstrap, command_config=command_config), config.namespace(namespace), **kwargs)


class Broker:
    """A connection to one namespace: Service Broker's statements, outside a transaction or in
    one (transaction()), the views a user reads (the catalog, the conversation endpoints), and
    close(). The process's runtime, which transactions share, is `runtime` (sdk/runtime.py).

    `hooks` is the list of ReceiveHooks called around RECEIVE and on rollback."""

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        *,
        ack_timeout: float = 30.0,
        commit_interval: float = 0.005,
        max_buffered: int = 20_000,
        revoke_grace: float = 5.0,
        lock_timeout: float = 30.0,
    ):
        self.cluster, self.namespace = Cluster.of(cluster), namespace
        self.runtime = BrokerRuntime(
            self.cluster,
            namespace,
            ack_timeout=ack_timeout,
            commit_interval=commit_interval,
            max_buffered=max_buffered,
            revoke_grace=revoke_grace,
            lock_timeout=lock_timeout,
        )

    @property
    def bootstrap(self) -> str:
        """The cluster's address, as text."""
        return self.cluster.bootstrap

    @property
    def hooks(self) -> list[ReceiveHooks]:
        """The receive hooks: append to register one."""
        return self.runtime.hooks

    @property
    def endpoints(self) -> EndpointStore:
        """The conversation endpoints this process knows (sys.conversation_endpoints, as cached)."""
        return self.runtime.endpoints

    @property
    def catalog(self) -> Catalog:
        """The namespace's catalog as last read."""
        return self.runtime.catalog.current

    def refresh_catalog(self) -> Catalog:
        """Read the catalog again (another process may have applied definitions)."""
        return self.runtime.catalog.refresh()

    def transaction(self) -> Transaction:
        """BEGIN TRANSACTION: use as a context manager, or call commit()/rollback()."""
        return Transaction(self.runtime)

    # --- statements outside a transaction -----------------------------------------------------

    @contextmanager
    def _conversation(self, handle: str) -> Iterator[Any]:
        """A statement outside a transaction holds the conversation: among this process's
        threads, then across processes (its lease); then it produces its records and waits for
        Kafka's acknowledgement (what this yields produces one)."""
        rt = self.runtime
        groups = GroupLocks(rt, object())  # its conversation group first, as a transaction's (group_locks.py)
        try:
            if (ep := rt.endpoints.find(handle)) is not None:
                groups.lock(ep)
            with rt.conversation_locks.held(handle):
                rt.send_leases.hold(handle, rt.conversation_locks.timeout)
                with rt.acknowledged() as produce:
                    yield produce
        finally:
            groups.release([])

    def begin_dialog(self, from_service: str, to_service: str, contract: str = "DEFAULT", **kw: Any) -> str:
        """BEGIN DIALOG: creates the initiator endpoint and returns its conversation handle."""
        rt = self.runtime
        ep = rt.statements.new_dialog(from_service, to_service, contract, endpoint_of=rt.endpoints.get, **kw)
        rt.check_send(ep)  # SEND permission on the target service: refused before anything is written
        if ep.instance is not None:
            rt.secondary_queue(rt.statements.queue_of(ep.service_name), ep.instance)  # replies land there
        lease = rt.send_leases.created(ep)
        with rt.acknowledged() as produce:
            for record in rt.statements.lifetime_records(ep):
                produce(record)
            rt.endpoints.put(ep)
            produce(rt.statements.lease_record(lease))
        rt.send_leases.holding(lease)
        related = kw.get("related_conversation") is not None or kw.get("related_conversation_group") is not None
        if not related:
            rt.fresh_groups.add(ep.conversation_group_id)  # its first transaction takes no hold (group_locks.py)
        return ep.conversation_handle

    @overload
    def send(self, handle: str, message_type: str = ..., body: Any = ..., **kw: Any) -> str:
        """SEND ON CONVERSATION handle: its message id."""

    @overload
    def send(self, handle: Handles, message_type: str = ..., body: Any = ..., **kw: Any) -> list[str]:
        """SEND ON CONVERSATION (h1, h2, ...): their message ids, in order."""

    def send(
        self, handle: str | Handles, message_type: str = "DEFAULT", body: Any = None, **kw: Any
    ) -> str | list[str]:
        """SEND ON CONVERSATION: returns the message id once Kafka acknowledged the message. A list
        of handles, SEND ON CONVERSATION (h1, h2, ...), is one transaction: a message on each or
        none (Transaction.send); returns their ids once it committed."""
        rt = self.runtime
        # Several records that must land together: SEND ON (h1, h2, ...), or a RETENTION = ON
        # sender's queue, which keeps a copy of the message (status 3).
        found = None if isinstance(handle, (list, tuple)) else rt.endpoints.current(str(handle))
        if found is None or rt.statements.retains_sent(found):
            with self.transaction() as tx:
                return tx.send(handle, message_type, body, **kw)
        rt.check_send(found)  # before the conversation's lease is taken
        with self._conversation(str(handle)) as produce:
            before = rt.endpoints.current(str(handle))
            record, message_id, ep = rt.statements.message_record(before, message_type, body, **kw)
            queue = names.queue_label(rt.namespace, record[0], rt.catalog.current.queues)
            record = traced_record(record, rt.namespace, queue, ep.conversation_id, message_type, None)
            rt.check_send(ep, [record])  # its trace headers included
            produce(record)
            if must_persist(before, ep):
                rt.endpoints.put(ep)
            else:
                rt.endpoints.note(ep.conversation_handle, ep, written=False)
        metrics.of(metrics.MESSAGES_SENT, rt.namespace, queue).inc()
        return message_id

    def end_conversation(
        self, handle: str, *, error: int | None = None, description: str | None = None, cleanup: bool = False
    ) -> None:
        """END CONVERSATION [WITH ERROR = code DESCRIPTION = text | WITH CLEANUP]."""
        rt = self.runtime
        with self._conversation(str(handle)) as produce:
            ep = rt.endpoints.current(str(handle))
            records, ended = rt.statements.end_records(ep, error=error, description=description, cleanup=cleanup)
            rt.check_send(ep, records)
            for record in records:
                produce(record)
            produce(rt.statements.endpoint_record(ep.conversation_handle, ended))
            rt.endpoints.note(ep.conversation_handle, ended)

    def begin_conversation_timer(self, handle: str, timeout: float) -> None:
        """BEGIN CONVERSATION TIMER (handle) TIMEOUT = seconds: a DialogTimer message reaches this
        side's queue then (fired by the timer service, which `kbroker worker` runs)."""
        rt = self.runtime
        with self._conversation(str(handle)) as produce:
            records, ep = rt.statements.timer_records(rt.endpoints.get(str(handle)), timeout)
            for record in records:
                produce(record)
            rt.endpoints.put(ep)

    def receive(self, queue: str, top: int | None = None, wait: float | None = 0.0, **kw: Any) -> list[Message]:
        """RECEIVE outside a transaction: a transaction of its own, committed before it returns.
        top=None: every ready message of one group, as RECEIVE without TOP.

        A commit a rebalance fenced is tried again (kbroker/sdk/fenced_retry.py)."""

        def attempt(left: float | None) -> list[Message]:
            with self.transaction() as tx:
                return tx.receive(queue, top, left, **kw)

        return receive_fenced_again(attempt, wait, queue)

    def queue_messages(self, queue: str, conversation_handle: str | None = None) -> list[dict[str, Any]]:
        """The queue's messages like Service Broker's queue view: status 1 = ready, 0 = received
        (listed only with RETENTION = ON, until this side ends the conversation). See retention.py."""
        from kbroker.kafka.receive.retention import queue_messages

        return queue_messages(self.cluster, self.namespace, queue, conversation_handle)

    def move_conversation(self, handle: str, group: str) -> None:
        """MOVE CONVERSATION handle TO group, committed before it returns."""
        with self.transaction() as tx:
            tx.move_conversation(handle, group)

    def close(self) -> None:
        """Stop reading, commit what is pending, write the exact send sequences, and flush."""
        self.runtime.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
