"""What a benchmark scenario runs with (`BenchContext`): the cluster, the parameters, progress,
and the namespaces it made. Apart from the harness so the registry can name it in its types
without importing the harness that imports the registry."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kbroker.bench.params import Params
from kbroker.bench.progress import Reporter
from kbroker.core.cluster import Cluster


@dataclass
class BenchContext:
    """What a scenario runs with: the broker, the parameters, progress, and the namespaces it
    made (deleted after each scenario on an external broker)."""

    cluster: Cluster
    params: Params
    reporter: Reporter
    samples: Path
    kafka_version: str
    embedded: bool = False
    namespaces: list[str] = field(default_factory=list)

    def say(self, msg: str) -> None:
        self.reporter.say(msg)

    def fresh_namespace(self, tag: str) -> str:
        """A new namespace with topics/samples applied (ExpenseQueue has 4 partitions)."""
        from kbroker.kafka.catalog.apply import apply_paths

        ns = f"bench-{tag}-{uuid.uuid4().hex[:8]}"[:40]
        apply_paths(self.cluster, ns, [self.samples])
        self.namespaces.append(ns)
        return ns

    def cleanup(self) -> None:
        """Delete the topics of the namespaces made by this run. Only on an external broker: an
        embedded one is thrown away with its data dir."""
        if self.embedded or not self.namespaces:
            return
        from kbroker.kafka.topics import delete_topics_with_prefixes

        try:  # best effort: leftovers are named bench-*
            delete_topics_with_prefixes(self.cluster, [f"kbroker.{ns}." for ns in self.namespaces], 30)
        except Exception as exc:  # noqa: BLE001 - best effort: said, and the leftovers are named bench-*
            self.say(f"[yellow]could not delete the benchmark's topics: {exc}[/yellow]")
        self.namespaces.clear()
