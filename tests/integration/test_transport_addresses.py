"""Transport addresses across namespaces (core/transport/endpoint.py, parse_address): a send,
a delayed send and a reply between endpoints of two namespaces of one cluster, `queue@namespace`
as the SQL transport's `queue@schema`; the reply finds its way back by the ReplyToAddress the
send set, which names the sender's namespace."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kbroker import transport
from kbroker.core.transport.message import TransportMessage
from kbroker.errors import InvalidArgumentError, TransportQueueNotFoundError
from tests.helpers import wait_for


def test_sends_delayed_sends_and_replies_cross_namespaces(kafka_bootstrap: str, namespace: str) -> None:
    other = f"{namespace}-b"
    sales = transport.endpoint("Sales", bootstrap=kafka_bootstrap, namespace=namespace, machine="m1", install=True)
    billing = transport.endpoint("Billing", bootstrap=kafka_bootstrap, namespace=other, machine="m1", install=True)
    try:
        got: list[TransportMessage] = []

        def bill(msg: TransportMessage, tx: Any) -> None:
            got.append(msg)
            tx.reply(msg, b"billed " + (msg.body or b""))

        billing.start(bill)
        sales.start(lambda msg, tx: None)  # its secondary queue's reader (callbacks), and its mover
        reply = sales.request(f"Billing@{other}", b"order 1").result(20)
        assert reply.body == b"billed order 1" and reply.queue == "Sales.m1"
        assert got[0].reply_to_address == f"Sales.m1@{namespace}"
        at = time.time()
        sales.send(f"Billing@{other}", b"later", delay=1.0)
        wait_for(lambda: len(got) == 2, 20, "the delayed send, in the other namespace")
        assert got[1].body == b"later" and (got[1].enqueued_ms or 0) >= at * 1000 + 1000
        with pytest.raises(TransportQueueNotFoundError):
            sales.send(f"Nobody@{other}", b"x")
        with pytest.raises(InvalidArgumentError, match="namespace"):
            sales.send("Billing@not a namespace", b"x")
    finally:
        sales.close()
        billing.close()
