"""A second reader joining while the first still waits for its partitions' committed offsets.

At start-up on a loaded cluster the rebalance callback's one-second ask for committed offsets can
time out, so every partition the group gave the first reader waits (kafka/receive/partition_assignment.py)
and is asked for again off the poll thread. If a second reader joins then, the group revokes
half of those waiting partitions from the first. The revocation must finish, so the group hands
them to the second: before, the callback left the unassign to confluent-kafka's binding, whose
unassign of partitions never assigned fails, and the partitions stayed with nobody until the
first reader left (seen as a 20 s stall in every run of this shape).
"""

from __future__ import annotations

import threading
import time

import orjson

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.kafka.receive import partition_assignment
from kbroker.kafka.receive.receiver import QueueReceiver
from kbroker.sdk.broker import Broker

DIALOGS = 12  # over the queue's 4 partitions: both readers' halves hold some
FIRST_ASK_BOUND = 30.0  # the longest the first reader's first ask waits for the second to be given partitions
BOUND = 60.0


def test_partitions_revoked_while_waiting_for_their_offsets_go_to_the_reader_that_joined(
    kafka_bootstrap, namespace, broker, monkeypatch
):
    monkeypatch.setattr(partition_assignment, "ASSIGN_ASK", 0.001)  # the callback's ask always times out
    # The first reader's first ask off the poll thread waits until the second reader asks too,
    # which it does once it has been given partitions (at most FIRST_ASK_BOUND): so the group
    # revokes partitions from the first while they all still wait, however long the second
    # takes to join on a loaded machine.
    first_asker: list[QueueReceiver] = []
    second_assigned = threading.Event()
    ask = QueueReceiver._committed_by_reader

    def held_first_ask(self, partitions):
        if not first_asker:
            first_asker.append(self)
            second_assigned.wait(FIRST_ASK_BOUND)
        elif self is not first_asker[0]:
            second_assigned.set()
        return ask(self, partitions)

    monkeypatch.setattr(QueueReceiver, "_committed_by_reader", held_first_ask)
    for i in range(DIALOGS):
        broker.send(broker.begin_dialog(EMP, EXP, CONTRACT), CLAIM, {"i": i})

    got: dict[str, list[int]] = {"first": [], "second": []}
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []

    def read(name: str) -> None:
        try:
            with Broker(kafka_bootstrap, namespace) as reader:
                while not done.is_set():
                    with reader.transaction() as tx:
                        msgs = tx.receive("ExpenseQueue", top=10, wait=0.5)
                    with lock:
                        got[name] += [orjson.loads(m.body)["i"] for m in msgs]
                        if sum(len(v) for v in got.values()) >= DIALOGS:
                            done.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            done.set()

    first = threading.Thread(target=read, args=("first",))
    second = threading.Thread(target=read, args=("second",))
    started = time.monotonic()
    first.start()
    time.sleep(1.5)  # the first has joined and waits for its offsets
    second.start()
    done.wait(BOUND)
    took = time.monotonic() - started
    done.set()
    first.join(60)
    second.join(60)
    assert not errors, errors
    received = got["first"] + got["second"]
    assert sorted(received) == list(range(DIALOGS)), (
        f"after {took:.0f} s the readers had {got}: the partitions revoked while they waited for "
        f"their offsets went to nobody"
    )
    # Not asserted: that the second reader was given partitions. On a loaded machine the group
    # may rebalance late or hand everything back to the first (a fresh-clone run saw the first
    # receive all 12); what must hold is that no partition is left with nobody.
    print(
        f"\nevery message received {took:.1f} s after the first reader started: {got}; the second "
        f"was given partitions while the first waited: {second_assigned.is_set()}"
    )
