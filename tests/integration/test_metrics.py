"""kbroker's Prometheus metrics, scraped by a real Prometheus server (Debian's `prometheus`,
started here) from a real worker's `/metrics` and from this process's opt-in exporter during a
real run: PromQL returns exactly what was sent and received, on both sides. The worker logs as
JSON lines (--log-format json) meanwhile."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from kbroker.sdk.metrics import MetricsServer
from tests.helpers import DATA, free_port, wait_for
from tests.integration.test_worker import Worker

JOBS = 12
JOB, DONE = "//kbroker/test/Job", "//kbroker/test/Done"


class Prometheus:
    """A Prometheus server scraping `targets` ({job: host:port}) every second."""

    def __init__(self, tmp: Path, targets: dict[str, str]):
        exe = shutil.which("prometheus")
        assert exe, "Prometheus is not installed: scripts/prereqs.sh installs Debian's prometheus"
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs: [{{targets: ['{target}']}}]\n" for job, target in targets.items()
        )
        config = tmp / "prometheus.yml"
        config.write_text(f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n{jobs}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    exe,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, 60, "Prometheus ready", seen=lambda: self.log.read_text()[-2000:])

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def value(self, promql: str) -> float | None:
        """The query's one value now, or None while it has none."""
        answer = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=5).json()
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> dict[str, str]:
        active = httpx.get(self.url + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return {
            t["labels"]["job"]: t["health"] + (f" ({t['lastError']})" if t.get("lastError") else "") for t in active
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def metered(kafka_bootstrap: str, tmp_path: Path) -> Iterator[tuple[str, str, Worker, MetricsServer]]:
    ns = "m" + uuid.uuid4().hex[:10]
    apply_paths(kafka_bootstrap, ns, [DATA / "worker.yaml"])
    worker = Worker(kafka_bootstrap, ns, tmp_path, "--log-format", "json", KB_TEST_DELAY="0.05")
    exporter = MetricsServer(0)
    try:
        worker.wait_ready()
        yield kafka_bootstrap, ns, worker, exporter
    finally:
        exporter.close()
        worker.stop()


def test_prometheus_scrapes_what_was_sent_and_received_from_the_worker_and_an_sdk_process(metered, tmp_path):
    bootstrap, ns, worker, exporter = metered
    prom = Prometheus(tmp_path, {"worker": f"127.0.0.1:{worker.port}", "sdk": f"127.0.0.1:{exporter.port}"})
    try:
        wait_for(
            lambda: prom.targets_up() == {"worker": "up", "sdk": "up"}, 30, "both targets scraped", seen=prom.targets_up
        )
        b = Broker(bootstrap, ns)
        try:
            for i in range(JOBS // 2):  # two jobs per dialog, each SEND in a transaction of its own
                h = b.begin_dialog("//kbroker/test/JobClient", "//kbroker/test/Slow", "//kbroker/test/Jobs")
                b.send(h, JOB, {"n": 2 * i})
                with b.transaction() as tx:
                    tx.send(h, JOB, {"n": 2 * i + 1})
            replies: list = []

            def all_replies() -> bool:
                with b.transaction() as tx:
                    replies.extend(tx.receive("ClientQueue", top=50, wait=1.0))
                return len(replies) >= JOBS

            wait_for(all_replies, 90, "every job's Done reply received here", seen=lambda: len(replies))
        finally:
            b.close()
        assert len(replies) == JOBS and {m.message_type_name for m in replies} == {DONE}

        def q(expr: str) -> float | None:
            return prom.value(expr)

        sel = f'namespace="{ns}"'
        expected = {
            f'sum(kbroker_messages_sent_total{{{sel},job="sdk",queue="SlowQueue"}})': JOBS,  # the jobs, sent here
            f'sum(kbroker_messages_received_total{{{sel},job="worker",queue="SlowQueue"}})': JOBS,  # read there
            f'sum(kbroker_messages_sent_total{{{sel},job="worker",queue="ClientQueue"}})': JOBS,  # the replies
            f'sum(kbroker_messages_received_total{{{sel},job="sdk",queue="ClientQueue"}})': JOBS,  # read here
        }
        wait_for(
            lambda: all(q(e) == v for e, v in expected.items()),
            30,
            "the counts in Prometheus",
            seen=lambda: {e: q(e) for e in expected},
        )
        # The worker activated the queue; its readers committed; the gauges name its queues.
        assert (q(f'sum(kbroker_activations_total{{{sel},queue="SlowQueue",kind="internal"}})') or 0) >= 1
        assert q(f"kbroker_reader_slots{{{sel}}}") == 8
        assert (q(f'sum(kbroker_commit_seconds_count{{{sel},job="worker"}})') or 0) >= JOBS
        assert (q(f'sum(kbroker_transactions_total{{{sel},job="sdk",outcome="committed"}})') or 0) >= JOBS // 2
        assert q(f'sum(kbroker_queue_monitor_state{{{sel},queue="SlowQueue"}})') == 1.0  # one state at a time
        # Every group commit is a Kafka transaction or, having written nothing, an offset commit.
        assert (q(f"sum(kbroker_kafka_transaction_seconds_count{{{sel}}})") or 0) + (
            q(f"sum(kbroker_offset_commit_seconds_count{{{sel}}})") or 0
        ) == q(f"sum(kbroker_group_commit_transactions_count{{{sel}}})")
    finally:
        prom.stop()
    # The worker ran with --log-format json: every line it wrote is one JSON object naming the
    # namespace and the worker; the line of each reader it launched names the queue.
    lines = [orjson.loads(line) for line in worker.log.read_text().splitlines() if line.strip()]
    assert lines and all(line["namespace"] == ns and line["worker"] == worker.id for line in lines)
    launched = [line for line in lines if line["message"].startswith("launch reader")]
    assert launched and {line["queue"] for line in launched} == {"SlowQueue"}
