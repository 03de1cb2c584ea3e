"""A queue's receiver nothing reads from any more is closed (Process.close_idle_receivers, which
the worker calls every tick for its activated readers' queues): only once no RECEIVE waits and
no transaction holds what it leased, and its partitions then go to the queue's other readers."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import SAMPLES, wait_for

QUEUE = "ExpenseQueue"  # 4 partitions (topics/samples)


@pytest.fixture
def namespace(kafka_bootstrap) -> str:
    ns = f"idle-{uuid.uuid4().hex[:8]}"
    apply_paths(kafka_bootstrap, ns, [SAMPLES])
    return ns


def send_claims(broker: Broker, n: int) -> set[str]:
    with broker.transaction() as tx:
        return {tx.send(tx.begin_dialog(EMP, EXP, CONTRACT), CLAIM, {"amount": i}) for i in range(n)}


def test_an_idle_receiver_closes_only_when_no_receive_waits_and_no_transaction_holds_its_lease(
    kafka_bootstrap, namespace
):
    with Broker(kafka_bootstrap, namespace) as broker:
        sent = send_claims(broker, 3)
        tx = broker.transaction()
        held = tx.receive(QUEUE, top=1, wait=15)
        assert held
        assert broker.runtime.close_idle_receivers(0.0) == []  # a transaction holds its group
        tx.commit()
        assert broker.runtime.close_idle_receivers(60.0) == []  # used a moment ago
        # A RECEIVE waiting on it keeps it too, however long since the last one ended.
        nobody = str(uuid.uuid4())  # a group with no message: the RECEIVE waits its 3 s out
        waiting = threading.Thread(target=lambda: broker.receive(QUEUE, top=10, wait=3, conversation_group=nobody))
        waiting.start()
        time.sleep(1.0)
        assert broker.runtime.close_idle_receivers(0.0) == []
        waiting.join()
        assert broker.runtime.close_idle_receivers(0.0) == [(QUEUE, None)]
        assert broker.runtime.receivers() == {}
        # The next RECEIVE builds a new receiver and gets the rest, nothing twice.
        rest: list = []
        wait_for(lambda: rest.extend(broker.receive(QUEUE, top=10, wait=2)) or len(rest) >= 2, 60, "the rest")
        assert {m.message_id for m in [*held, *rest]} == sent and len(rest) == 2


def test_a_closed_receiver_gives_its_partitions_to_the_queues_other_reader(kafka_bootstrap, namespace):
    """Without the close, the idle reader keeps its share of the partitions and the other reader
    never sees what lands there (what an application met once a worker's activated readers of
    the queue had ended and activation was turned OFF)."""
    with Broker(kafka_bootstrap, namespace) as idle, Broker(kafka_bootstrap, namespace) as reader:
        assert idle.receive(QUEUE, top=1, wait=1) == []  # joins the queue's group, reads nothing
        wait_for(lambda: idle.runtime.receiver(QUEUE).stats()["partitions"], 60, "the first reader's partitions")
        assert reader.receive(QUEUE, top=1, wait=1) == []
        wait_for(lambda: reader.runtime.receiver(QUEUE).stats()["partitions"], 60, "the second reader's share")
        assert len(idle.runtime.receiver(QUEUE).stats()["partitions"]) < 4, "the idle reader keeps a share"
        sent = send_claims(reader, 12)
        time.sleep(1.5)
        assert idle.runtime.close_idle_receivers(1.0) == [(QUEUE, None)]
        got: dict[str, int] = {}

        def read() -> bool:
            for m in reader.receive(QUEUE, top=10, wait=1):
                got[m.message_id] = got.get(m.message_id, 0) + 1
            return len(got) >= len(sent)

        wait_for(read, 90, "every claim at the reader that stayed")
        assert set(got) == sent and set(got.values()) == {1}
        assert sorted(reader.runtime.receiver(QUEUE).stats()["partitions"]) == [0, 1, 2, 3]
