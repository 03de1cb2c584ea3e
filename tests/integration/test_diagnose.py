"""`kbroker diagnose configuration` on the real broker: two namespaces set up as the routing tests
set them up, then broken one way at a time; each problem is named by its code, and the command
exits 1 exactly when one would stop the dialog."""

from __future__ import annotations

import subprocess

import orjson

from tests.helpers import KBROKER, free_port, wait_for
from kbroker.core import names
from kbroker.kafka.apply import apply_paths
from tests.integration.test_routing import CLIENT, CONTRACT, SERVER, catalog_yaml, setup_catalogs


def diagnose(bootstrap: str, ns: str, *extra: str, timeout: float = 10.0) -> tuple[int, dict]:
    done = subprocess.run([KBROKER, "diagnose", "configuration", CLIENT, SERVER, "--contract", CONTRACT,
                           "--bootstrap", bootstrap, "--namespace", ns, "--json", "--timeout", str(timeout), *extra],
                          capture_output=True, text=True, timeout=120)
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
    subprocess.run([KBROKER, "queue", "disable", "Q", "--bootstrap", kafka_bootstrap, "--namespace", b],
                   capture_output=True, text=True, timeout=60, check=True)
    rc, report = diagnose(kafka_bootstrap, a, "--to-namespace", b)
    assert rc == 1 and codes(report).get("queue_disabled") == b, report


def route_to_nowhere(bootstrap: str, tmp_path, ns: str, address: str) -> None:
    """Namespace `ns` hosts CLIENT, with a route for SERVER to `address`, where nothing answers."""
    path = tmp_path / f"{ns}.yaml"
    path.write_text(catalog_yaml(services=f"  - {{name: '{CLIENT}', queue: Q}}", with_odd=False,
                                 routes=f"routes:\n  - {{name: ToB, service_name: '{SERVER}', address: '{address}'}}"))
    apply_paths(bootstrap, ns, [path])


def test_a_route_to_a_cluster_that_does_not_answer_is_named(kafka_bootstrap, namespace, tmp_path):
    a, b, dead = namespace + "a", namespace + "b", f"127.0.0.1:{free_port()}"
    route_to_nowhere(kafka_bootstrap, tmp_path, a, f"kafka://{dead}/{b}")
    rc, report = diagnose(kafka_bootstrap, a, timeout=5)  # how long the dead cluster is waited for
    assert rc == 1 and report["to"] == f"{dead}/{b}"
    assert codes(report) == {"far_unreachable": b}, report


def runtime(bootstrap: str, ns: str) -> tuple[int, dict]:
    done = subprocess.run([KBROKER, "diagnose", "runtime", "--bootstrap", bootstrap, "--namespace", ns, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1) and done.stdout, (done.returncode, done.stderr)
    return done.returncode, orjson.loads(done.stdout)


def test_runtime_names_unread_and_disabled_queues(kafka_bootstrap, namespace, broker):
    from kbroker.cli.demo import CLAIM, CONTRACT as SUBMISSION, EMPLOYEES, EXPENSES

    for i in range(3):
        h = broker.begin_dialog(EMPLOYEES, EXPENSES, SUBMISSION)
        broker.send(h, CLAIM, {"employee": "e", "amount": i, "item": "x"})
    # The analytics topic holds what any client wrote: none of these is the job's figures.
    from confluent_kafka import Producer

    junk = Producer({"bootstrap.servers": kafka_bootstrap})
    for key, value in ((b"queue/x/1", b"not json"), (b"queue/x/2", b"[1, 2]"), (b"queue/x/3", b'{"as_of": "soon"}'),
                       (b"queue/x/4", b'{"as_of": true}'), (b"queue/x/5", b'{"as_of": -5}'), (None, b"\xff" * 70_000)):
        junk.produce(names.analytics_topic(namespace), key=key, value=value)
    assert junk.flush(10) == 0
    rc, report = runtime(kafka_bootstrap, namespace)
    assert rc == 0, report  # warnings only
    assert report["analytics_as_of"] is None and "analytics_behind" not in codes(report), report
    unread = [p for p in report["problems"] if p["code"] == "queue_unread"]
    assert len(unread) == 1 and "'ExpenseQueue': up to 3 message(s) ready; no reader" in unread[0]["text"], report
    subprocess.run([KBROKER, "queue", "disable", "EmployeeQueue", "--bootstrap", kafka_bootstrap, "--namespace",
                    namespace], capture_output=True, text=True, timeout=60, check=True)
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
    problem = next(p for p in report["problems"] if p["code"] == "transmission_waiting")
    assert problem["text"].startswith(f"2 routed message(s) of 1 dialog(s) to {dead}/{b} unacknowledged"), problem
