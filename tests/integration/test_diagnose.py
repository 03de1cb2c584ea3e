"""`kbroker diagnose configuration` on the real broker: two namespaces set up as the routing tests
set them up, then broken one way at a time; each problem is named by its code, and the command
exits 1 exactly when one would stop the dialog."""

from __future__ import annotations

import subprocess

import orjson

from kbroker.core import names
from kbroker.kafka.catalog.apply import apply_paths
from tests.helpers import KBROKER, free_port, wait_for
from tests.integration.test_routing import CLIENT, CONTRACT, SERVER, catalog_yaml, setup_catalogs


def diagnose(bootstrap: str, ns: str, *extra: str, timeout: float = 10.0) -> tuple[int, dict]:
    done = subprocess.run(
        [
            KBROKER,
            "diagnose",
            "configuration",
            CLIENT,
            SERVER,
            "--contract",
            CONTRACT,
            "--bootstrap",
            bootstrap,
            "--namespace",
            ns,
            "--json",
            "--timeout",
            str(timeout),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1) and done.stdout, (done.returncode, done.stderr)
    return done.returncode, orjson.loads(done.stdout)


def codes(report: dict) -> dict[str, str]:
    return {p["code"]: p["where"] for p in report["problems"]}


def test_a_working_pair_has_no_error_and_follows_the_route(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    setup_catalogs(kafka_bootstrap, tmp_path, a, b)
    rc, report = diagnose(kafka_bootstrap, a)
    assert rc == 0, report
    assert report["to"] == f"{kafka_bootstrap}/{b}"  # found where A's route leads
    # The routing tests' catalogs differ on purpose: A's contract lists a type B's does not.
    assert codes(report) == {"contract_differs": b}
    assert all(p["severity"] == "warning" for p in report["problems"])


def test_a_missing_route_a_refused_sender_and_a_disabled_queue_are_each_named(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    setup_catalogs(kafka_bootstrap, tmp_path, a, b, route_to_b=False, server_extra=", remote_senders: [somebody]")
    # No route of A's names the server: AutoCreatedLocal keeps it in A, where it is not defined.
    rc, report = diagnose(kafka_bootstrap, a)
    assert rc == 1 and report["to"] == f"{kafka_bootstrap}/{a}", report
    assert codes(report) == {"service_missing": a}, report
    # Told where the far end is, the dialog is checked there too.
    rc, report = diagnose(kafka_bootstrap, a, "--to-namespace", b)
    assert rc == 1
    assert codes(report) == {"route_missing": a, "sender_not_granted": b, "contract_differs": b}, report
    subprocess.run(
        [KBROKER, "queue", "disable", "Q", "--bootstrap", kafka_bootstrap, "--namespace", b],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rc, report = diagnose(kafka_bootstrap, a, "--to-namespace", b)
    assert rc == 1 and codes(report).get("queue_disabled") == b, report


def route_to_nowhere(bootstrap: str, tmp_path, ns: str, address: str) -> None:
    """Namespace `ns` hosts CLIENT, with a route for SERVER to `address`, where nothing answers."""
    path = tmp_path / f"{ns}.yaml"
    path.write_text(
        catalog_yaml(
            services=f"  - {{name: '{CLIENT}', queue: Q}}",
            with_odd=False,
            routes=f"routes:\n  - {{name: ToB, service_name: '{SERVER}', address: '{address}'}}",
        )
    )
    apply_paths(bootstrap, ns, [path])


def test_a_route_to_a_cluster_that_does_not_answer_is_named(kafka_bootstrap, namespace, tmp_path):
    a, b, dead = namespace + "a", namespace + "b", f"127.0.0.1:{free_port()}"
    route_to_nowhere(kafka_bootstrap, tmp_path, a, f"kafka://{dead}/{b}")
    rc, report = diagnose(kafka_bootstrap, a, timeout=5)  # how long the dead cluster is waited for
    assert rc == 1 and report["to"] == f"{dead}/{b}"
    assert codes(report) == {"far_unreachable": b}, report


def runtime(bootstrap: str, ns: str, *extra: str) -> tuple[int, dict]:
    done = subprocess.run(
        [KBROKER, "diagnose", "runtime", "--bootstrap", bootstrap, "--namespace", ns, "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1) and done.stdout, (done.returncode, done.stderr)
    return done.returncode, orjson.loads(done.stdout)


def test_runtime_names_unread_and_disabled_queues(kafka_bootstrap, namespace, broker):
    from kbroker.cli.demo import CLAIM, EMPLOYEES, EXPENSES
    from kbroker.cli.demo import CONTRACT as SUBMISSION

    for i in range(3):
        h = broker.begin_dialog(EMPLOYEES, EXPENSES, SUBMISSION)
        broker.send(h, CLAIM, {"employee": "e", "amount": i, "item": "x"})
    # The analytics topic holds what any client wrote: none of these is the job's figures.
    from confluent_kafka import Producer

    junk = Producer({"bootstrap.servers": kafka_bootstrap})
    for key, value in (
        (b"queue/x/1", b"not json"),
        (b"queue/x/2", b"[1, 2]"),
        (b"queue/x/3", b'{"as_of": "soon"}'),
        (b"queue/x/4", b'{"as_of": true}'),
        (b"queue/x/5", b'{"as_of": -5}'),
        (None, b"\xff" * 70_000),
    ):
        junk.produce(names.analytics_topic(namespace), key=key, value=value)
    assert junk.flush(10) == 0
    rc, report = runtime(kafka_bootstrap, namespace)
    assert rc == 0, report  # warnings only
    assert report["analytics_as_of"] is None and "analytics_behind" not in codes(report), report
    unread = [p for p in report["problems"] if p["code"] == "queue_unread"]
    assert len(unread) == 1 and "'ExpenseQueue': up to 3 message(s) ready; no reader" in unread[0]["text"], report
    subprocess.run(
        [KBROKER, "queue", "disable", "EmployeeQueue", "--bootstrap", kafka_bootstrap, "--namespace", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = []
    while len(got) < 3:
        batch = broker.receive("ExpenseQueue", top=10, wait=5)
        assert batch, got
        got += batch
    rc, report = runtime(kafka_bootstrap, namespace)
    assert rc == 1 and codes(report) == {"queue_disabled": namespace}, report  # ExpenseQueue read: no longer named


def test_runtime_names_routed_messages_a_dead_destination_never_acknowledged(kafka_bootstrap, namespace, tmp_path):
    from kbroker.kafka.routing.transmitter import Transmitter
    from kbroker.sdk.broker import Broker
    from tests.integration.test_routing import REQUEST

    a, b, dead = namespace + "a", namespace + "b", f"127.0.0.1:{free_port()}"
    route_to_nowhere(kafka_bootstrap, tmp_path, a, f"kafka://{dead}/{b}")
    with Broker(kafka_bootstrap, a) as ba, Transmitter(kafka_bootstrap, a, lambda: ba.catalog, tick=1.0):
        with ba.transaction() as tx:
            h = tx.begin_dialog(CLIENT, SERVER, CONTRACT)
            tx.send(h, REQUEST, {"n": 1})
            tx.send(h, REQUEST, {"n": 2})

        def waiting() -> dict | None:
            rc, report = runtime(kafka_bootstrap, a)
            found = [p for p in report["problems"] if p["code"] == "transmission_waiting" and p["severity"] == "error"]
            return report if rc == 1 and found else None

        report = wait_for(waiting, 60, "the unacknowledged messages named with their status")
        # The dialog's own view: its endpoint, and the same two messages.
        rc, mine = runtime(kafka_bootstrap, a, "--conversation", h)
        assert rc == 1 and [e["conversation_handle"] for e in mine["endpoints"]] == [h], mine
        assert len(mine["transmission"]) == 2 and codes(mine) == {"transmission_waiting": a}, mine
    problem = next(p for p in report["problems"] if p["code"] == "transmission_waiting")
    assert problem["text"].startswith(f"2 routed message(s) of 1 dialog(s) to {dead}/{b} unacknowledged"), problem


def test_one_conversation_s_view_names_its_state_and_its_queue(kafka_bootstrap, namespace, broker):
    from kbroker.cli.demo import CLAIM, EMPLOYEES, EXPENSES
    from kbroker.cli.demo import CONTRACT as SUBMISSION
    from kbroker.sdk.broker import END_DIALOG

    h = broker.begin_dialog(EMPLOYEES, EXPENSES, SUBMISSION)
    broker.send(h, CLAIM, {"employee": "e", "amount": 1, "item": "x"})
    rc, report = runtime(kafka_bootstrap, namespace, "--conversation", h)
    assert rc == 0 and [e["conversation_handle"] for e in report["endpoints"]] == [h], report
    assert report["endpoints"][0]["state"] in ("SO", "CO"), report
    assert codes(report) == {}, report  # the initiator's queue holds nothing; the target's is not its queue
    conversation_id = report["endpoints"][0]["conversation_id"]
    [msg] = broker.receive("ExpenseQueue", top=10, wait=10)
    broker.end_conversation(msg.conversation_handle)  # the target ends it: the initiator gets an EndDialog
    rc, report = runtime(kafka_bootstrap, namespace, "--conversation", conversation_id)  # both sides, by id
    states = {e["is_initiator"]: e["state"] for e in report["endpoints"]}
    assert states == {True: "CO", False: "DO"}, report
    assert set(codes(report)) == {"conversation_ending", "queue_unread"}, report
    unread = next(p for p in report["problems"] if p["code"] == "queue_unread")
    assert "'EmployeeQueue'" in unread["text"], unread  # the initiator's queue holds the EndDialog
    assert [m.message_type_name for m in broker.receive("EmployeeQueue", top=10, wait=10)] == [END_DIALOG]
    rc, report = runtime(kafka_bootstrap, namespace, "--conversation", conversation_id)
    assert {e["is_initiator"]: e["state"] for e in report["endpoints"]} == {True: "DI", False: "DO"}, report
    assert set(codes(report)) == {"conversation_ended_there", "conversation_ending"}, report
    rc, report = runtime(kafka_bootstrap, namespace, "--conversation", "no-such-handle")
    assert rc == 1 and codes(report) == {"conversation_not_found": namespace}, report


# A process that dies inside a Kafka transaction it began on `topic` partition 0, with a timeout
# of ten minutes: for the test's length the transaction hangs as one whose producer vanished does.
HOLDER = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "transaction.timeout.ms": 600000})
p.init_transactions(30)
p.begin_transaction()
p.produce(sys.argv[3], value=b"never committed", partition=0)
assert p.flush(30) == 0
print("open", flush=True)
time.sleep(600)
"""


def test_a_hanging_transaction_is_named_and_ended_by_the_command_named_and_a_long_lock_is_named(
    kafka_bootstrap, namespace, broker
):
    import sys
    import time

    from kbroker.cli.demo import CLAIM, EMPLOYEES, EXPENSES
    from kbroker.cli.demo import CONTRACT as SUBMISSION
    from kbroker.kafka.txn.open_transactions import open_transactions

    def send(i: int) -> None:
        broker.send(
            broker.begin_dialog(EMPLOYEES, EXPENSES, SUBMISSION), CLAIM, {"employee": "e", "amount": i, "item": "x"}
        )

    send(0)  # the queue's topic exists
    topic = names.queue_topic(namespace, "ExpenseQueue")
    began = time.time()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kafka_bootstrap, f"holder-{namespace}", topic], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
    finally:
        holder.kill()  # kill -9: the transaction stays open
        holder.wait()
    [hang] = open_transactions(kafka_bootstrap, namespace)
    assert (hang.topic, hang.partition) == (topic, 0) and hang.end == hang.start + 1, hang
    assert hang.began is not None and began - 1 <= hang.began <= time.time() + 1, (began, hang)
    # Dialogs until one message lands behind the open transaction: it cannot be received.
    sent = 1
    while open_transactions(kafka_bootstrap, namespace)[0].end == hang.end:
        send(sent)
        sent += 1
        assert sent < 60, "no message landed on partition 0"
    got: list = []
    with broker.transaction() as tx:
        deadline = time.monotonic() + 30  # what is not behind the open transaction comes
        while time.monotonic() < deadline:
            batch = tx.receive("ExpenseQueue", top=100, wait=3)
            if not batch and got:
                break
            got += batch
        time.sleep(2.5)  # past --stuck-after, and a reader report (every 2 s) saying so

        def named() -> dict | None:
            rc, report = runtime(kafka_bootstrap, namespace, "--stuck-after", "1")
            return report if rc == 1 and {"lock_held", "transaction_hanging"} <= set(codes(report)) else None

        report = wait_for(named, 30, "the lock held and the hanging transaction named")
    held_back = sent - len(got)
    assert held_back >= 1, (sent, len(got))
    lock = next(p for p in report["problems"] if p["code"] == "lock_held")
    assert lock["severity"] == "warning" and lock["text"].startswith("queue 'ExpenseQueue': process "), lock
    problem = next(p for p in report["problems"] if p["code"] == "transaction_hanging")
    assert problem["text"].startswith(f"{topic} partition 0: a Kafka transaction open for "), problem
    assert problem["command"] == (
        f"kbroker diagnose end-transaction --topic {topic} --partition 0 --start-offset {hang.start}"
    ), problem
    # Not a topic of the namespace: refused in one line, nothing run.
    refused = subprocess.run(
        [
            KBROKER,
            "diagnose",
            "end-transaction",
            "--topic",
            "elsewhere",
            "--partition",
            "0",
            "--start-offset",
            "0",
            "--bootstrap",
            kafka_bootstrap,
            "--namespace",
            namespace,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "is not a topic of namespace" in refused.stderr, refused
    ended = subprocess.run(
        [KBROKER, *problem["command"].split()[1:], "--bootstrap", kafka_bootstrap, "--namespace", namespace, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ended.returncode == 0 and orjson.loads(ended.stdout)["ended"] is True, ended
    # The queue's partition is free; the namespace's own transactions (an endpoint's write) may be in flight.
    assert [t for t in open_transactions(kafka_bootstrap, namespace) if (t.topic, t.partition) == (topic, 0)] == []
    later = []
    deadline = time.monotonic() + 30
    while len(later) < held_back and time.monotonic() < deadline:
        later += broker.receive("ExpenseQueue", top=100, wait=2)
    amounts = sorted(orjson.loads(m.body)["amount"] for m in got + later)
    assert amounts == list(range(sent)), amounts  # the aborted record is no message; every one sent came

    def released() -> dict | None:  # a reader report (every 2 s) stops naming the lock once it is released
        rc, report = runtime(kafka_bootstrap, namespace, "--stuck-after", "1")
        return report if "lock_held" not in codes(report) else None

    report = wait_for(released, 30, "the lock's release in the reader reports")
    assert not [
        p
        for p in report["problems"]
        if p["code"].startswith("transaction_") and p["text"].startswith(f"{topic} partition 0:")
    ], report


def test_runtime_names_a_message_rolled_back_again_and_again_until_it_is_received(kafka_bootstrap, namespace, broker):
    from confluent_kafka import Producer

    from kbroker.cli.demo import CLAIM, EMPLOYEES, EXPENSES
    from kbroker.cli.demo import CONTRACT as SUBMISSION

    broker.send(
        broker.begin_dialog(EMPLOYEES, EXPENSES, SUBMISSION), CLAIM, {"employee": "e", "amount": 1, "item": "x"}
    )
    junk = Producer({"bootstrap.servers": kafka_bootstrap})  # anyone may write the events topic
    for value in (
        b'{"event": "RECEIVE_ROLLED_BACK", "queue": "ExpenseQueue", "messages": [[0, "x", true]]}',
        b'{"event": "RECEIVE_ROLLED_BACK"}',
        b"RECEIVE_ROLLED_BACK \xff",
    ):
        junk.produce(names.events_topic(namespace), key=b"ExpenseQueue", value=value)
    assert junk.flush(10) == 0
    for _ in range(2):
        try:
            with broker.transaction() as tx:
                assert tx.receive("ExpenseQueue", top=1, wait=10)
                raise RuntimeError("the handler fails")
        except RuntimeError:
            pass

    def named() -> dict | None:
        rc, report = runtime(kafka_bootstrap, namespace)
        return next((p for p in report["problems"] if p["code"] == "message_rolling_back"), None)

    problem = wait_for(named, 30, "the message rolled back named")
    assert problem["text"].startswith("queue 'ExpenseQueue': message ") and "rolled back 2 time(s)" in problem["text"]
    with broker.transaction() as tx:
        assert tx.receive("ExpenseQueue", top=1, wait=10)
    wait_for(lambda: named() is None, 30, "no message named once it was received")


def test_an_open_transaction_whose_first_record_is_forged_is_named_open_and_the_rest_goes_on(
    kafka_bootstrap, namespace, broker
):
    """The record that says when a transaction began is anyone's: one stamped 50 minutes ahead, with a
    large body of garbage and forged kbroker headers, makes the transaction `transaction_open`
    (its start unknown), not hanging; messages on other partitions are received meanwhile."""
    import time

    from confluent_kafka import Producer

    from kbroker.cli.demo import CLAIM, EMPLOYEES, EXPENSES
    from kbroker.cli.demo import CONTRACT as SUBMISSION

    topic = names.queue_topic(namespace, "ExpenseQueue")
    broker.send(
        broker.begin_dialog(EMPLOYEES, EXPENSES, SUBMISSION), CLAIM, {"employee": "e", "amount": 0, "item": "x"}
    )
    forger = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"forger-{namespace}",
            "transaction.timeout.ms": 600000,
            "message.max.bytes": 2_000_000,
        }
    )
    forger.init_transactions(30)
    forger.begin_transaction()
    ahead_ms = int((time.time() + 3000) * 1000)  # under the broker's message.timestamp.after.max.ms (1 h)
    forger.produce(
        topic,
        value=b"\xff" * 900_000,
        partition=0,
        timestamp=ahead_ms,
        headers=[("kb.type", b"\x00" * 300), ("traceparent", b"00-zz")],
    )
    assert forger.flush(30) == 0
    try:
        rc, report = runtime(kafka_bootstrap, namespace, "--stuck-after", "0")
        assert rc == 0, report  # a warning only
        [open_] = [p for p in report["problems"] if p["code"] == "transaction_open"]
        assert open_["text"].startswith(f"{topic} partition 0: a Kafka transaction is open, since when is not known")
        assert open_["command"].endswith("--partition 0 --start-offset " + str(report["open_transactions"][0]["start"]))
        assert "transaction_hanging" not in codes(report), report
        got = broker.receive("ExpenseQueue", top=10, wait=5)  # the claim, unless it sits behind the forgery
    finally:
        forger.abort_transaction(30)
    # The coordinator writes a transaction's markers after its commit or abort has returned (the
    # RECEIVE's own commit wrote a reader report), so one may read as open for a moment.
    last: list = []

    def settled() -> tuple | None:
        last[:] = runtime(kafka_bootstrap, namespace)
        return tuple(last) if not last[1]["open_transactions"] else None

    rc, report = wait_for(
        settled,
        30,
        "no transaction open once the forger aborted",
        interval=1.0,
        seen=lambda: last[1]["open_transactions"],
    )
    assert rc == 0, report
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        got = broker.receive("ExpenseQueue", top=10, wait=2)
    got += broker.receive("ExpenseQueue", top=10, wait=2)
    assert [orjson.loads(m.body)["amount"] for m in got] == [0], got  # once; the forged record is no message
