"""Publish/subscribe statements of a transport endpoint: subscribe, unsubscribe, the table, and a
publish outside a transaction (TransportEndpoint has these through PubSub)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kbroker.core.records import Record
from kbroker.core.transport.endpoint import TransportSettings
from kbroker.core.transport.subscriptions import (
    Subscription,
    subscribe_record,
    subscriptions_topic,
    type_name,
    unsubscribe_record,
)
from kbroker.errors import InvalidArgumentError
from kbroker.sdk.transport.runtime import TransportRuntime
from kbroker.sdk.transport.transaction import TransportTransaction


class PubSub:
    """Publish/subscribe for a transport endpoint instance (mixed into TransportEndpoint)."""

    runtime: TransportRuntime
    settings: TransportSettings

    def transaction(self) -> TransportTransaction:
        raise NotImplementedError  # TransportEndpoint's

    def subscribe(self, event_type: str, *, queue: str | None = None) -> Subscription:
        """Subscribe this endpoint to events of `event_type` and of the types derived from it
        (those whose EnclosedMessageTypes name it): their copies go to its primary queue, or to
        `queue`. Written to the namespace's table, acknowledged; every publisher's copy of the
        table has it within its staleness (5 s). Subscribing again changes nothing."""
        sub = Subscription(self.settings.name, queue or self.settings.primary_queue, self._type(event_type))
        self.runtime.queues.topic(sub.queue)  # TransportQueueNotFoundError for a queue not installed
        self._write(subscribe_record(subscriptions_topic(self.runtime.namespace), sub))
        return sub

    def unsubscribe(self, event_type: str) -> None:
        """End this endpoint's subscription to `event_type` (nothing if it had none)."""
        t = self._type(event_type)
        self._write(unsubscribe_record(subscriptions_topic(self.runtime.namespace), self.settings.name, t))

    def subscriptions(self) -> list[Subscription]:
        """Every subscription of the namespace, as the table holds it now."""
        return self.runtime.subscriptions().all()

    def publish(
        self,
        event_type: str | Sequence[str] | None,
        body: bytes | None,
        headers: Mapping[str, str] | None = None,
        **kw: object,
    ) -> str:
        """Publish outside a handler: one transaction holding every copy (all or none); see
        TransportTransaction.publish. Returns the event's Id."""
        with self.transaction() as tx:
            return tx.publish(event_type, body, headers, **kw)  # type: ignore[arg-type]

    def _type(self, event_type: str) -> str:
        if self.settings.send_only:
            raise InvalidArgumentError(f"{self.settings.name} is a send-only endpoint: it does not subscribe")
        try:
            return type_name(event_type)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def _write(self, record: Record) -> None:
        self.runtime.queues.subscription_table()  # the installer makes it: a runner does not
        with self.runtime.acknowledged() as produce:
            produce(record)
        self.runtime.subscriptions().stale()
