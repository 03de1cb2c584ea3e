"""The analytics job's own state beside Spark's checkpoint: one file per batch, named by batch id,
so a batch Spark runs again after a crash starts from the state of the batch before it."""

from __future__ import annotations

import os
import re
import tempfile
import zlib
from pathlib import Path
from typing import Any

import orjson

_NAME = re.compile(r"^(\d+)\.state$")
KEEP = 3  # the newest files kept: the one a replayed batch needs is always among them


class StateFiles:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def batches(self) -> list[int]:
        return sorted(int(m.group(1)) for m in (_NAME.match(p.name) for p in self.dir.iterdir()) if m)

    def load_before(self, batch: int) -> tuple[int, dict[str, Any]] | None:
        """The newest state saved by a batch before `batch`, with its batch id; None: start empty."""
        for b in reversed(self.batches()):
            if b < batch:
                return b, orjson.loads(zlib.decompress((self.dir / f"{b}.state").read_bytes()))
        return None

    def save(self, batch: int, state: dict[str, Any]) -> None:
        """Written whole, then renamed into place: a kill -9 leaves the old file or the new one."""
        data = zlib.compress(orjson.dumps(state), 1)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / f"{batch}.state")
        # A later batch's file (from a run whose batches Spark did not commit) would be loaded by
        # nobody, and a newer one must never be taken for this one's successor: removed. First, so
        # the trim below counts only this batch and those before it (else it could drop this one).
        for later in (b for b in self.batches() if b > batch):
            (self.dir / f"{later}.state").unlink(missing_ok=True)
        for old in self.batches()[:-KEEP]:
            (self.dir / f"{old}.state").unlink(missing_ok=True)
