"""Publish/subscribe of the transport face (core/transport/subscriptions.py,
kafka/transport/subscription_store.py, sdk/transport/pubsub.py) against the real broker: a
publish reaches every subscribed endpoint once, subscribers to a base type included, with one
Id; unsubscribing stops it; a publish in a transaction goes with its commit only; an instance's
copy of the table lags by at most its staleness; records another client writes to the table are
set aside; the CLI's commands."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from kbroker import transport
from kbroker.core.transport.message import ENCLOSED_MESSAGE_TYPES, TransportMessage
from kbroker.core.transport.subscriptions import MESSAGE_INTENT, subscriptions_topic
from kbroker.errors import InvalidArgumentError, TransportQueueNotFoundError
from kbroker.sdk.transport.endpoint import TransportEndpoint
from tests.integration.test_catalog_apply import run_cli

DERIVED = "Sales.Messages.OrderPlaced, Sales.Messages, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"
BASE = "Sales.Messages.IOrderEvent, Sales.Messages"


@pytest.fixture
def endpoints(kafka_bootstrap: str, namespace: str) -> Iterator[Callable[..., TransportEndpoint]]:
    made: list[TransportEndpoint] = []

    def make(name: str, machine: str = "m1", **kw: Any) -> TransportEndpoint:
        kw.setdefault("install", True)
        kw.setdefault("subscription_staleness", 0.0)
        ep = transport.endpoint(name, bootstrap=kafka_bootstrap, namespace=namespace, machine=machine, **kw)
        made.append(ep)
        return ep

    yield make
    for ep in reversed(made):
        ep.close()


def received(ep: TransportEndpoint, seconds: float = 3.0) -> list[TransportMessage]:
    got: list[TransportMessage] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        msg = ep.receive(0.3)
        if msg is not None:
            got.append(msg)
    return got


def test_a_publish_reaches_each_subscriber_once_base_types_included(
    endpoints: Callable[..., TransportEndpoint],
) -> None:
    sales, billing, shipping, audit = (endpoints(n) for n in ("Sales", "Billing", "Shipping", "Audit"))
    billing.subscribe("Sales.Messages.OrderPlaced")
    shipping.subscribe(BASE)  # the base type: derived events too
    audit.subscribe("Sales.Messages.OrderPlaced")
    audit.subscribe(BASE)  # both of an event's types: still one copy
    mid = sales.publish([DERIVED, BASE], b'{"order": 1}', {"k": "v"})
    for ep in (billing, shipping, audit):
        got = received(ep)
        assert [m.id for m in got] == [mid], ep.settings.name
        hs = got[0].headers
        assert hs[MESSAGE_INTENT] == "Publish" and hs["k"] == "v"
        assert hs[ENCLOSED_MESSAGE_TYPES] == f"{DERIVED};{BASE}"
        assert got[0].body == b'{"order": 1}'
    assert received(sales, 1.0) == []  # the publisher is no subscriber
    # An event of the base type alone reaches only the base type's subscribers.
    only_base = sales.publish(BASE, b"b")
    assert [m.id for m in received(shipping)] == [only_base]
    assert [m.id for m in received(audit)] == [only_base]
    assert received(billing, 1.0) == []


def test_unsubscribe_and_the_table(endpoints: Callable[..., TransportEndpoint]) -> None:
    sales, billing = endpoints("Sales"), endpoints("Billing")
    sub = billing.subscribe("OrderPlaced")
    assert sub.as_dict() == {"endpoint": "Billing", "queue": "Billing", "type": "OrderPlaced"}
    assert billing.subscribe("OrderPlaced") == sub  # again: no change
    assert [s.as_dict() for s in sales.subscriptions()] == [sub.as_dict()]
    billing.unsubscribe("OrderPlaced")
    billing.unsubscribe("NeverSubscribed")
    assert sales.subscriptions() == []
    sales.publish("OrderPlaced", b"x")
    assert received(billing, 1.5) == []
    with pytest.raises(TransportQueueNotFoundError):
        billing.subscribe("OrderPlaced", queue="NoSuchQueue")
    with pytest.raises(InvalidArgumentError, match="empty"):
        billing.subscribe(" , Assembly")
    with pytest.raises(InvalidArgumentError, match="EnclosedMessageTypes"):
        sales.publish(None, b"x")
    assert sales.publish(None, b"x", {ENCLOSED_MESSAGE_TYPES: "A;B"})  # types from the header: nobody subscribed


def test_a_publish_in_a_transaction_goes_with_its_commit(endpoints: Callable[..., TransportEndpoint]) -> None:
    sales, billing = endpoints("Sales"), endpoints("Billing")
    billing.subscribe("OrderPlaced")
    with sales.transaction() as tx:
        tx.publish("OrderPlaced", b"rolled back")
        tx.rollback()
    with sales.transaction() as tx:
        kept = tx.publish("OrderPlaced", b"committed")
        tx.send("Billing", b"a send beside it")
    got = received(billing)
    assert sorted(m.body for m in got) == [b"a send beside it", b"committed"]
    assert kept in {m.id for m in got}


def test_a_copy_of_the_table_lags_by_at_most_its_staleness(endpoints: Callable[..., TransportEndpoint]) -> None:
    sales = endpoints("Sales", subscription_staleness=3.0)
    billing = endpoints("Billing")
    assert sales.publish("OrderPlaced", b"before") and sales.subscriptions() == []  # the copy is read now
    sales.publish("OrderPlaced", b"cached")  # (read: a fresh copy, nobody)
    billing.subscribe("OrderPlaced")
    sales.publish("OrderPlaced", b"within the staleness")
    time.sleep(3.2)
    sales.publish("OrderPlaced", b"after it")
    assert [m.body for m in received(billing)] == [b"after it"]


def test_records_another_client_writes_to_the_table_are_set_aside(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    sales, billing = endpoints("Sales"), endpoints("Billing")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    table = subscriptions_topic(namespace)
    for key, value in [
        (b"not json", b"{}"),
        (orjson.dumps(["Billing", "T"]), b"not json"),
        (orjson.dumps(["Billing", "T"]), orjson.dumps({"endpoint": "Other", "queue": "Billing", "type": "T"})),
        (orjson.dumps(["Bad Name!", "T"]), orjson.dumps({"endpoint": "Bad Name!", "queue": "Billing", "type": "T"})),
    ]:
        p.produce(table, key=key, value=value)
    assert p.flush(10) == 0
    billing.subscribe("T")
    mid = sales.publish("T", b"x")
    assert [m.id for m in received(billing)] == [mid]
    assert sales.runtime.subscriptions().rejects.rejected == 4


def test_the_cli_subscribes_publishes_and_lists(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    billing = endpoints("Billing")
    endpoints("Sales")

    def cli(*args: str) -> Any:
        proc = run_cli(kafka_bootstrap, "endpoint", *args, "--namespace", namespace, "--json")
        assert proc.returncode == 0, proc.stderr
        return orjson.loads(proc.stdout)

    assert cli("subscribe", "Billing", "--type", DERIVED) == {
        "endpoint": "Billing",
        "queue": "Billing",
        "type": "Sales.Messages.OrderPlaced",
    }
    assert cli("subscriptions") == [{"endpoint": "Billing", "queue": "Billing", "type": "Sales.Messages.OrderPlaced"}]
    out = cli("publish", "Sales", "--type", "Sales.Messages.OrderPlaced", "--body", "hi")
    assert out["queues"] == ["Billing"]
    assert [m.id for m in received(billing)] == [out["Id"]]
    assert cli("unsubscribe", "Billing", "--type", "Sales.Messages.OrderPlaced")["subscribed"] is False
    assert cli("subscriptions") == []
    bad = run_cli(kafka_bootstrap, "endpoint", "publish", "Sales", "--namespace", namespace)
    assert bad.returncode == 1 and bad.stderr.startswith("kbroker: error: name the event's type")


def test_an_asyncio_endpoint_publishes_subscribes_and_delays(
    endpoints: Callable[..., TransportEndpoint], kafka_bootstrap: str, namespace: str
) -> None:
    endpoints("Sales")
    billing = endpoints("Billing")

    async def main() -> list[tuple[str, bytes | None]]:
        ep = await transport.async_endpoint(
            "Sales", bootstrap=kafka_bootstrap, namespace=namespace, machine="a1", install=True
        )
        seen: list[tuple[str, bytes | None]] = []

        async def handle(msg: TransportMessage, tx: Any) -> None:
            seen.append((msg.headers.get(MESSAGE_INTENT, "Send"), msg.body))
            if msg.body == b"go":
                await tx.publish("OrderPlaced", b"event from a handler")
                await tx.send("Sales", b"later", delay=0.5)

        try:
            await ep.subscribe("OrderPlaced")
            assert [s.endpoint for s in await ep.subscriptions()] == ["Sales"]
            await ep.start(handle)  # its readers, and its delayed store's mover
            await ep.send("Sales", b"go")
            deadline = time.monotonic() + 20
            while len(seen) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await ep.unsubscribe("OrderPlaced")
            return seen
        finally:
            await ep.close()

    seen = asyncio.run(main())
    assert sorted(seen) == [("Publish", b"event from a handler"), ("Send", b"go"), ("Send", b"later")]
    assert received(billing, 0.5) == []
