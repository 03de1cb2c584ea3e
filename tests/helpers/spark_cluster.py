"""A Spark standalone cluster on this machine for a test: a master and workers started with
pyspark's own launcher (bin/spark-class), each a process group of its own (a worker and the
executors it launches), all bound to loopback, logging to a folder of the test's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port, wait_for


def job_conf() -> list[str]:
    """`kbroker analytics run` options for a job on such a cluster: executors that fit a worker of
    1g, and this Python for their Python tasks (the history's writes), as a cluster's workers need one
    with pyspark of the driver's minor version (docs/analytics.md)."""
    return ["--conf", "spark.executor.memory=512m", "--conf", f"spark.pyspark.python={sys.executable}"]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkCluster:
    """start(): a master and `workers` workers of `cores` cores each, registered; stop(): every
    process of it killed (also when start failed half-way)."""

    def __init__(self, home: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port, self.webui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.home),
            "SPARK_WORKER_DIR": str(self.home / "work"),
        }

    def _launch(self, name: str, *args: str) -> subprocess.Popen:
        with open(self.home / f"{name}.log", "wb") as out:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def start(self, timeout: float = 120.0) -> "SparkCluster":
        try:
            self.master = self._launch(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui),
            )
            wait_for(
                lambda: self.state() is not None,
                timeout,
                f"the Spark master ({self.home / 'master.log'})",
                interval=0.5,
                seen=lambda: self._exited(),
            )
            for _ in range(self.n_workers):
                self.add_worker()
            wait_for(
                lambda: len(self.alive_workers()) == self.n_workers,
                timeout,
                "the workers registered",
                interval=0.5,
                seen=lambda: (self.state(), self._exited()),
            )
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self) -> subprocess.Popen:
        n = len(self.workers)
        work = self.home / f"worker-{n}"
        work.mkdir(exist_ok=True)
        proc = self._launch(
            f"worker-{n}",
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--webui-port",
            str(free_port()),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(work),
        )
        self.workers.append(proc)
        return proc

    def state(self) -> dict[str, Any] | None:
        """The master's own view (its web UI's /json/), None while it does not answer."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.webui}/json/", timeout=3).json()
        except (httpx.HTTPError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in (self.state() or {}).get("workers", []) if w.get("state") == "ALIVE"]

    def running_apps(self) -> list[dict[str, Any]]:
        return (self.state() or {}).get("activeapps", [])

    def _exited(self) -> list[tuple[str, int]]:
        procs = [("master", self.master)] + [(f"worker-{i}", w) for i, w in enumerate(self.workers)]
        return [(name, p.returncode) for name, p in procs if p is not None and p.poll() is not None]

    def kill_worker(self, n: int) -> None:
        """Worker n lost as a machine is: its JVM and the executors it launched, kill -9 at once."""
        _kill_group(self.workers[n], signal.SIGKILL)

    def stop(self) -> None:
        for proc in [*self.workers, self.master]:
            if proc is not None:
                _kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in [*self.workers, self.master]:
            if proc is not None:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _kill_group(proc, signal.SIGKILL)  # what SIGTERM left (an executor still exiting)
                proc.wait(30)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
