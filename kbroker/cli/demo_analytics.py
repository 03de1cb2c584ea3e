"""`kbroker demo --analytics`: the sample workload under the Spark analytics job. A worker (receive
progress, the dashboard) and the job run beside the broker; some expense claims are approved, the
rest wait until they go stale; the job's view of it is printed, then everything is stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from kbroker.cli.output import new_table
from kbroker.core.cluster import Cluster
from kbroker.sdk.broker import Broker
from kbroker.worker.web.web_client import get

EMPLOYEES = "//Adventure-Works.com/Employees"
EXPENSES = "//Adventure-Works.com/Expenses"
CONTRACT = "//Adventure-Works.com/Expenses/ExpenseSubmission"
CLAIM = "//Adventure-Works.com/Expenses/ExpenseClaim"
CLAIMS, APPROVED = 12, 6
STALE_AFTER = 5.0  # the job's threshold here, so the demo shows stale claims within seconds


def _free_port() -> int:
    from kbroker.embedded.ports import free_port

    return free_port()


def run_analytics_demo(
    cluster: Cluster, namespace: str, say: Callable[[str], None], show: Callable[[Any], None], timeout: float = 120.0
) -> dict[str, Any]:
    from kbroker.analytics.job import AnalyticsJob, JobSettings
    from kbroker.kafka.analytics.store import AnalyticsFollower, dialog_rows

    home = Path(tempfile.mkdtemp(prefix="kbroker-demo-analytics-"))
    port = _free_port()
    say(f"starting a worker (receive progress, dashboard at http://127.0.0.1:{port}/dashboard)")
    with open(home / "worker.log", "wb") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kbroker",
                "worker",
                "--bootstrap",
                cluster.bootstrap,
                "--namespace",
                namespace,
                "--web-port",
                str(port),
                "--tick",
                "1",
                "--loglevel",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    job = follower = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/tasks/", worker, timeout)
        say("starting the Spark analytics job (local[*], 2 s trigger, 10 s windows)")
        job = AnalyticsJob(
            JobSettings(
                cluster=cluster,
                namespace=namespace,
                checkpoint=home / "checkpoint",
                history=home / "history",
                trigger=2.0,
                window=10.0,
                stale_after=STALE_AFTER,
            )
        ).start()
        deadline = time.monotonic() + timeout
        while job.batches < 1:  # reading, and holding back the reclaim, before the workload starts
            if time.monotonic() > deadline or not job.query.isActive:
                raise RuntimeError(f"the analytics job did not run a first batch within {timeout:g} s")
            time.sleep(0.2)
        with Broker(cluster, namespace) as broker:
            handles = [broker.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT) for _ in range(CLAIMS)]
            for i, h in enumerate(handles):
                broker.send(h, CLAIM, {"employee": f"e{i}", "amount": 10 + i, "item": "taxi"})
            say(f"sent {CLAIMS} expense claims on {CLAIMS} dialogs; approving {APPROVED} of them")
            approved = 0
            deadline = time.monotonic() + 30
            while approved < APPROVED and time.monotonic() < deadline:
                with broker.transaction() as tx:
                    approved += len(tx.receive("ExpenseQueue", top=APPROVED - approved, wait=2.0))
        sent_at = int(time.time() * 1000)
        follower = AnalyticsFollower(cluster, namespace)
        say(f"waiting for the other {CLAIMS - approved} claims to go stale ({STALE_AFTER:g} s) in the analytics topic")
        deadline, row = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            if follower.poll(0.5):
                continue  # not at the end yet: the topic holds earlier runs' windows too
            row = follower.latest().get("ExpenseQueue")
            if row and row["as_of"] >= sent_at + STALE_AFTER * 1000 and row["stale"]["queue"] >= CLAIMS - approved:
                break
        if row is None:
            raise RuntimeError(f"no analytics for ExpenseQueue within {timeout:g} s")
        queues, windows = follower.latest(), follower.queues()
        table = new_table(
            "stale-message analytics (arrivals and receives over the windows, the rest now)",
            "queue",
            "arrivals",
            "receives",
            "backlog",
            "stale >= 10 s",
            f"stale >= {STALE_AFTER:g} s",
            "oldest age s",
        )
        for q, w in sorted(queues.items()):
            table.add_row(
                q,
                str(sum(x["arrivals"] for x in windows[q])),
                str(sum(x["receives"] for x in windows[q])),
                str(w["backlog"]),
                str(w["stale"]["dispatcher_10s"]),
                str(w["stale"]["queue"]),
                "" if w["oldest_unreceived_age_s"] is None else f"{w['oldest_unreceived_age_s']:.1f}",
            )
        show(table)
        classes = Counter(r["class"] for r in dialog_rows(cluster, namespace))
        classes_table = new_table("dialogs by class (kbroker dialogs --class CLASS)", "class", "dialogs")
        for klass, n in sorted(classes.items()):
            classes_table.add_row(klass, str(n))
        show(classes_table)
        return {"queues": queues, "dialog_classes": dict(classes), "approved": approved}
    finally:
        if follower is not None:
            follower.close()
        if job is not None:
            job.stop()
            job.spark.stop()
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        say("[dim]analytics job and worker stopped[/]")


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")
        try:
            get(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the worker did not answer at {url} within {timeout:g} s")
