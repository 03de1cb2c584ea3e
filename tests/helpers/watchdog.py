"""What happens when a test overruns its time-out under pytest-xdist (`make test`).

pytest-timeout's thread method dumps the stacks to the worker's terminal, which xdist points at
/dev/null, and needs the GIL to fire at all. `arm` gives the same deadline to faulthandler's C
watchdog instead: it needs no GIL, writes every thread's traceback to the real stderr (the run's
log) and ends the process.

A worker that ends so leaves the processes its test started (the embedded broker, a kbroker
worker, an analytics job and their JVMs) running; `kill_processes_under` ends them, found by
their working directory or an open file (a log) under the crashed worker's basetemp.
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import psutil

from kbroker.embedded import jvm

_stderr: int | None = None  # a copy of the real stderr, made before a test's output is captured


def keep_stderr() -> None:
    """Copy fd 2 while it is still the run's stderr (pytest_configure: capture is suspended)."""
    global _stderr
    if _stderr is None:
        _stderr = os.dup(2)


def _run_stderr() -> int:
    return 2 if _stderr is None else _stderr


def say(line: str) -> None:
    """Write a line to the run's stderr: a pytest-xdist process's own stderr reaches nobody."""
    os.write(_run_stderr(), (line + "\n").encode())


def arm(seconds: float) -> None:
    """Dump every thread's traceback to the real stderr and exit the process in `seconds`."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=_run_stderr())


def disarm() -> None:
    faulthandler.cancel_dump_traceback_later()


def kill_processes_under(root: Path) -> list[int]:
    """SIGKILL every process (but this one) whose working directory or an open file lies under
    `root`, and wait until each is gone (jvm.kill); their pids."""
    prefix = str(root.resolve()) + os.sep
    killed = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            paths = [proc.cwd(), *(f.path for f in proc.open_files())]
            if any(p.startswith(prefix) for p in paths):
                jvm.kill(proc)
                killed.append(proc.pid)
        except psutil.Error:  # gone meanwhile, or not ours to look at
            continue
    return killed
