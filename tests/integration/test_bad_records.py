"""No record steers or stops kbroker (G8): garbage written by a plain producer onto each topic
kbroker reads (the catalog, endpoints, timers, monitor events, ticks, control, readers and
progress topics) leaves every process running (a new SDK process, the CLI, the worker, its
timer service, the analytics job), nothing is delivered that should not be, each bad record is
accounted for (a dead letter with kb.dlq.* headers naming the reason and the reader, and a
RECORD_REJECTED event), and a valid record written after it is still served. And a forged
QueueAltered event cannot choose the procedure the worker runs.

One worker (tests/data/worker.yaml, --tick 1, --closed-grace 3: its 5th-tick scan of the
topics every process reads whole runs every 5 s) on one namespace for the module."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker.core import names
from kbroker.core.activation import monitor_codec
from kbroker.core.analytics.analytics_records import control_command
from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.catalog.models import DIALOG_TIMER
from kbroker.core.dialogs.endpoint_records import endpoint_record
from kbroker.core.dialogs.timers import timer_key_of, timer_value
from kbroker.core.reader_reports import reader_report
from kbroker.core.rejected import RECORD_REJECTED, Rejected, text_key
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import KBROKER, ROOT, wait_for
from tests.integration.test_worker import CLIENT, DATA, JOB, JOBS, Worker, collect_done, monitor, send_jobs


class Setup:
    def __init__(self, bootstrap: str, ns: str, worker: Worker):
        self.bootstrap, self.ns, self.worker = bootstrap, ns, worker
        self.producer = Producer({"bootstrap.servers": bootstrap})  # a plain client: no kbroker rules
        self.expected: dict[str, int] = {}  # topic -> its dead letters, as the tests found them

    def write(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """One record, as any client may write it; returns once the broker acknowledged it."""
        errors: list = []
        self.producer.produce(
            names.prefix(self.ns) + topic,
            key=key,
            value=value,
            on_delivery=lambda err, _msg: err and errors.append(err),
        )
        assert self.producer.flush(15) == 0 and not errors, errors

    def dead_letters(self, topic: str) -> list[dict]:
        """The dead letters of records of the namespace's `topic` (kb.dlq.* headers)."""
        out = []
        for m in read_to_end(self.bootstrap, names.deadletter_topic(self.ns), 15) or []:
            h = {k: v.decode() for k, v in m.headers() or [] if k.startswith("kb.dlq.")}
            if h.get("kb.dlq.topic") == names.prefix(self.ns) + topic:
                out.append(
                    {
                        "offset": int(h["kb.dlq.offset"]),
                        "reason": h["kb.dlq.reason"],
                        "reader": h.get("kb.dlq.reader"),
                        "key": m.key(),
                        "value": m.value(),
                    }
                )
        return sorted(out, key=lambda d: d["offset"])

    def events(self, kind: str) -> list[dict]:
        records = read_to_end(self.bootstrap, names.events_topic(self.ns), 15) or []
        return [
            e
            for e in (orjson.loads(m.value()) for m in records if m.value() and m.value().startswith(b"{"))
            if e.get("event") == kind
        ]

    def rejected_events(self, topic: str) -> list[dict]:
        return [e for e in self.events(RECORD_REJECTED) if e.get("topic") == names.prefix(self.ns) + topic]

    def accounted(self, topic: str, n: int, timeout: float = 30.0) -> list[dict]:
        """Wait for `n` dead letters of `topic`, each with its event (the last test checks that
        later scans record none of them again)."""
        letters = wait_for(
            lambda: len(d := self.dead_letters(topic)) >= n and d, timeout, f"{n} dead letters of the {topic} topic"
        )
        time.sleep(0.5)  # one more would have come with it
        letters = self.dead_letters(topic)
        assert len(letters) == n, letters
        self.expected[topic] = n
        assert all(d["reason"] and d["reader"] for d in letters), letters
        events = self.rejected_events(topic)
        assert sorted(e["offset"] for e in events) == [d["offset"] for d in letters], events
        return letters

    def alive(self) -> None:
        w = self.worker
        assert w.proc.poll() is None, f"the worker exited: {w.log.read_text()[-3000:]}"
        assert httpx.get(w.url + "/tasks/", timeout=5).status_code == 200

    def cli(self, *args: str) -> dict:
        out = subprocess.run(
            [KBROKER, *args, "--bootstrap", self.bootstrap, "--namespace", self.ns, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        return orjson.loads(out.stdout) if out.stdout.strip() else {}


@pytest.fixture(scope="module")
def setup(kafka_bootstrap, tmp_path_factory) -> Iterator[Setup]:
    ns = "g" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [DATA])
    w = Worker(kafka_bootstrap, ns, tmp_path_factory.mktemp("bad-records"))
    try:
        w.wait_ready()
        wait_for(lambda: monitor(kafka_bootstrap, ns, "StubQueue"), 60, "the worker's monitor rows")
        yield Setup(kafka_bootstrap, ns, w)
    finally:
        w.stop()


def test_a_forged_queue_altered_event_cannot_choose_the_procedure(setup):
    """Anyone who may write the monitor-events topic wrote a QueueAltered naming builtins:print
    for StubQueue: the worker refuses it (an ACTIVATION_REFUSED event with the reason), the
    queue is not activated (its message stays), and print is never called (it would have
    written the Broker and the queue name to the worker's log)."""
    forged = {
        "event": "QueueAltered",
        "config": {"enabled": True, "kind": "internal", "procedure": "builtins:print", "max_queue_readers": 2},
    }
    setup.write("monitor-events", b"StubQueue", orjson.dumps(forged))
    refused = wait_for(
        lambda: [e for e in setup.events("ACTIVATION_REFUSED") if e["queue"] == "StubQueue"],
        30,
        "an ACTIVATION_REFUSED event for StubQueue",
    )
    assert refused[0]["procedure"] == "builtins:print" and "reason" in refused[0]
    with Broker(setup.bootstrap, setup.ns) as client:
        send_jobs(client, "//kbroker/test/Stub", conversations=1, per_conversation=1)
        time.sleep(4)  # several ticks and queue watches
        setup.alive()
        assert not [t for t in setup.worker.tasks() if t["queue"] == "StubQueue"]
        assert "Broker object" not in setup.worker.log.read_text(), "the forged procedure was called"
        with client.transaction() as tx:  # the message is still there, for a reader of the queue's own
            assert len(tx.receive("StubQueue", top=10, wait=10)) == 1


def test_garbage_on_the_monitor_events_and_ticks_topics_is_set_aside_and_the_worker_goes_on(setup):
    """A keyless record, a non-JSON one and one with a string where a count goes, on the
    monitor events; a non-JSON tick request. Before, the keyless one crashed the Faust agent
    (enough crashes stop the worker)."""
    before = len(setup.events("TICK"))
    for key, value in (
        (None, b'{"event": "Tick"}'),
        (b"SlowQueue", b"\x00not json"),
        (b"SlowQueue", b'{"event": "MessagesReady", "backlog": "lots", "ready_groups": 1}'),
        (b"\xff\xfe", b'{"event": "Tick"}'),
    ):
        setup.write("monitor-events", key, value)
    setup.write("ticks", b"tick", b"not a tick request")
    with Broker(setup.bootstrap, setup.ns) as client:  # activation still runs: replies come back
        sent = send_jobs(client, "//kbroker/test/Slow", conversations=2, per_conversation=1)
        assert len(collect_done(client, len(sent), timeout=60)) == len(sent)
    letters = setup.accounted("monitor-events", 4, timeout=10)
    reasons = {(d["key"], d["reason"]) for d in letters}  # the partitions' dead letters in any order
    assert {k for k, _ in reasons} == {None, b"SlowQueue", b"\xff\xfe"}, letters
    assert any(k is None and "no key" in r for k, r in reasons), letters
    assert any("'backlog'" in r for _, r in reasons) and any("not JSON" in r for _, r in reasons), letters
    assert "not JSON" in setup.accounted("ticks", 1, timeout=10)[0]["reason"]
    wait_for(lambda: len(setup.events("TICK")) > before + 2, 20, "ticks after the garbage")
    setup.alive()


def test_garbage_on_the_catalog_wedges_no_process_and_is_recorded_once(setup):
    """Before, one record that is not a catalog object made every new process fail (the SDK,
    `kbroker queue show`, `kbroker apply`). Now each is skipped (a queue keeps its last valid
    definition), the worker's 5th-tick scan records it and tombstones the keys that hold nothing
    valid, so compaction removes them; `kbroker apply` writes again the objects whose last record
    is bad (and records those, as their repairer: a scan that came first recorded it too)."""
    setup.write("catalog", b"queue/ClientQueue", b"{not json")  # after ClientQueue's valid record
    setup.write("catalog", b"service/Bogus", b'{"name": 5}')
    setup.write("catalog", b"\xff/x", b"{}")
    setup.write("catalog", b"no-kind", b"{}")
    with Broker(setup.bootstrap, setup.ns) as client:  # a new process: BEGIN DIALOG and SEND work
        h = client.begin_dialog(CLIENT, "//kbroker/test/Paused", JOBS)
        client.send(h, JOB, {"i": 1})
        assert "ClientQueue" in client.catalog.queues and "Bogus" not in client.catalog.services
    assert setup.cli("queue", "show", "PausedQueue")["totals"]["ready"] >= 1
    setup.cli("queue", "alter", "PausedQueue", "--max-readers", "3")  # a valid record after them: served
    assert setup.cli("apply", str(DATA)) is not None
    keys = [b"queue/ClientQueue", b"service/Bogus", b"\xff/x", b"no-kind"]
    wait_for(lambda: {d["key"] for d in setup.dead_letters("catalog")} == set(keys), 30, "the catalog's dead letters")
    time.sleep(0.5)  # an apply's repair record comes with its event
    letters = setup.dead_letters("catalog")
    for key in keys[1:]:
        assert [d["reader"] for d in letters if d["key"] == key] == ["5th-tick scan"], letters
    repaired = [d for d in letters if d["key"] == keys[0]]
    assert 1 <= len(repaired) <= 2 and {d["reader"] for d in repaired} <= {"5th-tick scan", "kbroker apply"}
    assert "not JSON" in repaired[0]["reason"]
    assert sorted(e["offset"] for e in setup.rejected_events("catalog")) == [d["offset"] for d in letters]
    setup.expected["catalog"] = len(letters)
    with Broker(setup.bootstrap, setup.ns) as client:
        assert client.catalog.queue("PausedQueue").activation.max_queue_readers == 1  # apply put it back
        with client.transaction() as tx:
            assert len(tx.receive("PausedQueue", top=10, wait=10)) == 1  # delivered once, as sent
    last = {m.key(): m.value() for m in read_to_end(setup.bootstrap, names.catalog_topic(setup.ns), 15) or []}
    assert all(last[k] is None for k in keys[1:]), "the keys with nothing valid are tombstoned"
    assert orjson.loads(last[keys[0]])["name"] == "ClientQueue", "apply wrote ClientQueue again"
    setup.alive()


def test_garbage_on_the_endpoints_topic_is_skipped_and_recorded_once(setup):
    """Before, an undecodable endpoints record raised in every process's endpoint cache and its
    read position never passed it."""
    setup.write("endpoints", b"not-an-endpoint", b"not json")
    setup.write("endpoints", b"\xff\xfe", b"{}")
    setup.write("endpoints", b"some-handle/lease", b'{"handle": "h", "epoch": "one"}')
    with Broker(setup.bootstrap, setup.ns) as client:  # a new process, reading the topic whole
        h = client.begin_dialog(CLIENT, "//kbroker/test/Paused", JOBS)
        client.send(h, JOB, {"i": 2})
        with client.transaction() as tx:
            assert len(tx.receive("PausedQueue", top=10, wait=10)) == 1
    assert setup.cli("conversations")  # the CLI's view reads the whole topic too
    letters = setup.accounted("endpoints", 3)
    assert {d["reader"] for d in letters} == {"5th-tick scan"}
    setup.alive()


def test_garbage_on_the_timers_topic_never_fires_and_a_valid_timer_still_does(setup):
    """A non-JSON timer, a non-UTF-8 key, and a well-formed timer of a live dialog whose delivery
    topic is not a queue of the namespace (before, the timer service wrote a DialogTimer wherever
    a record said: here, onto the events topic)."""
    with Broker(setup.bootstrap, setup.ns) as client:
        h = client.begin_dialog(CLIENT, "//kbroker/test/Paused", JOBS)
        conv = client.endpoints.get(h).conversation_id
        elsewhere = {
            "kind": "timer",
            "due": 0,
            "conversation_id": conv,
            "side": "INITIATOR",
            "contract": JOBS,
            "service": CLIENT,
            "far_service": "//kbroker/test/Paused",
            "topic": names.events_topic(setup.ns),
            "key": "forged-k",
        }
        setup.write("timers", b"timer:x:1", b"not json")
        setup.write("timers", b"timer:y:1", orjson.dumps(elsewhere))
        setup.write("timers", b"\xff", b"{}")
        with pytest.raises(AssertionError):  # and a compacted topic takes no keyless record at all
            setup.write("timers", None, b"x")
        client.begin_conversation_timer(h, 1)  # a valid timer after them: fired
        got = wait_for(lambda: client.receive("ClientQueue", top=10, wait=1), 30, "the DialogTimer")
        assert [m.message_type_name for m in got] == [DIALOG_TIMER]
    letters = setup.accounted("timers", 3, timeout=10)
    assert {d["reader"] for d in letters} == {"timer service"}
    # By key, not by position: the timer service sets the bad key aside as it reads it and the
    # forged timer only when it falls due, so their dead letters come in either order.
    reasons = {d["key"]: d["reason"] for d in letters}
    assert "not JSON" in reasons[b"timer:x:1"] and "not UTF-8" in reasons[b"\xff"], letters
    assert "not a queue" in reasons[b"timer:y:1"], letters
    assert not [
        m for m in read_to_end(setup.bootstrap, names.events_topic(setup.ns), 15) or [] if m.key() == b"forged-k"
    ], "the forged timer fired onto the events topic"
    setup.alive()


def test_garbage_on_the_control_and_readers_topics_is_recorded_and_the_views_still_answer(setup):
    setup.write("control", b"dialog-1", b"not json")
    setup.write("control", b"dialog-2", b'["RECLASSIFY"]')
    setup.write(
        "control",
        b"dialog-3",
        orjson.dumps(
            {
                "command": "RECLASSIFY",
                "conversation_id": "c3",
                "side": "TARGET",
                "queue": "SlowQueue",
                "from": "normal",
                "to": "slow",
                "batch": 1,
            }
        ),
    )
    setup.write("readers", b"p/t", b"not json")
    setup.write("readers", b"p/u", orjson.dumps({"topic": names.queue_topic(setup.ns, "SlowQueue")}))
    assert setup.cli("queue", "show", "SlowQueue")["queue"] == "SlowQueue"  # before: it raised on the report
    wait_for(
        lambda: (
            [r["conversation_id"] for r in httpx.get(setup.worker.url + "/dialogs/", timeout=5).json()["rows"]]
            == ["c3"]
        ),
        20,
        "the valid RECLASSIFY after the garbage, served",
    )
    assert len(setup.accounted("control", 2)) == 2
    assert len(setup.accounted("readers", 2, timeout=5)) == 2
    setup.alive()


def test_garbage_on_the_progress_topic_does_not_stop_the_analytics_job(setup, start_analytics):
    """Before, one non-JSON record on the progress topic failed the Spark query, and every
    restart from its checkpoint failed on the same batch. Now the job records it and goes on,
    and the valid snapshot after it is applied (the job's clock is the snapshot's time)."""
    at = 4102444800000  # 2100-01-01: no other record of the namespace says a later time
    setup.write("progress", b"SlowQueue", b"not json")
    setup.write("progress", b"SlowQueue", b'{"queue": "SlowQueue", "at": "noon", "partitions": []}')
    setup.write(
        "progress",
        b"SlowQueue",
        orjson.dumps(
            {"queue": "SlowQueue", "at": at, "partitions": [{"partition": 0, "committed": 0, "completed": []}]}
        ),
    )
    job = start_analytics(setup.ns)
    wait_for(
        lambda: job.state is not None and job.state.now == at or job.failure(),
        120,
        "the analytics job's batch with the valid snapshot",
    )
    assert job.failure() is None and job.query.isActive
    letters = setup.accounted("progress", 2, timeout=10)
    assert {d["reader"] for d in letters} == {"analytics job"} and "not JSON" in letters[0]["reason"]


def test_no_bad_record_is_recorded_twice(setup):
    """Later 5th-tick scans (every 5 s here), the worker's re-reads of the catalog and the
    timer service's rebalances meet the same bad records again: none is recorded again."""
    assert len(setup.expected) >= 6, "run with the tests above"
    time.sleep(6)  # a scan more (every 5 s here)
    assert {topic: len(setup.dead_letters(topic)) for topic in setup.expected} == setup.expected
    setup.alive()


# --- generated records on every topic this module covers (bounded, deterministic) ---------------

FUZZ_TOPICS = ["monitor-events", "ticks", "timers", "control", "readers", "endpoints", "catalog"]
COMPACTED = {"timers", "readers", "endpoints", "catalog"}


def oracle(ns: str, topic: str, key: bytes | None, value: bytes | None) -> bool:
    """Whether kbroker's readers take the record (the pure decoders), else it must be set aside."""
    decoders = {
        "monitor-events": lambda: (text_key(key), monitor_codec.decode(value)),
        "ticks": lambda: monitor_codec.decode_tick_request(value),
        "timers": lambda: (timer_key_of(key, value), value is None or timer_value(ns, value)),
        "control": lambda: control_command(key, value),
        "readers": lambda: value is None or (text_key(key), reader_report(value)),
        "endpoints": lambda: endpoint_record(key, value),
        "catalog": lambda: catalog_record(key, value),
    }
    try:
        decoders[topic]()
        return True
    except Rejected:
        return False


fuzz_values = (
    st.none()
    | st.binary(max_size=120)
    | st.sampled_from(
        [
            b"{}",
            b"[]",
            b"null",
            b'{"event": "Tick"}',
            b'{"event": "MessagesReady", "backlog": -1}',
            b'"x"',
            b"\xff\xfe",
            b'{"name": "ClientQueue"}',
            b'{"kind": "timer", "due": 0}',
            b'{"command": "RECLASSIFY"}',
        ]
    )
)
fuzz_records = st.lists(
    st.tuples(
        st.sampled_from(FUZZ_TOPICS),
        st.none() | st.binary(max_size=16),
        fuzz_values,
        st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=12)), max_size=2),
    ),
    min_size=1,
    max_size=6,
)


def test_generated_records_on_every_topic_stop_nothing_and_are_all_accounted_for(setup):
    """Hypothesis writes generated records (keys, bodies, headers, encodings) onto the topics,
    with a SEND before and after each batch: every record the decoders reject gets exactly one
    dead letter, the worker keeps running, and the SENDs around them are received once, in order."""
    written: dict[str, int] = {t: 0 for t in FUZZ_TOPICS}  # records each topic must account for
    before = {t: len(setup.dead_letters(t)) for t in FUZZ_TOPICS}
    counter = iter(range(10**6))
    with Broker(setup.bootstrap, setup.ns) as client:
        h = client.begin_dialog(CLIENT, "//kbroker/test/Paused", JOBS)
        sent: list[int] = []

        @settings(
            max_examples=20, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(records=fuzz_records)
        def write_batch(records):
            sent.append(len(sent))
            client.send(h, JOB, {"n": sent[-1]})
            for topic, key, value, headers in records:
                if topic in COMPACTED or key is not None:  # a compacted topic refuses keyless records
                    key = b"fz%d-" % next(counter) + (key or b"")  # its own key: the last of it, recorded once
                setup.producer.produce(names.prefix(setup.ns) + topic, key=key, value=value, headers=headers)
                written[topic] += not oracle(setup.ns, topic, key, value)
            assert setup.producer.flush(15) == 0
            sent.append(len(sent))
            client.send(h, JOB, {"n": sent[-1]})

        write_batch()
        got: list[int] = []
        with client.transaction() as tx:
            while len(got) < len(sent) and (msgs := tx.receive("PausedQueue", top=100, wait=10)):
                got += [orjson.loads(m.body)["n"] for m in msgs]
        assert got == sent, "the SENDs around the generated records, once and in order"
    assert sum(written.values()) > 20, written
    counts = lambda: {t: len(setup.dead_letters(t)) - before[t] for t in FUZZ_TOPICS}  # noqa: E731
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and any(counts()[t] < n for t, n in written.items()):
        time.sleep(1)
    time.sleep(6)  # a scan more: nothing recorded twice
    assert counts() == written, "dead letters per topic, and the records the decoders reject"
    setup.alive()
