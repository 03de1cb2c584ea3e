"""The worker's Faust table class.

Faust checks once per table, at its first write, that the source topic and the changelog have the
same number of partitions, and it reads the changelog's count from the consumer group's metadata
snapshot. While the broker is stopping or restarting that snapshot can say 0 for a topic whose
metadata it lacks, and aiokafka does not always take a later metadata answer into the snapshot.
Faust's own check treats an unknown count (None) as "not known yet" and checks again next time;
0 it treats as a real mismatch, so the table's every write failed with PartitionsMismatch, for
good (a worker whose tick began during a broker restart never ticked again). A topic always has
at least one partition, so 0 means "not known yet" here too.
"""

from __future__ import annotations

from typing import Any

import faust


class WorkerTable(faust.Table[Any, Any]):  # the class of every table of the app: keys and values of each
    def _verify_source_topic_partitions(self, source_topic: str) -> None:
        consumer = self.app.consumer
        if consumer.topic_partitions(source_topic) == 0 or consumer.topic_partitions(self.changelog_topic_name) == 0:
            return  # not known yet: not cached as verified, so the next write checks again
        super()._verify_source_topic_partitions(source_topic)
