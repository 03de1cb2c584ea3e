"""A process's view of its namespace's catalog: read once, re-read when a name is unknown, and
kept current by a watcher once the process reads queues (so an ALTER QUEUE from anywhere
reaches it within half a second). One per process runtime (sdk/process.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from kbroker.core.catalog.models import Catalog, Queue
from kbroker.core.cluster import Cluster
from kbroker.errors import CatalogError
from kbroker.kafka.catalog.catalog_store import CatalogWatcher, read_catalog

T = TypeVar("T")


class CatalogView:
    """The catalog as last read, with the queues this process disabled itself (poison-message
    handling) until the catalog says they are on again."""

    def __init__(self, cluster: Cluster, namespace: str):
        self._cluster, self._namespace = cluster, namespace
        self._catalog: Catalog | None = None
        self._watcher: CatalogWatcher | None = None
        self._lock = threading.Lock()
        self._first_read = threading.Lock()  # the first read, once for every caller
        self.disabled: set[str] = set()

    @property
    def current(self) -> Catalog:
        """The catalog as last read (read now if never)."""
        catalog = self._catalog
        if catalog is None:
            # Read once: many readers' first RECEIVEs come together, and each reading the whole
            # catalog topic at once made some time out on a busy machine.
            with self._first_read:
                catalog = self._catalog
                if catalog is None:
                    catalog = self.refresh()
        return catalog

    def refresh(self) -> Catalog:
        """Read the catalog again (another process may have applied definitions)."""
        self._catalog = read_catalog(self._cluster, self._namespace)
        return self._catalog

    def lookup(self, fn: Callable[[Catalog], T]) -> T:
        """`fn` of the catalog, read again once before an object counts as unknown."""
        try:
            return fn(self.current)
        except CatalogError:
            return fn(self.refresh())

    def queue(self, name: str) -> Queue:
        """The queue `name` (UnknownQueueError after one re-read)."""
        return self.lookup(lambda c: c.queue(name))

    def is_open(self, queue: str) -> bool:
        """STATUS of `queue` as known now, without reading Kafka: what a waiting RECEIVE checks."""
        q = self.current.queues.get(queue)
        return q is not None and q.status == "ON" and queue not in self.disabled

    def watch(self) -> None:
        """Keep the view current from now on (idempotent)."""
        with self._lock:
            if self._watcher is None:
                self._watcher = CatalogWatcher(self._cluster, self._namespace, self._changed).start()

    def _changed(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def close(self) -> None:
        """Stop watching."""
        with self._lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()
