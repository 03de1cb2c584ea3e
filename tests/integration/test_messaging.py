"""SEND / RECEIVE / END CONVERSATION against the real broker, with the sample namespace applied."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid

import orjson
import pytest
from confluent_kafka import Consumer, Producer

from kbroker import errors
from kbroker.cli.demo import APPROVAL, CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.dialogs.conversation_endpoint import default_group
from kbroker.kafka.snapshot import read_to_end, watermarks
from kbroker.sdk.broker import END_DIALOG, ERROR_TYPE, Broker
from tests.helpers import KBROKER, wait_for


def end_offsets(bootstrap: str, topic: str) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        # reader.watermarks retries a partition without a leader yet (a queue created a moment
        # ago: a fresh-clone run met "Not leader for partition" here) until its deadline.
        deadline = time.monotonic() + 10
        return [watermarks(c, topic, p, deadline)[1] for p in sorted(parts)]
    finally:
        c.close()


def test_three_messages_come_back_in_order_from_one_receive(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for i in range(3):
        broker.send(h, CLAIM, {"claim": i})
    msgs = broker.receive("ExpenseQueue", top=10, wait=15)
    assert [orjson.loads(m.body)["claim"] for m in msgs] == [0, 1, 2]
    assert [m.message_sequence_number for m in msgs] == [0, 1, 2]
    # The target's own group: derived from the dialog id and the side, not the dialog id itself.
    assert {m.conversation_group_id for m in msgs} == {default_group(msgs[0].conversation_id, "TARGET")}
    assert all(m.message_type_name == CLAIM and m.service_name == EXP for m in msgs)
    assert all(m.service_contract_name == CONTRACT for m in msgs)
    # Committed: nothing is left for the next RECEIVE.
    assert broker.receive("ExpenseQueue", top=10, wait=0) == []


def test_one_receive_returns_one_conversation_group(broker):
    handles = [broker.begin_dialog(EMP, EXP, CONTRACT) for _ in range(3)]
    for round_ in range(2):
        for h in handles:
            broker.send(h, CLAIM, {"r": round_})
    seen = []
    while len(seen) < 3:
        msgs = broker.receive("ExpenseQueue", top=10, wait=15)
        assert msgs, "a conversation went missing"
        assert len({m.conversation_group_id for m in msgs}) == 1
        assert [orjson.loads(m.body)["r"] for m in msgs] == [0, 1]
        seen.append(msgs[0].conversation_id)
    assert len(set(seen)) == 3


def test_out_of_order_completion_survives_a_new_reader(kafka_bootstrap, namespace, broker):
    """Receive half of many groups (offsets complete out of order), then a new process
    receives the rest: nothing lost, nothing received twice."""
    handles = [broker.begin_dialog(EMP, EXP, CONTRACT) for _ in range(40)]
    for h in handles:
        broker.send(h, CLAIM, {"h": h})
    first = []
    for _ in range(20):
        first += [m.message_id for m in broker.receive("ExpenseQueue", top=5, wait=15)]
    broker.close()
    with Broker(kafka_bootstrap, namespace) as second:
        rest = []
        while True:
            msgs = second.receive("ExpenseQueue", top=5, wait=0)
            if not msgs:
                break
            rest += [m.message_id for m in msgs]
    assert len(first) == 20
    assert len(set(first) | set(rest)) == 40, "lost messages"
    assert len(first) + len(rest) == 40, "messages received twice"


def test_reply_end_dialog_and_states(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    assert broker.endpoints.get(h).state == "SO"
    broker.send(h, CLAIM, {"amount": 1})
    claim = broker.receive("ExpenseQueue", wait=15)[0]
    target = claim.conversation_handle
    assert target != h and broker.endpoints.get(target).state == "CO"
    broker.send(target, APPROVAL, {"ok": True})
    reply = broker.receive("EmployeeQueue", wait=15)[0]
    assert reply.conversation_handle == h and reply.message_type_name == APPROVAL
    broker.end_conversation(h)
    assert broker.endpoints.get(h).state == "DO"
    with pytest.raises(errors.ConversationClosedError):
        broker.send(h, CLAIM, {})
    end = broker.receive("ExpenseQueue", wait=15)[0]
    assert end.message_type_name == END_DIALOG and end.body == b""
    assert broker.endpoints.get(target).state == "DI"
    with pytest.raises(errors.ConversationClosedError):
        broker.send(target, APPROVAL, {})
    broker.end_conversation(target)
    assert broker.endpoints.get(target).state == "CD"


def test_the_side_that_ended_first_closes_on_the_peers_acknowledgement(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"amount": 1})
    target = broker.receive("ExpenseQueue", wait=15)[0].conversation_handle
    broker.end_conversation(target)
    assert broker.endpoints.get(target).state == "DO"
    [end] = broker.receive("EmployeeQueue", wait=15)
    assert end.message_type_name == END_DIALOG and broker.endpoints.get(h).state == "DI"
    broker.end_conversation(h)
    # The acknowledgement closes the target's endpoint; its application is not shown it.
    assert broker.receive("ExpenseQueue", top=10, wait=3) == []
    assert broker.endpoints.get(target).state == "CD"


def test_end_with_error_sends_service_broker_error_body(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {})
    target = broker.receive("ExpenseQueue", wait=15)[0].conversation_handle
    broker.end_conversation(target, error=50001, description="claim <rejected>")
    err = broker.receive("EmployeeQueue", wait=15)[0]
    assert err.message_type_name == ERROR_TYPE
    assert b"<Code>50001</Code>" in err.body and b"claim &lt;rejected&gt;" in err.body
    assert broker.endpoints.get(h).state == "ER"
    with pytest.raises(ValueError, match="positive"):
        broker.end_conversation(h, error=-5)


def test_expired_message_is_not_delivered(broker):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"late": True}, time_to_be_received=0.2)
    broker.send(h, CLAIM, {"late": False})
    time.sleep(0.5)
    msgs = broker.receive("ExpenseQueue", top=10, wait=15)
    assert [orjson.loads(m.body) for m in msgs] == [{"late": False}]


# A target service this namespace does not host is not bad input: as in Service Broker, the
# dialog is remote and its messages wait in the transmission queue (test_routing.py).
@pytest.mark.parametrize(
    "case",
    [
        "unknown_from",
        "unknown_contract",
        "wrong_side",
        "type_not_in_contract",
        "invalid_json",
        "oversized",
        "closed",
        "unknown_handle",
        "system_type",
    ],
)
def test_bad_input_is_typed_and_produces_nothing(kafka_bootstrap, namespace, broker, case):
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    topic = names.queue_topic(namespace, "ExpenseQueue")
    before = end_offsets(kafka_bootstrap, topic)
    expected, call = {
        "unknown_from": (errors.UnknownServiceError, lambda: broker.begin_dialog("//nope", EXP, CONTRACT)),
        "unknown_contract": (errors.UnknownContractError, lambda: broker.begin_dialog(EMP, EXP, "//nope")),
        "wrong_side": (errors.ContractViolationError, lambda: broker.send(h, APPROVAL, {})),
        "type_not_in_contract": (errors.ContractViolationError, lambda: broker.send(h, "DEFAULT", b"x")),
        "invalid_json": (errors.MessageValidationError, lambda: broker.send(h, CLAIM, b"{not json")),
        "oversized": (errors.MessageTooLargeError, lambda: broker.send(h, CLAIM, b'"' + b"x" * (1024 * 1024) + b'"')),
        "closed": (errors.ConversationClosedError, lambda: (broker.end_conversation(h), broker.send(h, CLAIM, {}))),
        "unknown_handle": (
            errors.ConversationNotFoundError,
            lambda: broker.send("00000000-0000-0000-0000-000000000000", CLAIM, {}),
        ),
        "system_type": (errors.ContractViolationError, lambda: broker.send(h, END_DIALOG, b"")),
    }[case]
    with pytest.raises(expected) as info:
        call()
    assert str(info.value)  # names the problem
    assert end_offsets(kafka_bootstrap, topic) == before, "a refused SEND produced something"


def test_receive_on_unknown_queue_is_typed(broker):
    with pytest.raises(errors.UnknownQueueError, match="NoSuchQueue"):
        broker.receive("NoSuchQueue")


def test_malformed_record_goes_to_dead_letter_and_reader_goes_on(kafka_bootstrap, namespace, broker):
    topic = names.queue_topic(namespace, "ExpenseQueue")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for part in range(4):  # one on every partition, whichever the good message lands on
        p.produce(topic, key=b"junk", value=b"not a kbroker message", partition=part)
    p.flush(10)
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"good": True})
    msgs = broker.receive("ExpenseQueue", wait=15)
    assert [orjson.loads(m.body) for m in msgs] == [{"good": True}]
    assert broker.receive("ExpenseQueue", wait=0) == []

    dlq = names.deadletter_topic(namespace)
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "dlq-check", "auto.offset.reset": "earliest"})
    c.subscribe([dlq])
    got, deadline = [], time.monotonic() + 20
    while len(got) < 4 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    c.close()
    assert len(got) == 4
    reasons = {dict(m.headers())["kb.dlq.reason"].decode() for m in got}
    assert all("missing header" in r for r in reasons)
    assert all(m.value() == b"not a kbroker message" for m in got)


def test_records_with_bad_header_values_are_dead_lettered_and_the_messages_around_them_go_on(
    kafka_bootstrap, namespace, broker
):
    """The queue's reader decodes each header value once, as it comes. Another client copies a
    real message's headers (its key, partition and group) and breaks one thing in each copy: a
    value that is not UTF-8, a required header without a value, a header written twice (the last
    counts), a 200 KB type name. Each copy is dead-lettered with its reason, and the SENDs before
    and after them are received once, in order, on the same partition."""
    topic, dead = names.queue_topic(namespace, "ExpenseQueue"), names.deadletter_topic(namespace)
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    first = broker.send(h, CLAIM, {"n": 0})
    original = next(
        r for r in read_to_end(kafka_bootstrap, topic) or [] if dict(r.headers())["kb.message_id"] == first.encode()
    )

    def copy(name: str, value: bytes | None, *, add: bool = False) -> list[tuple[str, bytes | None]]:
        hs = [(k, uuid.uuid4().hex.encode() if k == "kb.message_id" else v) for k, v in original.headers()]
        return hs + [(name, value)] if add else [(k, value if k == name else v) for k, v in hs]

    copies = {
        "not UTF-8": copy("kb.message_type_name", b"\xff\xfe"),
        "bad number": copy("kb.message_sequence_number", None),
        "kb.to_side is 'SIDEWAYS'": copy("kb.to_side", b"SIDEWAYS", add=True),
        "refused on arrival": copy("kb.message_type_name", b"T" * 200_000),
    }
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for headers in copies.values():
        p.produce(topic, key=original.key(), value=original.value(), headers=headers, partition=original.partition())
    assert p.flush(10) == 0
    second = broker.send(h, CLAIM, {"n": 1})

    got: list[str] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += [m.message_id for m in broker.receive("ExpenseQueue", top=10, wait=1)]
    assert got == [first, second]
    assert broker.receive("ExpenseQueue", wait=1) == []
    wait_for(lambda: len(read_to_end(kafka_bootstrap, dead) or []) >= len(copies), 20, "the dead letters")
    letters = read_to_end(kafka_bootstrap, dead) or []
    reasons = [dict(m.headers())["kb.dlq.reason"].decode() for m in letters]
    assert len(letters) == len(copies), reasons
    for problem in copies:
        assert sum(problem in r for r in reasons) == 1, (problem, reasons)


def test_record_is_readable_by_a_standard_client(kafka_bootstrap, namespace, broker):
    """aiokafka (the client under Faust) reads body and headers as plain bytes."""
    from aiokafka import AIOKafkaConsumer

    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"amount": 12.5}, correlation_id="corr-1")

    async def read_one():
        c = AIOKafkaConsumer(
            names.queue_topic(namespace, "ExpenseQueue"),
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
            isolation_level="read_committed",
        )
        await c.start()
        try:
            return await asyncio.wait_for(c.getone(), 30)
        finally:
            await c.stop()

    rec = asyncio.run(read_one())
    headers = {k: v.decode() for k, v in rec.headers}
    assert json.loads(rec.value) == {"amount": 12.5}
    assert headers["kb.message_type_name"] == CLAIM
    assert headers["kb.correlation_id"] == "corr-1"
    assert headers["kb.from_service_name"] == EMP and headers["kb.to_service_name"] == EXP
    assert rec.key.decode() == headers["kb.conversation_group_id"]


def run_cli(*args, bootstrap, namespace):
    env = {**os.environ, "KBROKER_BOOTSTRAP": bootstrap, "KBROKER_NAMESPACE": namespace}
    return subprocess.run([KBROKER, *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_send_receive_end(kafka_bootstrap, namespace, broker):
    kw = dict(bootstrap=kafka_bootstrap, namespace=namespace)
    out = run_cli(
        "send",
        "--from",
        EMP,
        "--to",
        EXP,
        "--contract",
        CONTRACT,
        "--type",
        CLAIM,
        "--body",
        '{"n": 1}',
        "--json",
        **kw,
    )
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    out = run_cli(
        "send", "--conversation", sent["conversation_handle"], "--type", CLAIM, "--body", '{"n": 2}', "--json", **kw
    )
    assert out.returncode == 0, out.stderr
    out = run_cli("receive", "ExpenseQueue", "--top", "5", "--wait", "15", "--json", **kw)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [json.loads(r["body"])["n"] for r in rows] == [1, 2]
    assert rows[0]["message_id"] == sent["message_id"]
    for field in (
        "queue",
        "conversation_handle",
        "conversation_group_id",
        "message_sequence_number",
        "message_type_name",
        "service_name",
        "service_contract_name",
        "message_id",
        "body",
    ):
        assert field in rows[0]
    out = run_cli("end", sent["conversation_handle"], "--json", **kw)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "DO", out.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["send", "--from", "//nope", "--to", EXP, "--contract", CONTRACT, "--type", CLAIM, "--body", "{}"],
            "unknown service '//nope'",
        ),
        (
            ["send", "--from", EMP, "--to", EXP, "--contract", CONTRACT, "--type", CLAIM, "--body", "{bad"],
            "fails JSON validation",
        ),
        (
            ["send", "--from", EMP, "--to", EXP, "--contract", CONTRACT, "--type", CLAIM, "--body", "@/no/such/file"],
            "/no/such/file",
        ),
        (["receive", "NoSuchQueue"], "unknown queue 'NoSuchQueue'"),
        (["end", "00000000-0000-0000-0000-000000000000"], "does not exist"),
    ],
)
def test_cli_errors_are_one_line(kafka_bootstrap, namespace, broker, args, needle):
    out = run_cli(*args, bootstrap=kafka_bootstrap, namespace=namespace)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


def test_records_another_client_wrote_are_checked_on_arrival(kafka_bootstrap, namespace, broker):
    """Records written straight onto the queue topic with complete, well-formed kb.* headers
    never passed SEND's checks. The receiving side checks them as Service Broker does where a
    message arrives: an unknown type, a type the contract does not let that side send, and a
    body its type's validation refuses are dead-lettered with the reason, and the queue goes on
    to the next message. Before, all three were delivered."""
    from uuid import uuid4

    from kbroker.core.dialogs.envelope import Envelope
    from kbroker.kafka.snapshot import read_to_end

    forged = [
        ("//Adventure-Works.com/Expenses/NoSuchType", b"{}"),
        (APPROVAL, b"{}"),  # sent by the TARGET only, here sent to it
        (CLAIM, b"not json"),
    ]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for kind, body in forged:
        conversation = str(uuid4())
        env = Envelope(str(uuid4()), conversation, conversation, 0, kind, CONTRACT, EMP, EXP, "TARGET")
        producer.produce(
            names.queue_topic(namespace, "ExpenseQueue"), key=conversation.encode(), value=body, headers=env.headers()
        )
    assert producer.flush(30) == 0
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    good = broker.send(handle, CLAIM, {"amount": 1})

    delivered = []
    deadline = time.monotonic() + 30
    while not delivered and time.monotonic() < deadline:
        delivered = broker.receive("ExpenseQueue", top=10, wait=1)
    assert [m.message_id for m in delivered] == [good]
    assert broker.receive("ExpenseQueue", top=10, wait=2) == []

    # Committed is not yet readable: Kafka writes a commit's markers after EndTxn has answered,
    # so a read-committed reader may stop short of the last RECEIVE's dead letter for a moment
    # (a loaded run read two of the three). Read again until all three are there.
    def reasons_read() -> list[str]:
        letters = read_to_end(kafka_bootstrap, names.deadletter_topic(namespace), 15) or []
        return sorted(dict(m.headers())["kb.dlq.reason"].decode() for m in letters)

    reasons = wait_for(
        lambda: (r := reasons_read()) and len(r) >= 3 and r, 30, "the three dead letters", seen=reasons_read
    )
    assert len(reasons) == 3 and all(r.startswith("refused on arrival") for r in reasons), reasons
    assert any("NoSuchType" in r for r in reasons) and any("JSON" in r for r in reasons), reasons


def receive_once_all_arrived(broker, queue: str, count: int, top: int | None = None) -> list:
    """One RECEIVE that returns `count` messages: while fewer have arrived, what a RECEIVE took
    is rolled back (given back, in order) and it is asked again (30 s at most)."""
    got: list = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        with broker.transaction() as tx:
            got = tx.receive(queue, top=top, wait=1)
            if len(got) < count:
                tx.rollback()
                time.sleep(0.3)
    return got


def test_receive_returns_a_groups_conversations_one_after_the_other(kafka_bootstrap, namespace, broker):
    """Two dialogs in one conversation group (RELATED_CONVERSATION), their replies arriving
    interleaved: one RECEIVE returns one conversation's messages together, in sequence, then the
    other's (reference item 97). Before, they came in arrival order, interleaved."""
    h1 = broker.begin_dialog(EMP, EXP, CONTRACT)
    h2 = broker.begin_dialog(EMP, EXP, CONTRACT, related_conversation=h1)
    broker.send(h1, CLAIM, {"n": 1})
    broker.send(h2, CLAIM, {"n": 2})
    targets = {}
    deadline = time.monotonic() + 30
    while len(targets) < 2 and time.monotonic() < deadline:
        for m in broker.receive("ExpenseQueue", top=10, wait=1):
            targets[m.conversation_id] = m.conversation_handle
    t1, t2 = (targets[broker.endpoints.get(h).conversation_id] for h in (h1, h2))
    for t in (t1, t2, t1, t2):
        broker.send(t, APPROVAL, {"ok": True})
    got = receive_once_all_arrived(broker, "EmployeeQueue", 4, top=10)
    assert [(m.conversation_handle, m.message_sequence_number) for m in got] == [(h1, 0), (h1, 1), (h2, 0), (h2, 1)]


def test_receive_without_top_returns_the_whole_group(kafka_bootstrap, namespace, broker):
    """RECEIVE without TOP returns every ready message of the group it locks, as Service Broker's
    does (reference item 94); TOP(n) caps it. Before, the SDK's default was TOP(1)."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    for n in range(5):
        broker.send(h, CLAIM, {"n": n})
    got = receive_once_all_arrived(broker, "ExpenseQueue", 5)
    assert [m.message_sequence_number for m in got] == [0, 1, 2, 3, 4]


def test_end_with_cleanup_discards_the_conversations_queued_messages(kafka_bootstrap, namespace, broker):
    """END CONVERSATION WITH CLEANUP on the target also removes the messages queued for it: they
    are never delivered, and they do not bring the endpoint back. Before, the endpoint was
    deleted and the next queued message created it anew and was delivered."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"n": 0})
    [first] = broker.receive("ExpenseQueue", top=1, wait=15)
    target = first.conversation_handle
    broker.send(h, CLAIM, {"n": 1})
    broker.send(h, CLAIM, {"n": 2})
    broker.end_conversation(target, cleanup=True)
    assert broker.receive("ExpenseQueue", wait=3) == []
    with Broker(kafka_bootstrap, namespace) as other:  # what the topic says, not this process's cache
        assert other.endpoints.get(target).state == "CD"
    # Discarded as asked, not set aside as a closed dialog's messages are (nothing dead-lettered).
    from kbroker.kafka.snapshot import read_to_end

    assert (read_to_end(kafka_bootstrap, names.deadletter_topic(namespace), 15) or []) == []


def test_a_queue_disabled_elsewhere_stops_a_waiting_receive_within_a_second(kafka_bootstrap, namespace, broker):
    """ALTER QUEUE ... STATUS = OFF by another process reaches a process that reads the queue
    within about a second: its RECEIVE waiting on the empty queue returns with
    QueueDisabledError, and so does the next one. Before, the process learnt of it only when its
    catalog was read again (a running reader committed 125 more messages over 13 s)."""
    import threading

    from kbroker.kafka.queue_views import set_queue_status

    assert broker.receive("ExpenseQueue", wait=0) == []  # this process reads the queue
    outcome: list = []

    def waiting_receive() -> None:
        try:
            outcome.append(broker.receive("ExpenseQueue", wait=30))
        except errors.QueueDisabledError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=waiting_receive)
    waiter.start()
    time.sleep(1.0)  # the RECEIVE is waiting
    disabled_at = time.monotonic()
    set_queue_status(kafka_bootstrap, namespace, "ExpenseQueue", "OFF", "test")  # as another process would
    waiter.join(timeout=30)
    took = time.monotonic() - disabled_at
    assert outcome and isinstance(outcome[0], errors.QueueDisabledError), outcome
    assert took < 2.0, f"the waiting RECEIVE returned {took:.1f} s after the queue was disabled"
    with pytest.raises(errors.QueueDisabledError):
        broker.receive("ExpenseQueue", wait=0)


def test_a_send_on_a_dialog_another_process_of_its_side_ended_raises(kafka_bootstrap, namespace, broker):
    """Outside the race, the other process learns of the end before its SEND: it reads the
    endpoints topic again when its last read is more than a second old, and the SEND raises
    ConversationClosedError. Before, it SENT from its copy."""
    h = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(h, CLAIM, {"claim": 0})
    with Broker(kafka_bootstrap, namespace) as other:
        assert other.endpoints.get(h).state == "CO"
        broker.end_conversation(h)
        time.sleep(1.2)
        with pytest.raises(errors.ConversationClosedError):
            other.send(h, CLAIM, {"claim": "after the end"})
        with pytest.raises(errors.ConversationClosedError):
            with other.transaction() as tx:
                tx.send(h, CLAIM, {"claim": "after the end, in a transaction"})
