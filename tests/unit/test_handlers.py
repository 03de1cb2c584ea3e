"""Task handlers (no Kafka): procedures run on the pool, exits are reported, a handler thread that
died is replaced by the tick's restart_dead()."""

from __future__ import annotations

import threading
import time

import pytest

from kbroker.worker.activation.handlers import OWN_PROCEDURE_MODULES, TaskHandlers, allowed, resolve

RAN = []
GATE = threading.Event()
HERE = (__name__,)  # the procedures the pools of these tests allow


def record(broker, queue):
    RAN.append((broker, queue))


def die(broker, queue):
    raise SystemExit("a handler thread that dies")  # not an Exception: takes the thread down


def block(broker, queue):
    GATE.wait(10)


def wait_until(pred, timeout=5.0):
    deadline = time.time() + timeout
    while not pred() and time.time() < deadline:
        time.sleep(0.01)
    return pred()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_handler_is_restarted_and_the_pool_keeps_working():
    exits = []
    pool = TaskHandlers("B", lambda task, ok: exits.append((task.procedure, ok)), size=1, modules=HERE)
    try:
        pool.launch("Q", f"{__name__}:die", 0)
        assert wait_until(lambda: exits and not pool._threads[0].is_alive())
        assert exits == [(f"{__name__}:die", False)]
        assert pool.restart_dead() == 1 and pool.restarted == 1
        pool.launch("Q", f"{__name__}:record", 1)
        assert wait_until(lambda: ("B", "Q") in RAN), "the replaced handler runs procedures"
    finally:
        pool.close(timeout=2)


def test_running_tasks_are_listed_and_capped_by_the_pool_size():
    GATE.clear()
    pool = TaskHandlers("B", lambda task, ok: None, size=2, modules=HERE)
    try:
        for g in range(3):
            pool.launch("Q", f"{__name__}:block", g)
        assert wait_until(lambda: len(pool.rows()) == 2)
        assert pool.waiting() == 1 and {r["queue"] for r in pool.rows()} == {"Q"}
    finally:
        GATE.set()
        pool.close(timeout=5)


@pytest.mark.parametrize("bad", ["nocolon", "no.such.module:f", f"{__name__}:missing", ":f", "m:"])
def test_bad_procedure_names_are_one_clear_error(bad):
    with pytest.raises(ValueError, match="procedure"):
        resolve(bad)


@pytest.mark.parametrize(
    "procedure,ok",
    [
        ("kbroker.samples.expenses:approve", True),  # kbroker's own
        ("kbroker.bench.procedures:drain", False),  # the bench's worker allows it itself
        ("tests.helpers.procedures:stub", True),  # added by configuration: a package allows its modules
        ("tests.helpers:stub", True),
        ("tests.helpersX.procedures:stub", False),  # a prefix of the name is not the package
        ("builtins:print", False),
        ("os:system", False),
        ("kbroker.cli.main:main", False),  # kbroker, but not a procedure module
    ],
)
def test_only_allowed_modules_procedures_run(procedure, ok):
    assert allowed(procedure, OWN_PROCEDURE_MODULES + ("tests.helpers",)) is ok


def test_a_procedure_outside_the_allowed_modules_is_never_imported_nor_called():
    """The handlers check the allow-list again right before importing: whatever chose the
    procedure (a forged monitor event), a module not allowed is not even imported."""
    import sys

    exits = []
    pool = TaskHandlers("B", lambda task, ok: exits.append((task.procedure, ok)), size=1, modules=("kbroker.samples",))
    try:
        RAN.clear()
        pool.launch("Q", f"{__name__}:record", 0)
        pool.launch("Q", "antigravity:fly", 1)  # a module whose import would show
        assert wait_until(lambda: len(exits) == 2)
        assert exits == [(f"{__name__}:record", False), ("antigravity:fly", False)]
        assert RAN == [] and "antigravity" not in sys.modules
    finally:
        pool.close(timeout=2)
