"""The CLI as a new user or a CI log meets it, against the real broker: a bad value is one line,
and with stdout piped (no terminal) the tables print every handle and name whole on one line."""

from __future__ import annotations

import os
import subprocess
import uuid

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.core import names
from kbroker.core.activation.monitor import MonitorConfig, MonitorState
from kbroker.core.dialogs.send_lease import lease_key
from kbroker.kafka.snapshot import read_to_end
from tests.helpers import KBROKER


def run_cli(*args: str, bootstrap: str, namespace: str) -> subprocess.CompletedProcess:
    """The venv's `kbroker`, stdout and stderr captured through pipes: no terminal, as in CI."""
    env = {**os.environ, "KBROKER_BOOTSTRAP": bootstrap, "KBROKER_NAMESPACE": namespace}
    env.pop("COLUMNS", None)
    return subprocess.run([KBROKER, *args], env=env, capture_output=True, text=True, timeout=120)


def lines_with(text: str, *values: str) -> list[str]:
    return [line for line in text.splitlines() if all(v in line for v in values)]


def test_queue_alter_with_a_bad_procedure_is_one_line(kafka_bootstrap, namespace, broker):
    out = run_cli(
        "queue", "alter", "ExpenseQueue", "--procedure", "notaprocedure", bootstrap=kafka_bootstrap, namespace=namespace
    )
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "kbroker: error: activation.procedure: procedure must be 'module:function', not 'notaprocedure'"
    ]


def test_queue_alter_with_a_procedure_from_no_module_fails_at_once(kafka_bootstrap, namespace, broker):
    """Before, this exited 0 and the catalog named a procedure no worker could import."""
    before = broker.refresh_catalog().queue("ExpenseQueue").activation
    out = run_cli(
        "queue",
        "alter",
        "ExpenseQueue",
        "--procedure",
        "no.such.module:fn",
        bootstrap=kafka_bootstrap,
        namespace=namespace,
    )
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "kbroker: error: procedure 'no.such.module:fn': module 'no.such.module' "
        "cannot be imported here (the worker imports it from the same installation)"
    ]
    assert broker.refresh_catalog().queue("ExpenseQueue").activation == before
    ok = run_cli(
        "queue",
        "alter",
        "ExpenseQueue",
        "--procedure",
        "kbroker.samples.expenses:process_claims",
        bootstrap=kafka_bootstrap,
        namespace=namespace,
    )
    assert ok.returncode == 0, ok.stderr


def test_conversations_piped_prints_whole_handles_and_names(kafka_bootstrap, namespace, broker):
    handle = broker.begin_dialog(EMP, EXP, CONTRACT)
    broker.send(handle, CLAIM, {"claim": 1})
    out = run_cli("conversations", bootstrap=kafka_bootstrap, namespace=namespace)
    assert out.returncode == 0, out.stderr
    assert len(lines_with(out.stdout, handle, EMP, EXP, "CO")) == 1, out.stdout


def test_monitors_piped_prints_whole_names(kafka_bootstrap, namespace):
    # A monitor row as a worker leaves it in the monitor table's changelog (no worker needed).
    topic = names.monitors_changelog_topic(namespace)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    queue, worker = "AQueueNameLongerThanTheColumnsOfAnEightyColumnTable", f"worker-{uuid.uuid4()}"
    state = MonitorState(queue=queue, config=MonitorConfig(procedure="kbroker.samples.expenses:process_claims"))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, key=orjson.dumps(queue), value=orjson.dumps({**state.to_dict(), "owner": worker}))
    assert producer.flush(30) == 0

    out = run_cli("monitors", bootstrap=kafka_bootstrap, namespace=namespace)
    assert out.returncode == 0, out.stderr
    assert len(lines_with(out.stdout, queue, worker)) == 1, out.stdout


def test_demo_piped_prints_whole_handles(kafka_bootstrap, namespace):
    out = run_cli("demo", bootstrap=kafka_bootstrap, namespace=namespace)
    assert out.returncode == 0, out.stderr
    begun = lines_with(out.stdout, "BEGIN DIALOG")
    assert len(begun) == 1, out.stdout
    handle = begun[0].rsplit(" ", 1)[1]
    uuid.UUID(handle)  # whole, not cut
    assert len(lines_with(out.stdout, handle, EMP, "CD")) == 1, out.stdout
    assert "…" not in out.stdout


def test_a_refused_send_that_begins_a_dialog_writes_nothing(kafka_bootstrap, namespace, broker):
    """`kbroker send --from --to` with a message type the contract does not have exits 1 with one
    line and leaves no endpoint on the endpoints topic (before, each refused send left one in
    state SO). The same send with the contract's type then works, on a new dialog."""
    refused = run_cli(
        "send",
        "--from",
        EMP,
        "--to",
        EXP,
        "--contract",
        CONTRACT,
        "--type",
        "NoSuchType",
        "--body",
        "{}",
        bootstrap=kafka_bootstrap,
        namespace=namespace,
    )
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert read_to_end(kafka_bootstrap, names.endpoints_topic(namespace), 15) in (None, [])
    sent = run_cli(
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
        "{}",
        "--json",
        bootstrap=kafka_bootstrap,
        namespace=namespace,
    )
    assert sent.returncode == 0, sent.stderr
    handle = orjson.loads(sent.stdout)["conversation_handle"]
    written = {m.key().decode() for m in read_to_end(kafka_bootstrap, names.endpoints_topic(namespace), 15) or []}
    # The endpoint and, beside it, its side's conversation lease (written with the endpoint).
    assert written == {handle, lease_key(handle)}
