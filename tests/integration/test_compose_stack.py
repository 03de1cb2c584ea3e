"""The compose stack run for real: compose/docker-compose.yml and the unchanged compose/Dockerfile
under podman and podman-compose (in `make test-long`; marker `compose`).

Where the registry's images cannot be pulled, they are made here: a Debian bookworm base from
Debian's packages (debootstrap), and on it stand-ins tagged with the names the files use,
`python:3.11-slim-bookworm` (Debian's Python 3.11) and `apache/kafka:4.4.0` (the same Kafka
release's jars, run as the official image runs them: tests/compose/). Then, as a user would:

- `podman-compose build`; `up -d` kafka, the worker, the analytics job, in that order, each once
  the one before is healthy (podman-compose 1.0.3 does not wait for `service_healthy`, and
  without systemd podman runs a health check only when asked: `podman healthcheck run`);
- the demo service exits 0 with both endpoints CD CLOSED;
- the worker's HTTP API and dashboard answer with the token and refuse without it;
- the analytics job reports the demo's messages;
- a second worker (`deploy.replicas: 2`: podman-compose 1.0.3 takes no `--scale`) shares the
  namespace: each queue's monitor has one owner, one of the two, and a backlog of claims the
  activated readers drain is answered once per claim;
- `down -v` removes every container and volume it made (and the network, which podman-compose
  1.0.3 leaves, is removed by name).
Build and start-up times and image sizes are printed (`pytest -s`)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.compose

COMPOSE = ROOT / "compose" / "docker-compose.yml"
IMAGES = ROOT / "tests" / "compose"
BASE = "kbroker-test/debian-base:bookworm"
DEBIAN = "http://deb.debian.org/debian"
# runc and cgroupfs: the default crun fails on this kernel's hybrid cgroups, and podman's default
# ulimits above the machine's hard limits are refused.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
CLAIMS = 40


class Stack:
    """podman and podman-compose with this test's settings, for one compose project."""

    def __init__(self, tmp: Path, project: str, token: str):
        conf = tmp / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.tmp, self.project, self.token = tmp, project, token
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(conf),
            "KBROKER_WEB_TOKEN": token,
            "KBROKER_WEB_PORTS": "",  # each worker a free host port (podman maps no range to one port)
        }
        self.files = [COMPOSE]
        self.times: dict[str, float] = {}

    def podman(self, *args: str, timeout: float = 600, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr[-3000:]}")
        return done

    def compose(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
        files = [a for f in self.files for a in ("-f", str(f))]
        done = subprocess.run(
            ["podman-compose", "-p", self.project, *files, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
        assert done.returncode == 0, f"podman-compose {' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def timed(self, what: str, fn: Any, *args: Any) -> Any:
        began = time.monotonic()
        out = fn(*args)
        self.times[what] = round(time.monotonic() - began, 1)
        return out

    def container(self, service: str, n: int = 1) -> str:
        return f"{self.project}_{service}_{n}"

    def healthy(self, container: str, within: float) -> None:
        deadline = time.monotonic() + within
        while self.podman("healthcheck", "run", container, check=False, timeout=60).returncode != 0:
            state = self.podman("inspect", "--format", "{{.State.Status}}", container, check=False).stdout.strip()
            if state in ("exited", "stopped") or time.monotonic() > deadline:
                logs = (
                    self.podman("logs", container, check=False).stdout
                    + self.podman("logs", container, check=False).stderr
                )
                raise AssertionError(f"{container} not healthy ({state}):\n{logs[-3000:]}")
            time.sleep(2)

    def python(self, container: str, script: str, timeout: float = 300, check: bool = True) -> str | None:
        """Run `script` with the image's Python inside `container`; its stdout (None: it failed,
        and `check` is off)."""
        done = self.podman("exec", "-i", container, "python", "-", input=script, timeout=timeout, check=False)
        if done.returncode != 0 and not check:
            print(f"{container}: the script failed, asking again: {done.stderr.strip().splitlines()[-1:]}")
            return None
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def url(self, container: str) -> str:
        host = self.podman("port", container, "6066").stdout.strip().splitlines()[0]
        return f"http://{host}"

    def get(self, url: str, token: str | None) -> tuple[int, bytes]:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""

    def image_size_mb(self, image: str) -> int:
        return int(self.podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()) // 1_000_000


def pulled(stack: Stack, image: str) -> bool:
    """Whether the registry's image is here or can be pulled (quickly: no registry answers here)."""
    if stack.podman("image", "exists", image, check=False).returncode == 0:
        return True
    try:
        return stack.podman("pull", "-q", f"docker.io/{image}", check=False, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def stand_ins(stack: Stack) -> None:
    """The base image and the stand-ins for the registry's images, made where they are missing."""
    from kbroker.embedded.jvm import fetch_jars
    from kbroker.embedded.kafka_tools import tool_jars

    if stack.podman("image", "exists", BASE, check=False).returncode != 0:
        root = stack.tmp / "debian"
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root), DEBIAN], check=True, timeout=900)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        stack.podman("import", "-", BASE, stdin=tar.stdout)
        assert tar.wait(60) == 0
        shutil.rmtree(root)
    if not pulled(stack, "python:3.11-slim-bookworm"):
        ctx = stack.tmp / "python"
        shutil.copytree(IMAGES / "python", ctx)
        (ctx / "extra-ca").mkdir()
        for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):  # the machine's proxy, if any
            shutil.copy(crt, ctx / "extra-ca")
        stack.timed("build python stand-in", stack.podman, "build", "-q", "-t", "python:3.11-slim-bookworm", str(ctx))
    if not pulled(stack, "apache/kafka:4.4.0"):
        ctx = stack.tmp / "kafka"
        shutil.copytree(IMAGES / "kafka", ctx)
        (ctx / "libs").mkdir()
        for libs in (fetch_jars(print), tool_jars(print)):
            for jar in libs.glob("*.jar"):
                if not (ctx / "libs" / jar.name).exists():
                    shutil.copy(jar, ctx / "libs")
        shutil.copy(ROOT / "kbroker" / "embedded" / "log4j2.properties", ctx)
        stack.timed("build kafka stand-in", stack.podman, "build", "-q", "-t", "apache/kafka:4.4.0", str(ctx))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    if not (shutil.which("podman") and shutil.which("podman-compose") and shutil.which("debootstrap")):
        pytest.fail("podman, podman-compose and debootstrap are needed: `scripts/prereqs.sh long` installs them")
    s = Stack(tmp_path, f"kbt{secrets.token_hex(3)}", secrets.token_urlsafe(24))
    try:
        yield s
    finally:
        subprocess.run(
            ["podman-compose", "-p", s.project, *[a for f in s.files for a in ("-f", str(f))], "down", "-v"],
            env=s.env,
            capture_output=True,
            timeout=300,
            cwd=ROOT,
        )
        left = s.podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={s.project}", check=False)
        if left.stdout.split():
            s.podman("rm", "-f", *left.stdout.split(), check=False)
        s.podman("network", "rm", f"{s.project}_default", check=False)
        # The project's image names; the build's layers stay cached for the next run.
        s.podman("rmi", *(f"{s.project}_{svc}" for svc in ("worker", "analytics", "demo")), check=False)


WINDOWS = """
import orjson
from kbroker.kafka.snapshot import latest_values
counts = {}
for key, value in (latest_values("kafka:9092", "kbroker.default.analytics", 20) or {}).items():
    row = orjson.loads(value)
    if row.get("kind") == "queue_window":
        arrivals, receives = counts.get(row["queue"], (0, 0))
        counts[row["queue"]] = (arrivals + row["arrivals"], receives + row["receives"])
print(orjson.dumps(counts).decode())
"""

BACKLOG = f"""
import orjson, time
import kbroker
from kbroker.cli.demo import CLAIM, CONTRACT, EMPLOYEES, EXPENSES
with kbroker.connect("kafka:9092") as broker:
    sent = set()
    with broker.transaction() as tx:
        for n in range({CLAIMS}):
            h = tx.begin_dialog(EMPLOYEES, EXPENSES, CONTRACT)
            tx.send(h, CLAIM, {{"claim": n}})
            sent.add(h)
    answered = []
    deadline = time.monotonic() + 240
    while len(answered) < {CLAIMS} and time.monotonic() < deadline:
        with broker.transaction() as tx:
            for m in tx.receive("EmployeeQueue", top=50, wait=2):
                if m.message_type_name.endswith("ExpenseApproval") and m.conversation_handle in sent:
                    answered.append(m.conversation_handle)
    time.sleep(3)
    with broker.transaction() as tx:
        answered += [m.conversation_handle for m in tx.receive("EmployeeQueue", top=50, wait=1)
                     if m.message_type_name.endswith("ExpenseApproval") and m.conversation_handle in sent]
print(orjson.dumps({{"sent": len(sent), "answers": len(answered), "claims_answered": len(set(answered))}}).decode())
"""


@pytest.mark.timeout(3600)
def test_the_compose_stack_runs_under_podman(stack: Stack) -> None:
    stack.timed("images made here", stand_ins, stack)
    stack.timed("podman-compose build", stack.compose, "build")
    began = time.monotonic()
    stack.compose("up", "-d", "kafka")
    stack.healthy(stack.container("kafka"), 180)
    stack.compose("up", "-d", "worker")
    worker = stack.container("worker")
    stack.healthy(worker, 240)  # its health check: `kbroker tasks`, sending the token
    stack.times["up to a healthy worker"] = round(time.monotonic() - began, 1)
    url = stack.url(worker)
    assert stack.get(f"{url}/tasks/", stack.token)[0] == 200
    assert stack.get(f"{url}/tasks/", None)[0] == 401
    assert stack.get(f"{url}/tasks/", "not-the-token-0123456789")[0] == 401
    assert stack.get(f"{url}/dashboard", None)[0] == 401
    assert stack.get(f"{url}/dashboard", stack.token)[0] == 200
    assert json.loads(stack.podman("exec", worker, "kbroker", "tasks", "--json").stdout) == []  # no task yet
    wrong = stack.podman(
        "exec", "-e", "KBROKER_WEB_TOKEN=not-the-token-0123456789", worker, "kbroker", "tasks", check=False
    )
    assert wrong.returncode == 1 and "401" in wrong.stderr, wrong.stderr

    stack.compose("up", "-d", "analytics")
    stack.compose("up", "-d", "demo")
    demo = stack.container("demo")
    assert stack.podman("wait", demo, timeout=300).stdout.strip() == "0"
    out = stack.podman("logs", demo).stdout
    assert len([line for line in out.splitlines() if "CD CLOSED" in line]) == 2, out[-2000:]
    deadline, counts = time.monotonic() + 300, {}
    while time.monotonic() < deadline:  # the demo: a claim and an EndDialog each way
        out = stack.python(worker, WINDOWS, check=False)  # the job reads and writes as it starts
        counts = json.loads(out) if out is not None else counts
        if counts.get("ExpenseQueue") == [2, 2] and counts.get("EmployeeQueue") == [2, 2]:
            break
        time.sleep(5)
    assert counts == {"ExpenseQueue": [2, 2], "EmployeeQueue": [2, 2]}

    scaled = stack.tmp / "two-workers.yml"
    scaled.write_text("services:\n  worker:\n    deploy:\n      replicas: 2\n")
    stack.files.append(scaled)
    stack.compose("up", "-d", "worker")
    second = stack.container("worker", 2)
    stack.healthy(second, 240)
    ids = {json.loads(stack.get(f"{stack.url(w)}/tasks/", stack.token)[1])["worker"] for w in (worker, second)}
    assert len(ids) == 2
    alter = stack.podman(
        "exec",
        worker,
        "kbroker",
        "queue",
        "alter",
        "ExpenseQueue",
        "--activation",
        "on",
        "--procedure",
        "kbroker.samples.expenses:process_claims",
        "--max-readers",
        "2",
    )
    assert alter.returncode == 0
    result = json.loads((stack.python(worker, BACKLOG, timeout=400) or "").strip().splitlines()[-1])
    assert result == {"sent": CLAIMS, "answers": CLAIMS, "claims_answered": CLAIMS}  # each answered once
    status, body = stack.get(f"{stack.url(second)}/monitors/", stack.token)
    assert status == 200
    rows = json.loads(body)
    queues = [r["queue"] for r in rows]
    assert "ExpenseQueue" in queues and len(queues) == len(set(queues))  # one monitor per queue
    assert {r["worker"] for r in rows} <= ids  # each owned by one of the two workers
    (expense,) = [r for r in rows if r["queue"] == "ExpenseQueue"]
    assert expense["activation"] == "ON" and expense["age"] < 30  # kept by its owner now

    sizes = {i: stack.image_size_mb(i) for i in ("python:3.11-slim-bookworm", "apache/kafka:4.4.0")}
    sizes[f"{stack.project}_worker"] = stack.image_size_mb(f"{stack.project}_worker")
    stack.compose("down", "-v")
    label = f"label=io.podman.compose.project={stack.project}"
    assert stack.podman("ps", "-aq", "--filter", label).stdout.split() == []
    assert [v for v in stack.podman("volume", "ls", "-q").stdout.split() if v.startswith(stack.project)] == []
    # podman-compose 1.0.3's `down` leaves the project's network (docs/compose.md): removed by name.
    left = [n for n in stack.podman("network", "ls", "-q").stdout.split() if n.startswith(stack.project)]
    assert left in ([], [f"{stack.project}_default"])
    if left:
        stack.podman("network", "rm", *left)
    assert [n for n in stack.podman("network", "ls", "-q").stdout.split() if n.startswith(stack.project)] == []
    print(f"compose stack: times (s) {stack.times}; image sizes (MB) {sizes}")
