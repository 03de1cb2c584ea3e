"""Conversation groups against the real broker: RELATED_CONVERSATION(_GROUP) and MOVE CONVERSATION,
including the re-keying of records queued under a moved conversation's old group (the pure chain
rules are tested in tests/unit/test_group_chain.py)."""

from __future__ import annotations

import threading
import uuid

import orjson
import pytest

from kbroker import errors
from kbroker.cli.demo import APPROVAL, CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.conversation_endpoint import SEQUENCE_BLOCK, handle_for
from kbroker.core.dialogs.send_lease import LEASE_SUFFIX
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import wait_for

from .test_messaging import end_offsets


def drain(broker: Broker, queue: str, wait: float = 5.0) -> list:
    """Receive until the queue has nothing more, one RECEIVE (= one group) at a time."""
    got = []
    while True:
        msgs = broker.receive(queue, top=50, wait=wait)
        if not msgs:
            return got
        got.append(msgs)


def test_related_dialogs_reply_into_one_group(broker):
    g = str(uuid.uuid4())
    h1 = broker.begin_dialog(EMP, EXP, CONTRACT, related_conversation_group=g)
    h2 = broker.begin_dialog(EMP, EXP, CONTRACT, related_conversation=h1)
    h3 = broker.begin_dialog(EMP, EXP, CONTRACT)  # its own group
    for h in (h1, h2, h3):
        broker.send(h, CLAIM, {"h": h})
    # The target replies once on each conversation; it keys them by the group the initiator told it.
    for _ in range(3):
        with broker.transaction() as tx:
            for m in tx.receive("ExpenseQueue", top=10, wait=15):
                tx.send(m.conversation_handle, APPROVAL, {"h": orjson.loads(m.body)["h"]})
    with broker.transaction() as tx:
        got = tx.receive("EmployeeQueue", top=10, wait=15, conversation_group=g)
        # One RECEIVE returns the group's messages across both related conversations ...
        assert sorted(m.conversation_handle for m in got) == sorted([h1, h2])
        assert {m.conversation_group_id for m in got} == {g}
        # ... and the group lock covers them all: no other reader gets either conversation.
        other = []
        t = threading.Thread(
            target=lambda: other.extend(broker.receive("EmployeeQueue", top=10, wait=2, conversation_group=g))
        )
        t.start()
        t.join()
        assert other == []
    rest = broker.receive("EmployeeQueue", top=10, wait=15)
    assert [m.conversation_handle for m in rest] == [h3]
    assert rest[0].conversation_group_id != g


def test_related_conversation_inside_a_transaction(broker):
    with broker.transaction() as tx:
        h1 = tx.begin_dialog(EMP, EXP, CONTRACT)  # staged, not yet in the endpoints topic
        h2 = tx.begin_dialog(EMP, EXP, CONTRACT, related_conversation=h1)
    assert broker.endpoints.get(h2).conversation_group_id == broker.endpoints.get(h1).conversation_group_id


@pytest.mark.parametrize("case", ["unknown handle", "both clauses", "not a guid", "other queue"])
def test_bad_related_conversation_is_typed_and_produces_nothing(kafka_bootstrap, namespace, broker, case):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {})
    broker.receive("ExpenseQueue", top=1, wait=15)  # creates the target endpoint (ExpenseQueue)
    target = handle_for(broker.endpoints.get(h).conversation_id, "TARGET")
    topic = names.endpoints_topic(namespace)

    def keys() -> set[bytes]:
        return {r.key() for r in read_to_end(kafka_bootstrap, topic, 60, must_finish=True) or []}

    before = keys()
    kw, error = {
        "unknown handle": ({"related_conversation": str(uuid.uuid4())}, errors.ConversationNotFoundError),
        "both clauses": ({"related_conversation": h, "related_conversation_group": str(uuid.uuid4())}, ValueError),
        "not a guid": ({"related_conversation_group": "group-1"}, ValueError),
        "other queue": ({"related_conversation": target}, errors.ConversationGroupError),
    }[case]
    with pytest.raises(error):
        broker.begin_dialog(EMP, EXP, CONTRACT, **kw)
    # No endpoint or lease of a new dialog (the existing dialog's lease may be released or renewed
    # meanwhile: its key is there already).
    assert keys() <= before


def test_move_rekeys_queued_messages_in_order_exactly_once(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(3):
        broker.send(h, CLAIM, {"i": i})
    first = broker.receive("ExpenseQueue", top=1, wait=15)  # creates the target endpoint
    assert [m.message_sequence_number for m in first] == [0]
    target, old = first[0].conversation_handle, first[0].conversation_group_id
    g = str(uuid.uuid4())
    broker.move_conversation(target, g)
    assert broker.endpoints.get(target).conversation_group_id == g
    for i in range(3, 6):  # the initiator keeps sending with the key it knows
        broker.send(h, CLAIM, {"i": i})
    batches = drain(broker, "ExpenseQueue")
    got = [m for batch in batches for m in batch]
    assert [m.message_sequence_number for m in got] == [1, 2, 3, 4, 5]
    assert [orjson.loads(m.body)["i"] for m in got] == [1, 2, 3, 4, 5]
    assert {m.conversation_group_id for m in got} == {g}
    assert old != g
    # Replies after the move still reach the initiator; the target's own group is the moved one.
    broker.send(target, APPROVAL, {"ok": True})
    assert [m.message_type_name for m in broker.receive("EmployeeQueue", top=5, wait=15)] == [APPROVAL]


def test_move_by_another_process_reaches_the_reader_through_the_marker(kafka_bootstrap, namespace, broker, monkeypatch):
    """The reader cached the endpoint before another process moved the conversation: it learns
    of the move from the marker in the old group's stream. The reader only receives, so it holds
    no conversation lease and nothing else reads the endpoints topic for it meanwhile (a process
    that holds one reads the topic every 0.25 s and could learn of the move first: a fresh-clone
    run once did, when the reader was also the sender). The reader also reads the topic when the
    mover's group hold ends (test_two_readers_never_hold_a_moved_conversation_at_once): switched
    off here, so the marker alone must tell it."""
    monkeypatch.setattr(broker.runtime.group_holds, "_catch_up", None)
    with Broker(kafka_bootstrap, namespace) as sender:
        h = sender.begin_dialog(EMP, EXP, CONTRACT)
        for i in range(3):
            sender.send(h, CLAIM, {"i": i})
        first = broker.receive("ExpenseQueue", top=1, wait=15)
        target = first[0].conversation_handle
        g = str(uuid.uuid4())
        with Broker(kafka_bootstrap, namespace) as stale_writer:
            # A transaction's records are readable once its commit markers are written, a
            # moment after the commit returns.
            before = wait_for(lambda: stale_writer.endpoints.find(target), 10, "the target endpoint")
            with Broker(kafka_bootstrap, namespace) as mover:
                mover.move_conversation(target, g)
            # A process that cached the endpoint before the move writes it again without the
            # move: the move survives (the chain has its own key in the endpoints topic).
            stale_writer.endpoints.put(before)
        assert broker.endpoints.cached(target).conversation_group_id != g  # stale in the reader
        with Broker(kafka_bootstrap, namespace) as fresh:
            wait_for(lambda: fresh.endpoints.current(target).conversation_group_id == g, 10, "the move")
        for i in range(3, 6):
            sender.send(h, CLAIM, {"i": i})
        got = [m for batch in drain(broker, "ExpenseQueue") for m in batch]
        # What the reader saw, for a failure to say.
        seen = [(m.message_sequence_number, m.message_type_name, m.conversation_group_id) for m in got]
        state = f"moved to {g}; received {seen}; the reader's cache {broker.endpoints.cached(target)}"
        assert [m.message_sequence_number for m in got] == [1, 2, 3, 4, 5], state
        # Records behind the marker are delivered in the new group only.
        assert {m.conversation_group_id for m in got if m.message_sequence_number >= 3} == {g}, state
        assert broker.endpoints.cached(target).conversation_group_id == g, state
        # The reader's reply goes out of the moved endpoint (its first SEND reserves a block:
        # another process continues past it) and reaches the initiator.
        broker.send(target, APPROVAL, {"ok": True})
        with Broker(kafka_bootstrap, namespace) as fresh:
            ep = wait_for(lambda: (e := fresh.endpoints.current(target)).send_sequence > 0 and e, 10, "the reply")
            assert (ep.conversation_group_id, ep.send_sequence) == (g, 1 + SEQUENCE_BLOCK)
        assert [m.message_type_name for m in sender.receive("EmployeeQueue", top=5, wait=15)] == [APPROVAL]


def test_two_readers_never_hold_a_moved_conversation_at_once(kafka_bootstrap, namespace, broker, monkeypatch):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(4):
        broker.send(h, CLAIM, {"i": i})
    target = broker.receive("ExpenseQueue", top=1, wait=15)[0].conversation_handle
    g = str(uuid.uuid4())
    tx_a = broker.transaction()
    held = tx_a.receive("ExpenseQueue", top=1, wait=15)  # reader A holds the old group
    assert [m.message_sequence_number for m in held] == [1]
    # Moved by another process: MOVE waits for A's group lock there too (a hold the reader
    # grants once A ends, kafka/dialogs/group_holds.py).
    moved = threading.Event()
    with Broker(kafka_bootstrap, namespace) as mover:

        def move() -> None:
            mover.move_conversation(target, g)
            moved.set()

        t_move = threading.Thread(target=move)
        t_move.start()
        for i in range(4, 6):
            broker.send(h, CLAIM, {"i": i})
        # Reader B, meanwhile: the old group is locked by A, and nothing of the conversation can
        # be in the new group before it passed through the old one.
        seen_by_b: list = []
        t = threading.Thread(target=lambda: seen_by_b.extend(broker.receive("ExpenseQueue", top=10, wait=3)))
        t.start()
        t.join()
        assert seen_by_b == []
        assert not moved.is_set(), "MOVE in another process went through while A held the group"
        tx_a.commit()
        t_move.join(30)
        assert moved.is_set(), "MOVE did not get the group once A committed"
    with monkeypatch.context() as mp:
        # The reader's other reads of the endpoints topic (its lease keeper's, every few
        # seconds) stop here: what hands the old group's records out in the new one is the
        # read of what the mover wrote, made when the mover's hold ends.
        mp.setattr(broker.runtime.endpoints, "refresh", lambda: None)
        # Before any RECEIVE meets the move's marker: the reader's holds thread read the moved
        # endpoint when the mover's hold ended, before the group's records went out again.
        wait_for(lambda: g in broker.endpoints.cached(target).chain, 10, "the moved endpoint")
        # A rollback after the re-keying leaks no lock: the messages come back to the next reader.
        with pytest.raises(RuntimeError):
            with broker.transaction() as tx:
                got = tx.receive("ExpenseQueue", top=10, wait=15)
                assert got and {m.conversation_group_id for m in got} == {g}
                raise RuntimeError("handler failed")
        got = [m for batch in drain(broker, "ExpenseQueue") for m in batch]
    assert [m.message_sequence_number for m in got] == [2, 3, 4, 5]
    assert {m.conversation_group_id for m in got} == {g}
    assert broker.runtime.receiver("ExpenseQueue").stats()["locked_groups"] == 0  # every group lock was released


@pytest.mark.parametrize("case", ["unknown handle", "not a guid", "other queue"])
def test_bad_move_is_typed_and_produces_nothing(kafka_bootstrap, namespace, broker, case):
    g = str(uuid.uuid4())
    h = broker.begin_dialog(EMP, EXP, CONTRACT, related_conversation_group=g)  # g: EmployeeQueue's
    broker.send(h, CLAIM, {})
    target = broker.receive("ExpenseQueue", top=1, wait=15)[0].conversation_handle
    queue_topic = names.queue_topic(namespace, "ExpenseQueue")

    def written() -> tuple[list[bytes], list[int]]:
        """Endpoint records (not leases: a lock taken and let go is not a change) and the queue."""
        # must_finish: on a loaded machine a 15 s read came back short of one partition's end.
        records = read_to_end(kafka_bootstrap, names.endpoints_topic(namespace), 60, must_finish=True) or []
        # Sorted: a read interleaves the topic's partitions in no fixed order.
        return sorted(m.key() for m in records if not m.key().endswith(LEASE_SUFFIX.encode())), end_offsets(
            kafka_bootstrap, queue_topic
        )

    before = written()
    handle, group, error = {
        "unknown handle": (str(uuid.uuid4()), str(uuid.uuid4()), errors.ConversationNotFoundError),
        "not a guid": (target, "group-1", ValueError),
        "other queue": (target, g, errors.ConversationGroupError),
    }[case]
    with pytest.raises(error):
        broker.move_conversation(handle, group)
    assert written() == before


def test_move_inside_the_receiving_transaction_and_a_rolled_back_move(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(4):
        broker.send(h, CLAIM, {"i": i})
    g1, g2 = str(uuid.uuid4()), str(uuid.uuid4())
    with broker.transaction() as tx:  # RECEIVE, then MOVE what it received from: Service Broker's way
        got = tx.receive("ExpenseQueue", top=2, wait=15)
        target = got[0].conversation_handle
        tx.move_conversation(target, g1)
    with pytest.raises(RuntimeError):
        with broker.transaction() as tx:
            tx.move_conversation(target, g2)
            raise RuntimeError("changed my mind")
    assert broker.endpoints.get(target).conversation_group_id == g1
    got = [m for batch in drain(broker, "ExpenseQueue") for m in batch]
    assert [(m.message_sequence_number, m.conversation_group_id) for m in got] == [(2, g1), (3, g1)]


SHARED_QUEUE = """
message_types: [{name: //t/Ask}, {name: //t/Answer}]
contracts:
  - name: //t/AskAnswer
    messages: [{type: //t/Ask, sent_by: INITIATOR}, {type: //t/Answer, sent_by: TARGET}]
queues: [{name: Shared, partitions: 1}]
services:
  - {name: //t/Asker, queue: Shared}
  - {name: //t/Answerer, queue: Shared, contracts: [//t/AskAnswer]}
"""


def test_a_dialog_between_two_services_of_one_queue_does_not_lock_itself(kafka_bootstrap, namespace, tmp_path):
    """Each side has its own default group (reference item 104): while one transaction holds
    the target's group (it received an Ask), another RECEIVE on the same queue takes the
    initiator's Answer. Before, both sides' group was the dialog id: the second RECEIVE waited
    for the first transaction and came back empty."""
    from kbroker.kafka.catalog.apply import apply_paths

    (tmp_path / "shared.yaml").write_text(SHARED_QUEUE)
    apply_paths(kafka_bootstrap, namespace, [tmp_path / "shared.yaml"])
    with Broker(kafka_bootstrap, namespace) as b:
        h = b.begin_dialog("//t/Asker", "//t/Answerer", "//t/AskAnswer")
        b.send(h, "//t/Ask", b"1")
        with b.transaction() as tx:
            ask = tx.receive("Shared", wait=15)
            assert [m.message_type_name for m in ask] == ["//t/Ask"]
            tx.send(ask[0].conversation_handle, "//t/Answer", b"a")
        b.send(h, "//t/Ask", b"2")  # the queue now holds an Answer (initiator) and an Ask (target)
        holder, other = b.transaction(), b.transaction()
        try:
            first = holder.receive("Shared", wait=15)
            second = other.receive("Shared", wait=5)
            assert sorted(m.message_type_name for m in first + second) == ["//t/Answer", "//t/Ask"]
            assert first[0].conversation_group_id != second[0].conversation_group_id
        finally:
            other.rollback()
            holder.rollback()
