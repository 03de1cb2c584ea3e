"""Secondary per-instance queues (NServiceBus callbacks) against the real broker."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka.admin import AdminClient

from kbroker.cli.demo import APPROVAL, CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.sdk.broker import Broker


def topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_reply_returns_to_the_instance_that_sent_the_request(kafka_bootstrap, namespace, broker):
    # Two instances of the Employees endpoint (one process each) and the Expenses service.
    with Broker(kafka_bootstrap, namespace) as a, Broker(kafka_bootstrap, namespace) as b:
        ha = a.begin_dialog(EMP, EXP, CONTRACT, instance="a")
        hb = b.begin_dialog(EMP, EXP, CONTRACT, instance="b")
        hb2 = b.begin_dialog(EMP, EXP, CONTRACT, instance="b")  # the topic exists: created once
        plain = a.begin_dialog(EMP, EXP, CONTRACT)
        for h, who in ((ha, "a"), (hb, "b"), (hb2, "b"), (plain, "none")):
            (a if who != "b" else b).send(h, CLAIM, {"from": who})
        for _ in range(4):
            with broker.transaction() as tx:
                for m in tx.receive("ExpenseQueue", top=10, wait=15):
                    tx.send(m.conversation_handle, APPROVAL, {"to": orjson.loads(m.body)["from"]})
        topic_a = names.secondary_queue_topic(namespace, "EmployeeQueue", "a")
        assert {topic_a, names.secondary_queue_topic(namespace, "EmployeeQueue", "b")} <= topics(kafka_bootstrap)
        got_b = []
        while len(got_b) < 2:
            msgs = b.receive("EmployeeQueue", top=10, wait=15, instance="b")
            assert msgs, "a reply to instance b went missing"
            got_b += msgs
        assert sorted(m.conversation_handle for m in got_b) == sorted([hb, hb2])
        assert {orjson.loads(m.body)["to"] for m in got_b} == {"b"}
        assert b.receive("EmployeeQueue", top=10, wait=2, instance="b") == []  # not a's reply
        got_a = a.receive("EmployeeQueue", top=10, wait=15, instance="a")
        assert [(m.conversation_handle, orjson.loads(m.body)["to"]) for m in got_a] == [(ha, "a")]
        # The primary queue has only the reply to the dialog begun without an instance.
        got = a.receive("EmployeeQueue", top=10, wait=15)
        assert [(m.conversation_handle, orjson.loads(m.body)["to"]) for m in got] == [(plain, "none")]
        assert a.receive("EmployeeQueue", top=10, wait=2) == []
        # END CONVERSATION from the target follows the replies to the instance's queue.
        broker.end_conversation(_target(broker, ha))
        end = a.receive("EmployeeQueue", top=10, wait=15, instance="a")
        assert [m.message_type_name for m in end] == ["http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"]


def _target(broker: Broker, initiator_handle: str) -> str:
    from kbroker.core.dialogs.conversation_endpoint import handle_for

    return handle_for(broker.endpoints.get(initiator_handle).conversation_id, "TARGET")


@pytest.mark.parametrize("instance", ["a.b", "", "x" * 65, "a/b"])
def test_bad_instance_name_is_refused_and_creates_nothing(kafka_bootstrap, namespace, broker, instance):
    before = topics(kafka_bootstrap)
    with pytest.raises(ValueError):
        broker.begin_dialog(EMP, EXP, CONTRACT, instance=instance)
    assert topics(kafka_bootstrap) == before
