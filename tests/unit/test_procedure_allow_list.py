"""The activation allow-list takes only a public function the module defines (worker/activation/
handlers.py): `kbroker.samples.expenses:__class__` was launched (any attribute of an allowed module
passed), and a TypeError followed. A private name, a class, a constant, a function or any other
name the module imported from elsewhere is refused as a module outside the list is: the monitor
does not activate the queue (worker/activation/monitors.py), and a handler that is handed it
anyway never calls it; each with a one-line reason naming the procedure."""

from __future__ import annotations

import logging
import time
from textwrap import dedent  # noqa: F401 - a function this module imports: not one of its procedures
from types import SimpleNamespace

import pytest

from kbroker.core.activation.monitor_state import MonitorConfig
from kbroker.worker.activation.handlers import OWN_PROCEDURE_MODULES, TaskHandlers, allowed, refusal, resolve
from kbroker.worker.activation.monitors import Monitors

HERE = (__name__,)  # this module's procedures, for the pools and checks below
CALLED: list[str] = []
LIMIT = 10  # a module attribute that is not callable


def procedure(broker, queue):
    CALLED.append(queue)


def _private(broker, queue):
    CALLED.append(queue)


class Reader:
    """A class: calling it with (broker, queue) would build an object, not run a reader."""

    def __init__(self, broker, queue):
        CALLED.append(queue)


REFUSED = [
    ("kbroker.samples.expenses:__class__", OWN_PROCEDURE_MODULES, "not a public name"),  # the module's type
    ("kbroker.samples.expenses:__loader__", OWN_PROCEDURE_MODULES, "not a public name"),
    (f"{__name__}:_private", HERE, "not a public name"),
    (f"{__name__}:dedent", HERE, "imported from textwrap"),  # an imported function
    (f"{__name__}:time", HERE, "not a function"),  # an imported module
    (f"{__name__}:Reader", HERE, "but a class"),
    (f"{__name__}:LIMIT", HERE, "but a int"),
    ("kbroker.samples.expenses:APPROVAL", OWN_PROCEDURE_MODULES, "but a str"),  # the sample's own constant
    ("kbroker.samples.expenses:DIALOG_TIMER", OWN_PROCEDURE_MODULES, "but a str"),  # one it imports
    ("kbroker.samples.expenses:annotations", OWN_PROCEDURE_MODULES, "not a function"),  # from __future__
]


@pytest.mark.parametrize("name, modules, why", REFUSED)
def test_only_a_public_function_the_module_defines_is_allowed(name, modules, why):
    assert allowed(name, modules) is False
    reason = refusal(name, modules)
    assert reason is not None and why in reason and repr(name) in reason and "\n" not in reason
    with pytest.raises(ValueError, match="procedure") as raised:
        resolve(name)
    assert why in str(raised.value)


def test_the_sample_procedure_and_this_modules_own_are_allowed():
    assert allowed("kbroker.samples.expenses:process_claims", OWN_PROCEDURE_MODULES)
    assert refusal("kbroker.samples.expenses:process_claims", OWN_PROCEDURE_MODULES) is None
    from kbroker.samples.expenses import process_claims

    assert resolve("kbroker.samples.expenses:process_claims") is process_claims
    assert allowed(f"{__name__}:procedure", HERE) and resolve(f"{__name__}:procedure") is procedure


def test_outside_the_list_the_reason_is_as_before_and_nothing_is_imported():
    assert (
        refusal("antigravity:fly", OWN_PROCEDURE_MODULES)
        == "procedure 'antigravity:fly' is not in a module this worker allows"
    )
    import sys

    assert "antigravity" not in sys.modules


def test_the_monitor_refuses_to_activate_a_queue_naming_one():
    """Monitors.checked, whichever path chose the config (the catalog, a QueueAltered event): the
    queue is not activated and the refusal is reported (an ACTIVATION_REFUSED event)."""
    refused: list[tuple[str, str]] = []
    reasons: list[str] = []
    monitors = SimpleNamespace(
        allowed_modules=OWN_PROCEDURE_MODULES,
        _refuse=lambda queue, name, why: (refused.append((queue, name)), reasons.append(why)),
    )
    for name in ("kbroker.samples.expenses:__class__", "kbroker.samples.expenses:DIALOG_TIMER"):
        config = MonitorConfig(enabled=True, kind="internal", procedure=name, max_queue_readers=1)
        assert Monitors.checked(monitors, "ExpenseQueue", config).enabled is False  # type: ignore[arg-type]
    good = MonitorConfig(enabled=True, kind="internal", procedure="kbroker.samples.expenses:process_claims")
    assert Monitors.checked(monitors, "ExpenseQueue", good) is good  # type: ignore[arg-type]
    assert refused == [
        ("ExpenseQueue", "kbroker.samples.expenses:__class__"),
        ("ExpenseQueue", "kbroker.samples.expenses:DIALOG_TIMER"),
    ]
    # The reason reported is the one that applies, not "not in a module this worker allows".
    assert all("not in a module this worker allows" not in why for why in reasons)
    assert "'kbroker.samples.expenses:__class__'" in reasons[0] and "DIALOG_TIMER" in reasons[1]


def test_a_handler_handed_one_never_calls_it(caplog):
    """The handlers check again right before importing: a refusal, as for a module not allowed."""
    exits: list[tuple[str, bool]] = []
    pool = TaskHandlers("B", lambda task, ok: exits.append((task.procedure, ok)), size=1, modules=HERE)
    names = [f"{__name__}:{n}" for n in ("_private", "Reader", "dedent", "LIMIT")]
    try:
        CALLED.clear()
        with caplog.at_level(logging.ERROR, logger="kbroker.worker.tasks"):
            for g, name in enumerate(names):
                pool.launch("Q", name, g)
            deadline = time.time() + 5
            while len(exits) < len(names) and time.time() < deadline:
                time.sleep(0.01)
        assert exits == [(name, False) for name in names] and CALLED == []
        errors = [r.exc_info[1] for r in caplog.records if r.exc_info]
        assert [type(e) for e in errors] == [PermissionError] * len(names)
        assert all(repr(name) in str(e) for name, e in zip(names, errors)), errors
    finally:
        pool.close(timeout=2)
