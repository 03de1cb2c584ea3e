"""A conversation group keeps one partition for life (G1): `kbroker apply` refuses to change the
partition count of a queue that has been used, naming the queue, while readers run on it; the
run goes on with nothing lost, duplicated, out of order or held by two readers at once."""

from __future__ import annotations

import os
import subprocess

import pytest
from confluent_kafka.admin import AdminClient

from kbroker.core import names
from kbroker.errors import DefinitionError
from kbroker.kafka.catalog.apply import apply_paths
from tests.helpers import KBROKER
from tests.helpers import invariants as inv
from tests.helpers.reader_runs import (
    assert_no_violations,
    commits,
    start_fault_run,
    wait_for_all_replies,
    wait_for_commits,
)


def partitions(bootstrap: str, topic: str) -> int:
    return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics[topic].partitions)


def test_a_partition_change_under_load_is_refused_and_the_run_stays_clean(kafka_bootstrap, tmp_path):
    run = start_fault_run(kafka_bootstrap, tmp_path, "p", (41, 42))
    topic = names.queue_topic(run.namespace, "RequestQueue")
    grown = tmp_path / "grown.yaml"
    grown.write_text(
        inv.YAML.read_text().replace(
            "  - name: RequestQueue\n    partitions: 4\n", "  - name: RequestQueue\n    partitions: 8\n"
        )
    )
    assert "partitions: 8" in grown.read_text()
    try:
        wait_for_commits(run.readers, 30, 90)
        with pytest.raises(DefinitionError) as info:
            apply_paths(kafka_bootstrap, run.namespace, [grown])
        assert info.value.obj == "queue RequestQueue" and "held messages" in info.value.reason, info.value
        env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap, "KBROKER_NAMESPACE": run.namespace}
        out = subprocess.run([KBROKER, "apply", str(grown)], env=env, capture_output=True, text=True, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1 and "queue RequestQueue" in lines[0], out.stderr
        assert partitions(kafka_bootstrap, topic) == 4
        replies = wait_for_all_replies(kafka_bootstrap, run.namespace, run.sent, run.readers, 120)
    finally:
        for r in run.readers:
            r.stop()
    assert partitions(kafka_bootstrap, topic) == 4
    assert_no_violations(inv.check(run.sent, replies, commits(run.readers), run.per_conversation))
