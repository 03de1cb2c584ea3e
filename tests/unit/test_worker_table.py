"""The worker's table class: a changelog whose partition count the metadata does not know yet (0,
as the consumer's snapshot says while the broker restarts) is checked again at the next write,
not taken for a permanent mismatch; a real mismatch still raises."""

from __future__ import annotations

import faust
import pytest
from faust.exceptions import PartitionsMismatch

from kbroker.worker.tables import WorkerTable


class FakeConsumer:
    def __init__(self, counts: dict[str, int]):
        self.counts = counts

    def topic_partitions(self, topic: str) -> int | None:
        return self.counts.get(topic)


@pytest.fixture
def table() -> WorkerTable:
    app = faust.App("kb-table-test", broker="kafka://127.0.0.1:1", Table=WorkerTable)
    return app.Table("tick-owner", default=None, partitions=1)


def test_an_unknown_changelog_count_is_checked_again_not_a_mismatch(table: WorkerTable) -> None:
    assert isinstance(table, WorkerTable)
    counts = {"ticks": 1, table.changelog_topic_name: 0}
    table.app.consumer = FakeConsumer(counts)
    table._verify_source_topic_partitions("ticks")  # faust.Table raises PartitionsMismatch here
    assert "ticks" not in table._verified_source_topics_for_partitions
    counts[table.changelog_topic_name] = 1
    table._verify_source_topic_partitions("ticks")
    assert "ticks" in table._verified_source_topics_for_partitions


def test_a_real_mismatch_still_raises(table: WorkerTable) -> None:
    table.app.consumer = FakeConsumer({"ticks": 1, table.changelog_topic_name: 4})
    with pytest.raises(PartitionsMismatch):
        table._verify_source_topic_partitions("ticks")


def test_faust_own_table_takes_zero_for_a_mismatch() -> None:
    """Why the subclass exists: the plain class fails on the snapshot a restart leaves."""
    app = faust.App("kb-table-test-plain", broker="kafka://127.0.0.1:1")
    plain = app.Table("tick-owner", default=None, partitions=1)
    app.consumer = FakeConsumer({"ticks": 1, plain.changelog_topic_name: 0})
    with pytest.raises(PartitionsMismatch):
        plain._verify_source_topic_partitions("ticks")
