"""Progress of a benchmark run on stderr."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class Reporter:
    """Progress on stderr: one line per phase, and a bar for long loops on a terminal."""

    def __init__(self, quiet: bool = False):
        self.console = Console(stderr=True)
        self.quiet = quiet
        self._t0 = time.monotonic()

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]{time.monotonic() - self._t0:7.1f}s[/dim] {msg}", highlight=False)

    @contextmanager
    def bar(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """Yields advance(n). Refreshed by the caller's advances only (no refresh thread, so a
        timed loop does not share the GIL with it); off a terminal, a line every 10%."""
        if self.quiet:
            yield lambda n: None
            return
        if not self.console.is_terminal:
            done, step = [0], max(1, total // 10)
            self.say(f"{description}: 0/{total}")

            def advance(n: int) -> None:
                before = done[0]
                done[0] += n
                if before < total and (done[0] // step > before // step or done[0] >= total):
                    self.say(f"{description}: {min(done[0], total)}/{total}")

            yield advance
            return
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            auto_refresh=False,
            transient=True,
        )
        with progress:
            task = progress.add_task(description, total=total)
            last = [0.0]

            def advance(n: int) -> None:
                progress.advance(task, n)
                now = time.monotonic()
                if now - last[0] > 0.2:
                    last[0] = now
                    progress.refresh()

            yield advance
        self.say(f"{description}: done")
