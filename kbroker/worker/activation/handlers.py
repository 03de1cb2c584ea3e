"""Task handlers: the threads that run activated readers (sys.dm_broker_activated_tasks).

A pool of 2 x CPUs threads takes launch requests from a queue. Each runs the queue's activation
procedure, a "module:function" called as `procedure(broker, queue)`, until it returns, then
reports the exit so the monitor counts the reader out. A handler thread that died is replaced on
the next tick (`restart_dead`). A procedure that raises is counted out like one that returned: the
exception does not take its handler down. It is recorded as a degraded reason of the queue (logged
once, then counted once per window), and its exit is reported only after a back-off that doubles
with each failure in a row, so a procedure that fails at once (the broker is down) is not
relaunched in a tight loop.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import queue as queue_mod
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from kbroker.core.health import backoff

if TYPE_CHECKING:
    from kbroker.worker.guard import Guard

log = logging.getLogger("kbroker.worker.tasks")


# What a worker runs by default: kbroker's samples, what a user would run. Any other module, the
# benchmarks' procedures included (the bench's worker allows them itself), only when the
# worker's configuration adds it (`kbroker worker --allow-procedures`).
OWN_PROCEDURE_MODULES = ("kbroker.samples",)


def allowed(procedure: str, modules: tuple[str, ...]) -> bool:
    """Whether the worker may run `procedure` ('module:function'): `refusal` finds nothing against
    it. The catalog names the procedure, but anyone who can write the catalog topic must not
    choose which code the worker imports, nor which of an allowed module's attributes it calls."""
    return refusal(procedure, modules) is None


def refusal(procedure: str, modules: tuple[str, ...]) -> str | None:
    """Why the worker may not run `procedure`, in one line naming it; None when it may. Its module
    must be one of `modules` or inside one of them (a package), checked before anything is
    imported; its name a public one (no leading underscore: not `__class__`, not a helper) of a
    function that module defines, not a class, a constant or a function it imported from
    elsewhere (any attribute of an allowed module was launched, and failed). The allowed module
    is imported for that (its code is the worker's to run); a module that cannot be loaded or a
    name it lacks is `resolve`'s to report, when the reader starts."""
    module, _, name = procedure.partition(":")
    if not any(module == m or module.startswith(m + ".") for m in modules):
        return f"procedure {procedure!r} is not in a module this worker allows"
    if name.startswith("_"):
        return _private(procedure)
    try:
        target = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - not loadable: resolve says why when the reader starts
        return None
    return _not_its_function(procedure, module, target)


def _private(procedure: str) -> str:
    return f"procedure {procedure!r} is not a public name of its module (it starts with '_')"


def _not_its_function(procedure: str, module: str, target: object) -> str | None:
    """Why `target`, found as `procedure`, is not a procedure `module` defines; None when it is."""
    if not inspect.isfunction(target):
        kind = "a class" if inspect.isclass(target) else f"a {type(target).__name__}"
        return f"procedure {procedure!r} is not a function of {module} but {kind}"
    if target.__module__ != module:
        return f"procedure {procedure!r} is not defined in {module}: it is imported from {target.__module__}"
    return None


def resolve(procedure: str) -> Callable[..., Any]:
    """'package.module:function' -> the function, or ValueError naming what is wrong (among it, a
    name that is not a public function the module defines: see `refusal`)."""
    module, sep, name = (procedure or "").partition(":")
    if not sep or not module or not name:
        raise ValueError(f"activation procedure {procedure!r} must be 'module:function'")
    if name.startswith("_"):
        raise ValueError(_private(procedure))
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"activation procedure {procedure!r} cannot be loaded: {exc}") from None
    wrong = _not_its_function(procedure, module, fn)
    if wrong is not None:
        raise ValueError(wrong)
    procedure_fn: Callable[..., Any] = fn
    return procedure_fn


@dataclass
class Task:
    queue: str
    procedure: str
    generation: int
    task_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_at: float | None = None
    handler: str | None = None

    def row(self, worker: str) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "worker": worker,
            "queue": self.queue,
            "procedure": self.procedure,
            "generation": self.generation,
            "handler": self.handler,
            "started_at": self.started_at,
        }


class TaskHandlers:
    """`modules`: the procedures' modules this worker allows (`allowed`), checked again right
    before a procedure is imported, whatever path chose it."""

    def __init__(
        self,
        broker: Any,
        on_exit: Callable[[Task, bool], None],
        size: int | None = None,
        worker_id: str = "",
        guard: Guard | None = None,
        modules: tuple[str, ...] = OWN_PROCEDURE_MODULES,
    ):
        self.size = size or 2 * (os.cpu_count() or 1)
        self.modules = modules
        self.worker_id = worker_id
        self._broker, self._on_exit = broker, on_exit
        self._requests: queue_mod.Queue[Task | None] = queue_mod.Queue()
        self._lock = threading.Lock()
        self._running: dict[str, Task] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._closing = threading.Event()
        self._guard = guard
        self.restarted = 0
        for i in range(self.size):
            self._threads.append(self._spawn(i))

    def _spawn(self, i: int) -> threading.Thread:
        t = threading.Thread(target=self._loop, name=f"kbroker-task-{i}", daemon=True)
        t.start()
        return t

    def launch(self, queue: str, procedure: str, generation: int) -> Task:
        task = Task(queue, procedure, generation)
        self._requests.put(task)
        return task

    def _loop(self) -> None:
        while True:
            task = self._requests.get()
            if task is None:
                return
            task.started_at, task.handler = time.time(), threading.current_thread().name
            with self._lock:
                self._running[task.task_id] = task
            ok = False
            log.info("activated reader started queue=%s task=%s", task.queue, task.task_id)
            component = f"procedure {task.procedure} on queue {task.queue}"
            try:
                refused = refusal(task.procedure, self.modules)
                if refused is not None:
                    raise PermissionError(refused)
                resolve(task.procedure)(self._broker, task.queue)
                ok = True
            except Exception as exc:  # noqa: BLE001 - a procedure's failure is its task's, not the worker's
                self._failed(component, exc, task.queue)
            finally:
                with self._lock:
                    self._running.pop(task.task_id, None)
                if ok and self._guard is not None:
                    self._guard.succeeded(component)
                self._on_exit(task, ok)

    def _failed(self, component: str, exc: Exception, queue: str) -> None:
        """A procedure raised: record it, then hold the handler for the back-off before its exit
        is reported (the monitor relaunches at once on an exit while messages wait)."""
        if self._guard is None:
            log.error("%s failed", component, exc_info=exc)
            return
        self._guard.failed(component, exc, queue)
        failures = next((r.failures for r in self._guard.health.reasons() if r.component == component), 1)
        self._closing.wait(backoff(failures))

    def restart_dead(self) -> int:
        """Every tick: replace handler threads that died."""
        n = 0
        for i, t in enumerate(self._threads):
            if not t.is_alive() and not self._closed:
                self._threads[i] = self._spawn(i)
                n += 1
        self.restarted += n
        return n

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [t.row(self.worker_id) for t in self._running.values()]

    def waiting(self) -> int:
        return self._requests.qsize()

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        self._closing.set()
        for _ in self._threads:
            self._requests.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
