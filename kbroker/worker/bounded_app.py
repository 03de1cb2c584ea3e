"""The worker's Faust app: Faust's own, with the producer flush that rebalances and shutdown wait
on bounded.

Faust flushes its producer when the group takes partitions away and when the app stops, and
aiokafka's flush waits for every buffered batch with no time limit. A batch stays buffered until
the producer's request time-out (Faust's default is 20 minutes), so under load one worker was
seen waiting in that flush while the group waited for it: the group stalled for a session
time-out, dropped the member, and the member never rejoined. Bounded, the rebalance goes on;
the batches stay in the producer and are sent, or fail, on its own time-out, and Faust's commit
flushes again before it moves an offset, so nothing is acknowledged unsent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

__all__ = ["FLUSH_TIMEOUT_S", "WorkerApp"]

log = logging.getLogger("kbroker.worker")

# Below the 10 s session time-out (app.new_app), so a rebalance finishes before the group
# gives up on this member.
FLUSH_TIMEOUT_S = 6.0


class WorkerApp(faust.App):
    """faust.App with a flush that gives up after flush_timeout seconds, logged once until a
    flush completes again."""

    flush_timeout: float = FLUSH_TIMEOUT_S
    _flush_stalled: bool = False

    async def _producer_flush(self, logger: Any) -> None:
        try:
            await asyncio.wait_for(super()._producer_flush(logger), self.flush_timeout)
        except TimeoutError:
            if not self._flush_stalled:
                self._flush_stalled = True
                log.warning(
                    "producer flush gave up after %.0f s: the rebalance goes on, the records stay "
                    "buffered in the producer and are sent or fail on its request time-out",
                    self.flush_timeout,
                )
            return
        if self._flush_stalled:
            self._flush_stalled = False
            log.info("producer flush completes again")
