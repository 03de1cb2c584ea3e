"""The worker end to end: real Faust workers (subprocesses) on the real broker, activating the
procedures of tests/helpers/procedures.py on the queues of tests/data/worker.yaml."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import Producer

from kbroker.core import names
from kbroker.errors import BrokerUnavailableError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.queue_views import alter_queue_activation, queue_view
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from kbroker.worker.web.views import monitor_rows
from tests.helpers import DATA as DATA_DIR
from tests.helpers import KBROKER, ROOT, free_port, wait_for

DATA = DATA_DIR / "worker.yaml"
CLIENT, JOBS, JOB, DONE = "//kbroker/test/JobClient", "//kbroker/test/Jobs", "//kbroker/test/Job", "//kbroker/test/Done"


class Worker:
    def __init__(self, bootstrap: str, namespace: str, tmp: Path, *args: str, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"worker-{self.port}.log"
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "KB_TEST_STUB_FILE": str(tmp / "stub.txt"), **env}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    KBROKER,
                    "worker",
                    "--bootstrap",
                    bootstrap,
                    "--namespace",
                    namespace,
                    "--web-port",
                    str(self.port),
                    "--tick",
                    "1",
                    "--ramp-up",
                    "1",
                    "--handlers",
                    "8",
                    "--allow-procedures",
                    "tests.helpers",
                    "--closed-grace",
                    "3",
                    *args,
                ],
                cwd=ROOT,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.id: str | None = None
        token = env.get("KBROKER_WEB_TOKEN")  # the worker requires it of every request
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, f"worker exited: {self.log.read_text()[-3000:]}"
            try:
                self.id = httpx.get(self.url + "/tasks/", timeout=2, headers=self.headers).json()["worker"]
                return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise AssertionError(f"worker not ready in {timeout} s: {self.log.read_text()[-3000:]}")

    def tasks(self) -> list[dict]:
        try:
            return httpx.get(self.url + "/tasks/", timeout=2, headers=self.headers).json()["tasks"]
        except httpx.HTTPError:
            return []

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def monitor(bootstrap: str, ns: str, queue: str) -> dict | None:
    try:
        return next((r for r in monitor_rows(bootstrap, ns) if r["queue"] == queue), None)
    except BrokerUnavailableError:  # retriable: a changelog partition without a leader yet
        return None


class TaskSampler:
    """Samples the workers' running activated tasks: the real reader concurrency per queue."""

    def __init__(self, workers: list[Worker]):
        self.workers, self.max = workers, Counter()
        self.samples: list[tuple[float, Counter]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = Counter(t["queue"] for w in self.workers for t in w.tasks())
            self.samples.append((time.time(), now))
            for q, n in now.items():
                self.max[q] = max(self.max[q], n)
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def send_jobs(broker: Broker, service: str, conversations: int, per_conversation: int) -> dict[str, int]:
    """Jobs in one transaction; returns message id -> sequence number."""
    sent = {}
    with broker.transaction() as tx:
        for _ in range(conversations):
            h = tx.begin_dialog(CLIENT, service, JOBS)
            for i in range(per_conversation):
                sent[tx.send(h, JOB, {"i": i})] = i
    return sent


def collect_done(broker: Broker, expected: int, timeout: float) -> list:
    got, deadline = [], time.time() + timeout
    while len(got) < expected and time.time() < deadline:
        got.extend(broker.receive("ClientQueue", top=100, wait=1.0))
    return got


def events(bootstrap: str, ns: str, kind: str) -> list[dict]:
    records = read_to_end(bootstrap, names.events_topic(ns), 15) or []
    return sorted(
        (e for e in map(orjson.loads, (m.value() for m in records)) if e.get("event") == kind), key=lambda e: e["time"]
    )


# --- one worker for the activation scenarios -------------------------------------------------


@pytest.fixture(scope="module")
def worker_ns(kafka_bootstrap, tmp_path_factory):
    ns = "w" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [DATA])
    tmp = tmp_path_factory.mktemp("worker")
    w = Worker(kafka_bootstrap, ns, tmp)
    try:
        w.wait_ready()
        wait_for(
            lambda: {r["queue"] for r in monitor_rows(kafka_bootstrap, ns)} >= {"SlowQueue", "StubQueue"},
            60,
            "the worker's first monitor rows",
        )
        yield kafka_bootstrap, ns, w, tmp
    finally:
        w.stop()


@pytest.fixture
def client(worker_ns):
    b = Broker(worker_ns[0], worker_ns[1])
    yield b
    b.close()


def test_a_backlog_ramps_readers_to_max_and_back_to_zero(worker_ns, client):
    bootstrap, ns, w, _ = worker_ns
    sampler = TaskSampler([w])
    sent = send_jobs(client, "//kbroker/test/Slow", conversations=30, per_conversation=2)
    done = collect_done(client, len(sent), timeout=90)
    sampler.stop()
    jobs = Counter(orjson.loads(m.body)["job"] for m in done)
    assert set(jobs) == set(sent) and max(jobs.values()) == 1, "lost or duplicated jobs"
    assert sampler.max["SlowQueue"] == 3, f"readers peaked at {sampler.max['SlowQueue']}, max_queue_readers is 3"
    # The pace: one more reader per ramp-up period (1 s here), not all at once.
    firsts = {n: next(t for t, c in sampler.samples if c["SlowQueue"] >= n) for n in (1, 3)}
    assert firsts[3] - firsts[1] >= 1.5, f"ramped from 1 to 3 readers in {firsts[3] - firsts[1]:.2f} s"
    row = wait_for(
        lambda: (r := monitor(bootstrap, ns, "SlowQueue")) and r["readers"] == 0 and r["state"] == "INACTIVE" and r,
        30,
        "readers back to 0, monitor INACTIVE",
    )
    assert row["backlog"] == 0 and row["last_empty_rowset_time"], row
    assert not [t for t in w.tasks() if t["queue"] == "SlowQueue"]


def test_a_stub_that_never_receives_leaves_the_monitor_notified_until_altered(worker_ns, client):
    bootstrap, ns, w, tmp = worker_ns
    stub_file = tmp / "stub.txt"
    launches = lambda: stub_file.read_text().count("StubQueue") if stub_file.exists() else 0  # noqa: E731
    send_jobs(client, "//kbroker/test/Stub", conversations=3, per_conversation=1)
    wait_for(lambda: launches() == 1, 30, "the stub's first launch")
    row = wait_for(
        lambda: (r := monitor(bootstrap, ns, "StubQueue")) and r["state"] == "NOTIFIED" and r, 10, "NOTIFIED"
    )
    time.sleep(4)  # several ticks: still NOTIFIED, and never launched again
    assert launches() == 1
    assert monitor(bootstrap, ns, "StubQueue")["state"] == "NOTIFIED" and row["backlog"] == 3
    for status in ("off", "on"):
        out = subprocess.run(
            [
                KBROKER,
                "queue",
                "alter",
                "StubQueue",
                "--activation",
                status,
                "--bootstrap",
                bootstrap,
                "--namespace",
                ns,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    wait_for(lambda: launches() == 2, 30, "a launch after ACTIVATION OFF then ON recycled the monitor")
    assert monitor(bootstrap, ns, "StubQueue")["generation"] >= 2


def test_a_single_conversation_backlog_gets_a_second_reader_and_no_third(worker_ns, client):
    sampler = TaskSampler([worker_ns[2]])
    sent = send_jobs(client, "//kbroker/test/Single", conversations=1, per_conversation=40)
    done = collect_done(client, len(sent), timeout=90)
    time.sleep(2)
    sampler.stop()
    assert [orjson.loads(m.body)["seq"] for m in done] == list(range(40)), "lost, duplicated or out of order"
    assert sampler.max["SingleQueue"] == 2, f"readers peaked at {sampler.max['SingleQueue']} (max_queue_readers 5)"


def test_every_5th_tick_reclaims_what_the_readers_received(worker_ns, client):
    """The worker that owns the tick deletes the records the queue's readers have received
    (seed 000's 5th-tick cleanup), and says so with a RECORDS_RECLAIMED event."""
    bootstrap, ns, _, _ = worker_ns
    sent = send_jobs(client, "//kbroker/test/Single", conversations=1, per_conversation=5)
    assert len(collect_done(client, len(sent), timeout=60)) == 5
    topic = names.queue_topic(ns, "SingleQueue")

    def reclaimed_to_commit() -> bool:
        view = queue_view(bootstrap, ns, "SingleQueue")
        used = [p for p in view["partition_offsets"] if p["committed"] is not None]
        return bool(used) and all(p["start"] == p["committed"] for p in used)

    wait_for(reclaimed_to_commit, 30, "the log start to reach the committed offset")
    # The event is written after the deletion it reports: it may land a moment after the log start moves.
    got = wait_for(
        lambda: [e for e in events(bootstrap, ns, "RECORDS_RECLAIMED") if e["topic"] == topic],
        30,
        "the RECORDS_RECLAIMED event",
    )
    assert got and all(int(o) > 0 for e in got for o in e["deleted_below"].values()), got


def test_the_5th_tick_tombstones_endpoints_closed_longer_than_the_grace(worker_ns, client):
    """The worker runs with --closed-grace 3: a dialog both sides ended is gone from the
    endpoints topic (its tombstones written) a few seconds later; a live one stays. (ForeignQueue
    is never activated: this test's RECEIVEs are the only ones.)"""
    from kbroker.core.dialogs.conversation_endpoint import CLOSED
    from kbroker.kafka.dialogs.conversation_endpoints import EndpointStore

    bootstrap, ns, _, _ = worker_ns
    ended = client.begin_dialog(CLIENT, "//kbroker/test/Foreign", JOBS)
    client.send(ended, JOB, {"i": 0})
    live = client.begin_dialog(CLIENT, "//kbroker/test/Foreign", JOBS)
    client.send(live, JOB, {"i": 1})
    got = wait_for(
        lambda: (
            [
                m
                for m in client.receive("ForeignQueue", wait=1)
                if m.conversation_id == client.endpoints.get(ended).conversation_id
            ]
            or None
        ),
        30,
        "the ended dialog's job",
    )
    client.end_conversation(got[0].conversation_handle)
    wait_for(lambda: client.receive("ClientQueue", wait=1) or None, 30, "the EndDialog")
    client.end_conversation(ended)
    target = got[0].conversation_handle
    wait_for(
        lambda: client.receive("ForeignQueue", wait=1) == [] and client.endpoints.get(target).state == CLOSED,
        30,
        "the target endpoint to close",
    )

    def gone() -> bool:
        store = EndpointStore(bootstrap, ns, Producer({"bootstrap.servers": bootstrap}))
        store.grace = 10**9  # what the topic holds, not what a reader would skip
        try:
            return store.find(ended) is None and store.find(target) is None and store.find(live) is not None
        finally:
            store.close()

    wait_for(gone, 30, "the closed endpoints' tombstones")


def test_kbroker_conversations_is_served_by_the_worker_and_matches_the_topic(worker_ns, client):
    """The worker keeps sys.conversation_endpoints in memory: `kbroker conversations --url` gets
    it from the worker (a new dialog shows at once; the CLI does not even reach Kafka), with the
    rows reading the topic gives; a worker of another namespace does not answer for this one's
    view (the topic is read instead)."""
    from kbroker.kafka.queue_views import conversation_view

    bootstrap, ns, w, _ = worker_ns
    h = client.begin_dialog(CLIENT, "//kbroker/test/Foreign", JOBS)
    client.send(h, JOB, {"i": 0})
    served = httpx.get(w.url + "/conversations/", timeout=30).json()
    assert served["namespace"] == ns and h in {r["conversation_handle"] for r in served["rows"]}

    def cli(namespace: str, via: str) -> list[dict]:
        out = subprocess.run(
            [KBROKER, "conversations", "--url", w.url, "--bootstrap", via, "--namespace", namespace, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return orjson.loads(out.stdout)

    mine = [r for r in cli(ns, "127.0.0.1:1") if r["conversation_id"] == client.endpoints.get(h).conversation_id]
    assert mine == [
        r for r in conversation_view(bootstrap, ns) if r["conversation_id"] == client.endpoints.get(h).conversation_id
    ]
    assert [r["conversation_handle"] for r in mine] == [h]  # the target side exists once received
    other = "w" + uuid.uuid4().hex[:10]
    apply_paths(bootstrap, other, [DATA])
    assert cli(other, bootstrap) == []  # not the worker's rows: another namespace's topic, read directly


def test_external_activation_notifies_and_repeats_until_received(worker_ns, client):
    bootstrap, ns, _, _ = worker_ns
    send_jobs(client, "//kbroker/test/External", conversations=2, per_conversation=1)
    ext = lambda: [e for e in events(bootstrap, ns, "QUEUE_ACTIVATION") if e["queue"] == "ExternalQueue"]  # noqa: E731
    got = wait_for(lambda: len(ext()) >= 2 and ext(), 30, "a repeated QUEUE_ACTIVATION")
    assert got[1]["time"] - got[0]["time"] >= 1900, "repeated before notify_timeout (2 s)"
    assert got[0]["backlog"] == 2 and got[0]["namespace"] == ns
    received = []
    while len(received) < 2:
        received += client.receive("ExternalQueue", top=10, wait=10)
    time.sleep(2)
    before = len(ext())
    time.sleep(4)
    assert len(ext()) == before, "notified again after the messages were received"


def test_a_procedure_outside_the_allowed_modules_is_never_run(worker_ns, client):
    """The catalog names ForeignQueue's procedure as builtins:print, a module the worker's
    configuration does not allow: the queue is not activated, the worker says so once (a log
    line and an ACTIVATION_REFUSED event naming the procedure), and its message stays queued.
    Before, the worker imported and called whatever the catalog named."""
    bootstrap, ns, w, _ = worker_ns
    send_jobs(client, "//kbroker/test/Foreign", conversations=1, per_conversation=1)
    refused = wait_for(
        lambda: [e for e in events(bootstrap, ns, "ACTIVATION_REFUSED") if e["queue"] == "ForeignQueue"],
        30,
        "an ACTIVATION_REFUSED event",
    )
    assert refused[0]["procedure"] == "builtins:print" and "tests.helpers" in refused[0]["allowed"]
    time.sleep(3)  # several ticks
    assert not [t for t in w.tasks() if t["queue"] == "ForeignQueue"], "a refused procedure was launched"
    assert len([e for e in events(bootstrap, ns, "ACTIVATION_REFUSED") if e["queue"] == "ForeignQueue"]) == 1
    assert w.log.read_text().count("activation of queue ForeignQueue refused: procedure 'builtins:print'") == 1
    row = monitor(bootstrap, ns, "ForeignQueue")
    assert row is None or row["readers"] == 0


def test_monitor_rows_count_a_paused_queue_and_list_only_their_own_queues_procedure_failures(worker_ns, client):
    """PausedQueue's activation is OFF: its row (the queue has an activation clause) shows the
    messages waiting in it, measured as often as an activated queue's, in `kbroker monitors` and
    the dashboard. FailingQueue's procedure raises: a degraded reason on FailingQueue's row, and
    on no other (the worker-wide reasons, a failing tick say, stay on every row)."""
    bootstrap, ns, w, _ = worker_ns
    send_jobs(client, "//kbroker/test/Paused", conversations=4, per_conversation=5)
    send_jobs(client, "//kbroker/test/Failing", conversations=1, per_conversation=1)
    try:
        row = wait_for(
            lambda: (r := monitor(bootstrap, ns, "PausedQueue")) and r["backlog"] == 20 and r,
            20,
            "the paused queue's 20 waiting messages in its monitor row",
        )
        assert (row["activation"], row["state"], row["ready_groups"], row["readers"]) == ("OFF", "INACTIVE", 4, 0)
        assert row["age"] < 5, row
        dashboard = httpx.get(w.url + "/dashboard/snapshot", timeout=30).json()["queues"]["PausedQueue"]
        assert (dashboard["backlog"], dashboard["ready_groups"], dashboard["activation"]) == (20, 4, "OFF")
        failing = wait_for(
            lambda: (r := monitor(bootstrap, ns, "FailingQueue")) and r["degraded"] and r,
            30,
            "the failing procedure on its queue's row",
        )
        assert [r["component"] for r in failing["degraded_reasons"]] == [
            "procedure tests.helpers.procedures:failing on queue FailingQueue"
        ], failing
        since = failing["degraded_reasons"][0]["since"]
        written_after = lambda r: datetime.fromisoformat(r["updated"]).timestamp() > since + 1  # noqa: E731
        others = wait_for(
            lambda: (
                (rs := [r for r in monitor_rows(bootstrap, ns) if r["queue"] != "FailingQueue"])
                and all(map(written_after, rs))
                and rs
            ),
            30,
            "every other row written after the failure",
        )
        assert {r["queue"] for r in others} >= {"PausedQueue", "SlowQueue", "StubQueue"}
        assert [
            (r["queue"], x["component"])
            for r in others
            for x in r["degraded_reasons"]
            if "FailingQueue" in x["component"]
        ] == []
    finally:
        out = subprocess.run(
            [
                KBROKER,
                "queue",
                "alter",
                "FailingQueue",
                "--activation",
                "off",
                "--bootstrap",
                bootstrap,
                "--namespace",
                ns,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr


# --- two workers: the tick and a kill -9 ---------------------------------------------------------


def test_a_queue_its_activated_readers_left_gives_the_workers_partitions_back(kafka_bootstrap, tmp_path):
    """The worker closes a queue's receiver once no activated reader has asked for --receiver-idle
    seconds: with activation then OFF, an application reading the queue gets every partition
    and every message. Before, the worker's idle receiver kept its share of the partitions, and
    what landed there waited until activation was ON again (4 of 12 read in 40 s)."""
    ns = "w" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [DATA])
    w = Worker(kafka_bootstrap, ns, tmp_path, "--receiver-idle", "2")
    client = Broker(kafka_bootstrap, ns)
    try:
        w.wait_ready()
        first = send_jobs(client, "//kbroker/test/Slow", conversations=4, per_conversation=1)
        assert len(collect_done(client, len(first), timeout=90)) == len(first)
        alter_queue_activation(kafka_bootstrap, ns, "SlowQueue", status="OFF")
        wait_for(
            lambda: "receiver closed after 2 s unread: ('SlowQueue', None)" in w.log.read_text(errors="replace"),
            60,
            "the worker closing SlowQueue's receiver",
        )
        time.sleep(3)  # three ticks: every monitor has the queue's activation OFF
        sent = set(send_jobs(client, "//kbroker/test/Slow", conversations=12, per_conversation=1))
        got: Counter = Counter()

        def read() -> bool:
            got.update(m.message_id for m in client.receive("SlowQueue", top=10, wait=1))
            return set(got) >= sent

        wait_for(read, 90, "every job at the application's reader", seen=lambda: (len(got), len(sent)))
        assert set(got) == sent and set(got.values()) == {1}
    finally:
        client.close()
        w.stop()


@pytest.mark.long  # 30 s, two workers: `make test-long`
def test_kill_9_of_a_worker_moves_its_monitors_and_the_tick_runs_once_per_cluster(kafka_bootstrap, tmp_path):
    ns = "w" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [DATA])
    workers = [Worker(kafka_bootstrap, ns, tmp_path, KB_TEST_DELAY="0.1") for _ in range(2)]
    client = Broker(kafka_bootstrap, ns)
    try:
        for w in workers:
            w.wait_ready()
        wait_for(lambda: monitor(kafka_bootstrap, ns, "SlowQueue"), 60, "the first monitor row")
        sent = send_jobs(client, "//kbroker/test/Slow", conversations=60, per_conversation=2)
        done = collect_done(client, 20, timeout=60)
        owner_id = monitor(kafka_bootstrap, ns, "SlowQueue")["worker"]
        [victim] = [w for w in workers if w.id == owner_id]
        [survivor] = [w for w in workers if w is not victim]
        assert victim.tasks(), "the monitor's owner runs the readers"
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        victim.proc.wait()
        # Received one RECEIVE at a time, so the first Done from the survivor is timed closely.
        survivor_first = None
        deadline = time.time() + 150
        while len(done) < len(sent) and time.time() < deadline:
            got = client.receive("ClientQueue", top=100, wait=1.0)
            if survivor_first is None and any(orjson.loads(m.body)["pid"] == survivor.proc.pid for m in got):
                survivor_first = time.time()
            done += got
        all_done_at = time.time()
        jobs = Counter(orjson.loads(m.body)["job"] for m in done)
        assert set(jobs) == set(sent), f"{len(set(sent) - set(jobs))} jobs lost"
        assert max(jobs.values()) == 1, "a job was committed twice"
        # Each conversation's jobs were done in order (its Done replies share a partition, so they
        # arrive in the order they were committed).
        seqs_by_dialog: dict[str, list[int]] = {}
        for m in done:
            seqs_by_dialog.setdefault(m.conversation_handle, []).append(orjson.loads(m.body)["seq"])
        out_of_order = {h: s for h, s in seqs_by_dialog.items() if s != [0, 1]}
        assert not out_of_order, (
            f"{len(out_of_order)} conversations done out of order: {list(out_of_order.values())[:3]}"
        )
        assert survivor_first is not None and survivor.proc.poll() is None, "the survivor took over and runs"
        print(
            f"\nkill -9 of the worker running the readers: the survivor's first job done "
            f"{survivor_first - killed_at:.1f} s later, all {len(sent)} done {all_done_at - killed_at:.1f} s "
            f"after the kill (lost 0, duplicated 0, out of order 0)"
        )
        row = wait_for(
            lambda: (r := monitor(kafka_bootstrap, ns, "SlowQueue")) and r["readers"] == 0 and r,
            30,
            "readers back to 0 on the survivor",
        )
        assert row["worker"] == survivor.id
        # At least ten ticks in all (waited for: a quick drain can end before the tenth), none twice.
        ticks = wait_for(lambda: (t := events(kafka_bootstrap, ns, "TICK")) and len(t) >= 10 and t, 30, "ten ticks")
        numbers = [t["number"] for t in ticks]
        assert len(numbers) == len(set(numbers)), "a tick ran twice"
        assert {t["worker"] for t in ticks} <= {victim.id, survivor.id}
        assert any(t["worker"] == survivor.id and t["time"] > ticks[0]["time"] for t in ticks)
    finally:
        client.close()
        for w in workers:
            w.stop()
