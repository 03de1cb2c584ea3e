"""Every CLI error is one line on stderr and a non-zero exit: pydantic's validation errors and a
missing optional extra included."""

from __future__ import annotations

import os
import subprocess
import sys

import click
from click.testing import CliRunner

from kbroker.cli import handle_errors
from kbroker.core.catalog.models import Queue


@click.command()
@click.option("--procedure")
@handle_errors
def validate_queue(procedure: str) -> None:
    # What `kbroker queue alter` does with its options: validate them with the catalog's model.
    Queue.model_validate(
        {"name": "ExpenseQueue", "activation": {"status": "ON", "procedure": procedure, "max_queue_readers": 1}}
    )


@click.command()
@handle_errors
def needs_faust() -> None:
    raise ModuleNotFoundError("No module named 'faust'", name="faust")


@click.command()
@handle_errors
def needs_an_unknown_package() -> None:
    raise ModuleNotFoundError("No module named 'nosuchpackage'", name="nosuchpackage")


def test_a_pydantic_validation_error_is_one_line_naming_the_field():
    result = CliRunner().invoke(validate_queue, ["--procedure", "notaprocedure"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "kbroker: error: activation.procedure: procedure must be 'module:function', not 'notaprocedure'"
    ]


def test_a_missing_extra_is_one_line_naming_it():
    result = CliRunner().invoke(needs_faust)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "kbroker: error: faust is not installed: this command needs kbroker's worker extra "
        "(pip install 'kbroker[worker]')"
    ]


def test_a_missing_package_of_no_extra_is_not_hidden():
    result = CliRunner().invoke(needs_an_unknown_package)
    assert isinstance(result.exception, ModuleNotFoundError)


def run_without(packages: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter where `packages` cannot be imported (as if not installed)."""
    program = (
        "import sys\n"
        f"for name in {packages!r}:\n"
        "    sys.modules[name] = None  # import fails with ModuleNotFoundError, find_spec says None\n"
        "from kbroker.cli import main\n"
        f"main({argv!r}, prog_name='kbroker')\n"
    )
    env = {**os.environ, "KBROKER_BOOTSTRAP": "127.0.0.1:1"}  # nothing may get as far as connecting
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)


def test_kbroker_worker_without_faust_names_the_worker_extra():
    proc = run_without(["faust", "aiokafka"], ["worker"])
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "kbroker: error: faust is not installed: this command needs kbroker's worker extra "
        "(pip install 'kbroker[worker]')"
    ]


def test_kbroker_bench_activation_without_faust_names_the_bench_extra():
    proc = run_without(["faust", "aiokafka"], ["bench", "activation-latency", "--no-docs"])
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "pip install 'kbroker[bench]'" in lines[0], proc.stderr


def test_analytics_run_refuses_a_spark_setting_without_a_value_in_one_line():
    from kbroker.cli import main

    result = CliRunner().invoke(main, ["analytics", "run", "--bootstrap", "127.0.0.1:1", "--conf", "spark.x"])
    assert result.exit_code == 1
    assert result.output.strip() == "kbroker: error: --conf 'spark.x' must be KEY=VALUE"


def test_dialogs_refuses_an_unknown_class_in_one_line_naming_the_classes():
    from kbroker.cli import main

    result = CliRunner().invoke(main, ["dialogs", "--bootstrap", "127.0.0.1:1", "--class", "busy"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "kbroker: error: --class 'busy' is not a class; one of erroring, stale"
    )


@click.command()
@handle_errors
def refused() -> None:
    from kbroker.errors import PermissionDeniedError

    raise PermissionDeniedError(resource="topic kbroker.s.catalog", operation="WRITE", what="publishing")


def test_a_refusal_is_one_line_naming_principal_operation_and_resource():
    result = CliRunner().invoke(refused, [])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "kbroker: error: permission denied: this client's principal may not WRITE topic kbroker.s.catalog (publishing)"
    ]


def test_a_refusal_names_the_principal_of_the_commands_client_settings(tmp_path):
    from kbroker.cli.common import Target, _principal

    props = tmp_path / "alice.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\nsasl.password=secret\n"
    )
    assert _principal(Target("127.0.0.1:9092", "s", str(props))) == "User:alice"
    assert _principal(Target("127.0.0.1:9092", "s", None)) == "User:ANONYMOUS"
    assert _principal(None) is None


def test_tasks_asks_the_worker_at_the_port_the_worker_takes_too(monkeypatch):
    """`kbroker tasks` asked port 6066 whatever --web-port the worker had; the option and
    KBROKER_WEB_PORT are now the worker's own (nothing listens on the port chosen here)."""
    import socket

    from kbroker.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # closed again before the CLI asks: refused at once
    monkeypatch.delenv("KBROKER_WEB_TOKEN", raising=False)
    monkeypatch.delenv("KBROKER_WEB_TOKEN_FILE", raising=False)
    monkeypatch.setenv("KBROKER_WEB_PORT", str(free))
    result = CliRunner().invoke(main, ["tasks", "--json"])
    assert result.exit_code == 1
    assert f"worker at http://127.0.0.1:{free} does not answer" in result.output
    result = CliRunner().invoke(main, ["tasks", "--url", "http://127.0.0.1:1", "--json"])
    assert "worker at http://127.0.0.1:1 does not answer" in result.output  # --url wins
    worker = main.get_command(click.Context(main), "worker")
    assert worker is not None
    (port,) = [p for p in worker.params if p.name == "web_port"]
    assert port.envvar == "KBROKER_WEB_PORT" and port.default == 6066
