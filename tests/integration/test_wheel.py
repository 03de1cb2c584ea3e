"""The wheel a user installs: built with `python -m build` (the sdist, then the wheel from it),
installed alone in a new virtualenv (no editable install, no test extras), and run from a folder
that is not the checkout: the embedded broker, the sample namespace shipped inside the wheel, a
send and a receive, the demo, and the worker with the `worker` extra. Minutes (PyPI downloads on
a cold pip cache), so in `make test-long`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from tests.helpers import ROOT, free_port, stop_process, wait_for

pytestmark = pytest.mark.wheel


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}: {out.stderr[-2000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], ROOT, dict(os.environ), 600)
    [whl] = dist.glob("kbroker-*.whl")
    [sdist] = dist.glob("kbroker-*.tar.gz")
    listing = subprocess.run(["tar", "tzf", str(sdist)], capture_output=True, text=True, check=True).stdout
    assert "kbroker/core/catalog/samples/expenses.yaml" in listing  # the wheel above was built from it
    return whl


def test_the_wheel_alone_runs_the_samples_a_send_and_receive_the_demo_and_the_worker(wheel, tmp_path):
    venv, outside, data = tmp_path / "venv", tmp_path / "elsewhere", tmp_path / "broker"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KBROKER_", "PYTHON", "VIRTUAL_ENV"))}
    run([sys.executable, "-m", "venv", str(venv)], outside, env)
    pip, kbroker = str(venv / "bin" / "pip"), str(venv / "bin" / "kbroker")
    run([pip, "install", "--quiet", str(wheel)], outside, env, 900)
    where = run([str(venv / "bin" / "python"), "-c", "import kbroker; print(kbroker.__file__)"], outside, env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout  # the installed copy, not the checkout
    port = free_port()
    run([kbroker, "broker", "start", "--data-dir", str(data), "--port", str(port)], outside, env, 300)
    worker = None
    try:
        env["KBROKER_BOOTSTRAP"] = f"127.0.0.1:{port}"
        env["KBROKER_NAMESPACE"] = "wheel"
        applied = json.loads(run([kbroker, "apply", "--samples", "--json"], outside, env).stdout)
        assert applied["objects_published"] > 0, applied
        sent = json.loads(
            run(
                [kbroker, "send", "--from", EMP, "--to", EXP, "--contract", CONTRACT, "--type", CLAIM]
                + ["--body", '{"amount": 12.5}', "--json"],
                outside,
                env,
            ).stdout
        )
        got = run([kbroker, "receive", "ExpenseQueue", "--wait", "15"], outside, env)
        [message] = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
        assert message["message_type_name"] == CLAIM and message["message_id"] == sent["message_id"]

        demo = run([kbroker, "demo", "--namespace", "wheeldemo"], outside, env, 300)
        assert "BEGIN DIALOG" in demo.stdout and "CD" in demo.stdout, demo.stdout

        run([pip, "install", "--quiet", f"{wheel}[worker]"], outside, env, 900)
        web = free_port()
        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen(
            [kbroker, "worker", "--web-port", str(web)], cwd=outside, env=env, stdout=log, stderr=subprocess.STDOUT
        )

        def answers() -> bool:
            try:
                return worker.poll() is None and httpx.get(f"http://127.0.0.1:{web}/tasks/", timeout=2).is_success
            except httpx.HTTPError:
                return False

        wait_for(answers, 120, "the installed worker's HTTP API")
    finally:
        stop_process(worker)
        subprocess.run([kbroker, "broker", "stop", "--data-dir", str(data)], cwd=outside, env=env, timeout=120)
    assert worker.returncode in (0, -signal.SIGTERM), (tmp_path / "worker.log").read_text()[-2000:]
