"""What pyproject.toml installs, and the Makefile's entry points: the base install covers every
package kbroker imports outside the worker, the extras the rest, `make demo` / `make test` pass
their variables and checks on, `make lint` runs the static checks alone (before any broker or
Maven), and CI runs `make lint`, then the README's test command, then the long runs."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The distribution that provides each import name kbroker uses.
DISTRIBUTION_OF = {
    "confluent_kafka": "confluent-kafka",
    "yaml": "PyYAML",
    "faust": "faust-streaming",
    "prometheus_client": "prometheus-client",
    "opentelemetry": "opentelemetry-api",
}


def names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings ("rich>=13" -> "rich")."""
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the absolute, non-standard-library imports anywhere in a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
    return {n for n in found if n not in sys.stdlib_module_names and n not in ("kbroker", "__future__")}


def test_every_import_is_installed_by_the_base_or_by_its_extra():
    base = names(PROJECT["project"]["dependencies"])
    extras = {k: names(v) for k, v in PROJECT["project"]["optional-dependencies"].items()}  # analytics: pyspark
    for module in (ROOT / "kbroker").rglob("*.py"):
        parts = module.relative_to(ROOT).parts
        allowed = (
            base
            | (extras["worker"] if "worker" in parts else set())
            | (extras["analytics"] if "analytics" in parts else set())
            | (extras["tracing"] if parts[-1] == "tracing.py" else set())
            | (extras["bench"] if "bench" in parts else set())
            | (extras["outbox"] if parts[-1].endswith("outbox.py") else set())
        )  # the scaling plot: matplotlib; the outboxes: SQLAlchemy
        for name in third_party_imports(module):
            assert DISTRIBUTION_OF.get(name, name).lower() in allowed, f"{module}: {name} is not installed by it"


def test_the_base_install_has_no_worker_spark_or_unused_package():
    base = names(PROJECT["project"]["dependencies"])
    assert base == {
        "confluent-kafka",
        "orjson",
        "pydantic",
        "pyyaml",
        "defusedxml",
        "psutil",
        "click",
        "rich",
        "jproperties",
        "scramp",
        "cryptography",  # these three: secured clusters
        "prometheus-client",  # kbroker/metrics.py: every process counts what it does
        "lark",  # kbroker import-sql's T-SQL grammar
        "xmlschema",  # VALID_XML WITH SCHEMA COLLECTION
    }


def test_the_extras():
    extras = PROJECT["project"]["optional-dependencies"]
    assert names(extras["worker"]) == {"faust-streaming", "aiokafka", "aiohttp"}
    assert extras["analytics"][0] == "pyspark==4.2.0"  # the release whose Kafka source Maven Central serves
    assert names(extras["analytics"]) == {"pyspark", "pyarrow"}
    assert "kbroker[worker,analytics,bench,tracing,outbox]" in extras["test"]
    assert names(extras["outbox"]) == {"sqlalchemy"}
    assert names(extras["tracing"]) == {"opentelemetry-api"}
    assert {
        "pytest",
        "pytest-timeout",
        "hypothesis",
        "testcontainers",
        "import-linter",
        "mypy",
        "ruff",
        "pre-commit",
    } <= names(extras["test"])  # `make lint` and the pre-commit hooks


def test_the_license_is_an_spdx_expression_for_a_setuptools_that_reads_it():
    assert PROJECT["project"]["license"] == "Apache-2.0"
    assert all((ROOT / name).is_file() for name in PROJECT["project"]["license-files"])
    assert "setuptools>=77" in PROJECT["build-system"]["requires"]


def make_dry_run(*args: str) -> list[str]:
    # Under `make test` the outer make's MAKEFLAGS/MAKELEVEL would make this one print
    # "Entering/Leaving directory" lines: run it as a fresh make.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(
        ["make", "--no-print-directory", "--dry-run", "--always-make", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    ).stdout
    return out.splitlines()


def test_make_demo_passes_port_and_data_dir_on():
    assert make_dry_run("demo")[-1] == ".venv/bin/kbroker demo --port 9092"
    assert (
        make_dry_run("demo", "PORT=19092", "DATA_DIR=/tmp/kbroker-demo")[-1]
        == ".venv/bin/kbroker demo --port 19092 --data-dir /tmp/kbroker-demo"
    )


def test_make_demo_installs_only_what_the_demo_needs():
    lines = make_dry_run("demo")
    text = "\n".join(lines)
    assert "pip install --quiet -e . " in text and "[test]" not in text and "[worker" not in text
    assert "scripts/prereqs.sh demo" in lines and "scripts/toxiproxy.sh" not in text
    assert make_dry_run("demo-analytics")[-2] == ".venv/bin/pip install --quiet -e '.[worker,analytics]'"
    prereqs = (ROOT / "scripts" / "prereqs.sh").read_text()
    demo_part = prereqs[prereqs.index("set -euo pipefail") : prereqs.index("if ! $demo; then")]
    assert "maven" in demo_part and not any(tool in demo_part for tool in ("golang-go", "chromium", "prometheus"))


# `make lint`'s checks, in order: the lint rules, the layer contracts, the types.
LINT = [
    ".venv/bin/ruff format --check kbroker tests scripts examples",
    ".venv/bin/ruff check kbroker tests scripts examples",
    ".venv/bin/lint-imports",
    ".venv/bin/mypy kbroker",
    'out=$(.venv/bin/python -m pytest --collect-only -q 2>&1) || { echo "$out" | tail -40; exit 1; }; '
    'echo "$out" | grep -E "tests? collected"',
]


def test_make_lint_runs_the_static_checks_on_the_virtualenv_alone():
    lines = make_dry_run("lint")
    assert lines[-len(LINT) :] == LINT
    # Only the virtualenv before them (made on a fresh clone): no Java, no Maven, no broker.
    assert ".venv/bin/kbroker broker fetch" not in lines and "scripts/prereqs.sh" not in lines
    assert any(line.startswith(".venv/bin/pip install") for line in lines)


def test_make_test_runs_make_lint_before_the_set_up_and_the_tests():
    lines = make_dry_run("test")
    # Three processes, files grouped so a module's or a session's shared broker serves one process;
    # one that crashes is not replaced (pytest-xdist #1378: the run could wait for ever).
    assert lines[-1] == ".venv/bin/pytest -n 3 --dist loadgroup --no-loadscope-reorder --max-worker-restart 0"
    assert make_dry_run("test", "PARALLEL=")[-1] == ".venv/bin/pytest"  # one process, as documented
    start = lines.index(LINT[0])
    assert lines[start : start + len(LINT)] == LINT  # the static checks, as `make lint` runs them
    assert start + len(LINT) < lines.index(".venv/bin/kbroker broker fetch") < len(lines) - 1  # before Maven


def readme_test_command() -> str:
    """The command the README gives under "Run the tests" (its indented code line)."""
    after = (ROOT / "README.md").read_text().split("**Run the tests**", 1)[1]
    return next(line.strip() for line in after.splitlines() if line.startswith("    ") and line.strip())


def test_ci_runs_make_lint_then_the_readme_test_command_then_the_long_runs():
    assert readme_test_command() == "make test"
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in script if line.startswith("make")]
    assert commands == ["make lint", readme_test_command(), "make test-long"]
    assert script[-1] == "make test-long" and "set -euo pipefail" in script  # a failed step ends the run
