"""`import kbroker`, the pure core and `kbroker --help` start without the heavy packages: each
runs in a fresh interpreter, which reports the modules it loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

REPORT = "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))\n"
HELP = (
    "import contextlib, io\n"
    "from kbroker.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    main(['--help'], standalone_mode=False)\n"
)
CLIENTS = ["confluent_kafka", "pydantic", "faust", "aiokafka", "pyspark", "rich"]


def loaded_by(program: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", program + REPORT], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return set(out.split())


def top_level(modules: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in modules}


@pytest.mark.parametrize("statement", ["import kbroker", "import kbroker.core.receive.offsets"])
def test_the_facade_and_the_core_load_no_client(statement):
    assert top_level(loaded_by(statement)) & set(CLIENTS) == set()


def test_kbroker_help_loads_no_client_no_worker_and_no_bench_harness():
    loaded = loaded_by(HELP)
    assert top_level(loaded) & {*CLIENTS, "psutil", "httpx", "yaml"} == set()
    assert {
        "kbroker.bench.harness",
        "kbroker.worker.app",
        "kbroker.sdk.broker",
        "kbroker.embedded.broker",
    } & loaded == set()
