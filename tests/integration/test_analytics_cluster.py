"""The analytics job, unchanged (`kbroker analytics run --master spark://...`), on a Spark standalone
cluster: a master and two workers of one core each, started with pyspark's own launcher
(tests/helpers/spark_cluster.py). Its checkpoint and history are on this machine's disk, which the
driver and both workers share. Minutes: deselected unless asked for (`make test-spark-cluster`)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import wait_for
from tests.helpers.spark_cluster import SparkCluster, job_conf
from tests.integration.test_analytics import (
    FRESH,
    STALE,
    JobProcess,
    analytics_ns,  # noqa: F401 - the fixture: a namespace and its worker
    check_known_aggregates,
    known_workload,
    send,
    totals,
)

pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(900)]


@pytest.fixture
def spark_cluster(tmp_path):
    cluster = SparkCluster(tmp_path / "spark", workers=2, cores=1, memory="1g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_the_job_on_a_cluster_counts_exactly_and_rides_through_the_loss_of_a_worker(
    analytics_ns, spark_cluster, tmp_path
):
    bootstrap, ns, w, b = analytics_ns
    job = JobProcess(bootstrap, ns, tmp_path, 1, master=spark_cluster.url, args=["--window", "5", *job_conf()])
    tail = lambda: job.log.read_text(errors="replace")[-3000:]  # noqa: E731
    try:
        wait_for(
            lambda: job.batches() >= 1,
            240,
            "the job's first batch on the cluster",
            seen=lambda: (job.proc.poll(), tail()),
        )
        # The job is the cluster's application, an executor of one core on each worker.
        apps = spark_cluster.running_apps()
        assert [a["name"] for a in apps] == ["kbroker-analytics"] and apps[0]["cores"] == 2, apps
        stale_sent = known_workload(b)
        check_known_aggregates(
            bootstrap, ns, stale_sent, job.history, seen=lambda: (job.batches(), job.proc.poll(), tail())
        )

        # A worker lost mid-stream (its JVM and its executor, kill -9), while 100 more messages are sent.
        sending = threading.Thread(target=lambda: [send(b, STALE, 1, 5) or time.sleep(0.1) for _ in range(20)])
        sending.start()
        time.sleep(1.0)
        spark_cluster.kill_worker(0)
        killed_at = job.batches()
        sending.join()
        wait_for(
            lambda: len(spark_cluster.alive_workers()) == 1,
            90,
            "the master seeing one worker left",
            seen=spark_cluster.state,
        )
        # Every message counted once: what the lost executor read is read again by the other one.
        after = wait_for(
            lambda: (t := totals(bootstrap, ns, "StaleQueue")).get("arrivals") == 130 and t,
            180,
            "all 130 stale-queue arrivals counted after the loss",
            seen=lambda: (totals(bootstrap, ns, "StaleQueue"), job.batches(), tail()),
        )
        assert (after["arrivals"], after["receives"], after["backlog"]) == (130, 0, 130), after
        # And the job keeps going on the other worker: more batches, the same counts, the query never stopped.
        wait_for(
            lambda: job.batches() >= killed_at + 5,
            120,
            "five batches after the loss",
            seen=lambda: (job.batches(), killed_at, tail()),
        )
        after = totals(bootstrap, ns, "StaleQueue")
        assert (after["arrivals"], after["backlog"]) == (130, 130), after
        fresh = totals(bootstrap, ns, "FreshQueue")
        assert (fresh["arrivals"], fresh["receives"], fresh["backlog"]) == (20, 20, 0), fresh
        assert job.proc.poll() is None, tail()
        assert "analytics query stopped" not in job.log.read_text(errors="replace"), tail()
        apps = spark_cluster.running_apps()
        assert len(apps) == 1 and apps[0]["cores"] == 1, apps  # the other worker's executor alone
        # A worker that joins (the lost machine replaced) is given an executor of the job's again.
        spark_cluster.add_worker()
        wait_for(
            lambda: [a["cores"] for a in spark_cluster.running_apps()] == [2],
            90,
            "the job's executor on the new worker",
            seen=spark_cluster.state,
        )
        send(b, FRESH, dialogs=1, each=5)
        wait_for(
            lambda: totals(bootstrap, ns, "FreshQueue").get("arrivals") == 25,
            90,
            "5 more fresh messages counted on the cluster of two again",
            seen=lambda: (totals(bootstrap, ns, "FreshQueue"), tail()),
        )
    finally:
        job.stop()
