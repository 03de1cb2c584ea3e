"""Settings for the whole test session. The Kafka broker fixtures live in
tests/integration/conftest.py, so `pytest tests/unit` never starts a broker; helpers that tests
import live in tests.helpers."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.helpers import watchdog
from tests.helpers.grouping import groups_of_files

# No per-example deadline for property tests: on these shared 2-core machines an example that
# takes 200 ms says the machine is busy, not that the code is slow (a unit run beside a broker
# test failed so). Speed is the benchmarks' to measure.
settings.register_profile("kbroker", deadline=None)
settings.load_profile("kbroker")

# The suite's Kafka JVMs (the session's brokers, the ones tests start, stop and kill, clusters)
# compile with C1 only: most of them live minutes, and C2 spent about 40% of a session broker's
# CPU compiling code the run never used long. Measured on 34 routing, transaction and worker tests
# (-n 2): the brokers' CPU 129 s against 194 s, the run 191 s against 221 s. Set it (even empty)
# to choose otherwise.
os.environ.setdefault("KBROKER_BROKER_JAVA_OPTS", "-XX:TieredStopAtLevel=1")


def pytest_configure(config: pytest.Config) -> None:
    # A run ended by SIGTERM (a CI time-out, `timeout`) still tears its fixtures down, so the
    # embedded broker it started does not outlive it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    watchdog.keep_stderr()
    _own_ports()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    """pytest-timeout's deadline, kept by faulthandler's watchdog (tests/helpers/watchdog.py):
    the tracebacks reach the run's log under xdist, and a test stuck holding the GIL still ends."""
    watchdog.arm(settings.timeout)
    item.cancel_timeout = watchdog.disarm  # type: ignore[attr-defined]  # pytest-timeout calls it
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """A pytest-xdist worker that crashed (a test past its time-out) leaves what its test started
    running: end it, so a broker or a worker does not outlive the run."""
    if error is None:
        return
    basetemp = Path(node.config._tmp_path_factory.getbasetemp()) / f"popen-{node.gateway.id}"
    killed = watchdog.kill_processes_under(basetemp)
    if killed:
        sys.stderr.write(
            f"{node.gateway.id} crashed: killed the {len(killed)} processes its tests left under {basetemp}: {killed}\n"
        )


def _own_ports() -> None:
    """Under pytest-xdist (`make test` runs three processes) each process picks ports from a
    slice of its own (embedded.ports.port_range), brokers and workers it starts included: a node
    stopped and restarted on its port never finds it taken by the other process's broker."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or "KBROKER_PORT_RANGE" in os.environ:
        return
    from kbroker.embedded.ports import port_range

    low, high = port_range()
    width = (high - low) // int(count)
    first = low + int(worker[2:]) * width
    os.environ["KBROKER_PORT_RANGE"] = f"{first}-{first + width}"


# Files that take minutes, started first so that no process is left with one at the end.
SLOW_FIRST = tuple(
    f"tests/integration/test_{name}.py" if name not in ("spark", "secure") else name
    for name in (
        "cluster",
        "routing_clusters",
        "spark",
        "worker",
        "broker_restart",
        "reclaim",
        "endpoint_invariants",
        "transactions",
        "network_stall",
        "secure",
        "transport_competing",
    )
)
# Fixtures a process starts once for its whole session: the files that use them run in one
# process, so the session starts each once. A file that uses two (the analytics job on the secured
# cluster) joins their groups into one.
SHARED_SESSIONS = {"spark": ("spark", "start_analytics"), "secure": ("secure_kafka", "secure_admin")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The unit of work pytest-xdist hands a process (`--dist loadgroup`): a whole file, since
    module fixtures (a worker, a cluster) serve all its tests, or every file that uses Spark or
    the secured broker together. The groups are put in the order they should start."""

    def file_of(item: pytest.Item) -> str:
        return str(item.path.relative_to(config.rootpath))

    shared_of_file: dict[str, set[str]] = {}
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        shared_of_file.setdefault(file_of(item), set()).update(
            g for g, names in SHARED_SESSIONS.items() if uses & set(names)
        )
    group_of_file = groups_of_files(shared_of_file)

    def group(item: pytest.Item) -> str:
        return group_of_file[file_of(item)]

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    _deselect_opt_in(config, items)

    def rank(item: pytest.Item) -> int:
        return next((i for i, slow in enumerate(SLOW_FIRST) if slow in group(item).split("+")), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: within a rank, collection order


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a pytest-xdist process of `--dist loadgroup`: stop the run unless pytest-xdist put each
    test's group in its id, where its scheduler reads it. Without that it hands out single tests:
    both processes start each module's worker, Spark and the secured broker, a file's tests run in
    several processes at once, and nothing says so (pytest 9.2 keeps a test's id where pytest-xdist
    3.8 does not write: pytest-dev/pytest-xdist#1386; pyproject.toml keeps pytest below 9.2)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        watchdog.say(
            f"pytest-xdist's --dist loadgroup is not in effect with pytest {pytest.__version__} "
            f"({len(ungrouped)} tests without their group, e.g. {ungrouped[0]}): pytest-dev/pytest-xdist#1386; "
            "install the test extra's pytest (pip install -e '.[test]') or run without -n"
        )
        raise pytest.UsageError("pytest-xdist's --dist loadgroup is not in effect")


# Tests too slow for the default run, each with a command of its own (the Makefile's): collected,
# but deselected unless the `-m` expression names their marker (`pytest -m spark_cluster`).
OPT_IN = ("spark_cluster", "kafka_cluster", "bench_scale", "wheel", "compose", "long")


def _deselect_opt_in(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = config.getoption("markexpr", "") or ""
    left_out = {m for m in OPT_IN if m not in asked}
    dropped = [i for i in items if any(i.get_closest_marker(m) for m in left_out)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """A report's captured output made UTF-8 encodable: pytest-xdist sends it as UTF-8, and one
    lone surrogate in it (a log line carrying undecodable bytes) fails that send, which ends the
    process's session as an internal error with its test never reported."""
    report: pytest.TestReport = yield
    report.sections = [(title, _encodable(text)) for title, text in report.sections]
    return report


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# The last lines of each internal error (a pytest-xdist process's, passed on to this one): printed
# again at the very end of the run, where a CI log's tail shows them, above the summary's lines.
_INTERNAL_ERRORS: list[str] = []


def pytest_internalerror(excrepr: Any, excinfo: Any) -> None:
    said = [line[1:].strip() for line in str(excrepr).splitlines() if line.startswith("E ")]
    _INTERNAL_ERRORS.append((" | ".join(said[-3:]) or str(excinfo.value))[-600:])


_EXIT_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS["status"] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's result is decided and reported: leave without the interpreter's own teardown.
    A whole session leaves Kafka clients of many tests behind whose librdkafka threads still run,
    and OpenSSL's exit-time cleanup (librdkafka carries its own copy) raced one of them once
    (a segmentation fault in init_thread_deregister after '587 passed', which failed the run).
    Fixtures have been torn down by now: the embedded broker and workers are stopped."""
    if "status" not in _EXIT_STATUS:
        return
    import gc
    import os

    try:
        from confluent_kafka import Consumer, Producer
        from confluent_kafka.admin import AdminClient

        live = sum(isinstance(o, (Producer, Consumer, AdminClient)) for o in gc.get_objects())
        sys.stderr.write(f"kafka clients still open at the end of the session: {live}\n")
    except ImportError:
        pass
    for said in _INTERNAL_ERRORS:
        sys.stderr.write(f"internal error of the run: {said}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS["status"])
