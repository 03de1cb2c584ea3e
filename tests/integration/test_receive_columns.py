"""RECEIVE's status, queuing_order and validation columns, and the order of a far side's Error,
on the real broker."""

from __future__ import annotations

from kbroker.core.catalog.models import END_DIALOG, ERROR
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


def test_messages_sent_before_end_with_error_are_received_before_it(kafka_bootstrap, namespace):
    """The target replies twice, then ENDs WITH ERROR, each in its own transaction, while the
    initiator receives nothing; then one RECEIVE takes all three: the replies, then the Error
    (an Error first ended the dialog here and the replies were set aside as sent after it)."""
    apply_paths(kafka_bootstrap, namespace, [inv.YAML])
    with Broker(kafka_bootstrap, namespace) as b:
        h = b.begin_dialog(inv.CLIENT, inv.SERVER, inv.CONTRACT)
        b.send(h, inv.REQUEST, {"i": 0})
        (req,) = b.receive("RequestQueue", wait=15)
        for i in range(2):
            with b.transaction() as tx:
                tx.send(req.conversation_handle, inv.REPLY, {"i": i})
        b.end_conversation(req.conversation_handle, error=50001, description="stop")
        got: list = []
        while len(got) < 3:
            more = b.receive("ReplyQueue", top=10, wait=15)
            assert more, f"only {got} arrived"
            got += more
        assert [m.message_type_name for m in got] == [inv.REPLY, inv.REPLY, ERROR]
        assert [m.message_sequence_number for m in got] == [0, 1, 2]
