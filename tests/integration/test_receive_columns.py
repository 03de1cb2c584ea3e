"""RECEIVE's status, queuing_order and validation columns on the real broker."""

from __future__ import annotations

from kbroker.core.catalog.models import END_DIALOG
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import invariants as inv


def test_receive_gives_status_queuing_order_and_validation(kafka_bootstrap, namespace):
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    with Broker(kafka_bootstrap, namespace) as b:
        h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
        for i in range(3):
            b.send(h, inv.REQUEST, {"i": i})
        b.end_conversation(h)
        got: list = []
        while len(got) < 4:
            more = b.receive("RequestQueue", top=10, wait=15)
            assert more, f"only {len(got)} of 4 messages arrived"
            got += more
        assert [m.message_type_name for m in got] == [inv.REQUEST] * 3 + [END_DIALOG]
        assert [m.validation for m in got] == ["J", "J", "J", "E"]  # JSON (kbroker's), EMPTY
        assert {m.status for m in got} == {0}  # what RECEIVE returns: received messages
        orders = [m.queuing_order for m in got]
        assert orders == sorted(orders) and len(set(orders)) == 4  # one group: one partition, in order
        row = got[0].as_dict()
        assert (row["status"], row["queuing_order"], row["validation"]) == (0, orders[0], "J")
