"""A daemon thread a process runs beside its work until it closes: the catalog watcher and the
rollback log follow a topic this way. Subclasses write `_run`, which must return soon after
`_stop` is set."""

from __future__ import annotations

import threading
from typing import Self


class Background:
    thread_name = "kbroker-background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def _run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop; returns once the thread ended (at most one wait of `_run`'s and a request)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
