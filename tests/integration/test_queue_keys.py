"""Queue names as Service Broker allows them, on the real broker: names that Kafka's comparison
once made collide, Unicode, brackets and slashes, and a 128-character name each get a topic of
their own and carry their own messages; a secondary queue of `Orders` lives beside
`Orders_Archive`; and a queue published before keys existed keeps its topic and the messages
waiting in it, for this process and for a new one."""

from __future__ import annotations

import json
import os
import subprocess

import orjson
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.core import names
from kbroker.core.catalog.objects import Queue
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import publish_object
from kbroker.kafka.snapshot import read_to_end
from kbroker.sdk.broker import Broker
from tests.helpers import KBROKER

QUEUES = ["Orders", "Orders_Archive", "Orders.Retries", "Orders_Retries", "Заказы [EU]/π", "q " + "!#%&" * 31 + "!?"]


def catalog(queues: list[str]) -> dict:
    return {
        "message_types": [{"name": "//k/M"}],
        "contracts": [{"name": "//k/C", "messages": [{"type": "//k/M", "sent_by": "ANY"}]}],
        "queues": [{"name": "Senders", "partitions": 1}] + [{"name": q, "partitions": 2} for q in queues],
        "services": [{"name": "//k/From", "queue": "Senders"}]
        + [{"name": f"//k/{i}", "queue": q, "contracts": ["//k/C"]} for i, q in enumerate(queues)],
    }


def test_names_that_once_collided_each_have_a_topic_and_their_own_messages(kafka_bootstrap, namespace, tmp_path):
    assert len(QUEUES[-1]) == 128
    path = tmp_path / "names.yaml"
    path.write_text(yaml.safe_dump(catalog(QUEUES), allow_unicode=True))
    apply_paths(kafka_bootstrap, namespace, [path])
    topics = set(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics)
    mine = {names.queue_topic(namespace, q) for q in QUEUES}
    assert len(mine) == len(QUEUES) and mine <= topics
    with Broker(kafka_bootstrap, namespace) as b:
        for i, q in enumerate(QUEUES):
            h = b.begin_dialog("//k/From", f"//k/{i}", "//k/C")
            b.send(h, "//k/M", {"for": q})
        for q in QUEUES:
            got = b.receive(q, wait=15)
            assert [orjson.loads(m.body) for m in got] == [{"for": q}] and {m.queue for m in got} == {q}
            assert b.receive(q, wait=0) == []
        # Orders's secondary queue for instance "Archive" is not Orders_Archive's topic.
        h = b.begin_dialog("//k/0", "//k/1", "//k/C", instance="Archive")
        b.send(h, "//k/M", {"to": "Orders_Archive"})
        target = b.receive("Orders_Archive", wait=15)[0].conversation_handle
        b.send(target, "//k/M", {"back": "to Orders, instance Archive"})
        assert [orjson.loads(m.body) for m in b.receive("Orders", wait=15, instance="Archive")] == [
            {"back": "to Orders, instance Archive"}
        ]
        assert b.receive("Orders_Archive", wait=1) == []
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap, "KBROKER_NAMESPACE": namespace}
    shown = subprocess.run(
        [KBROKER, "queue", "show", QUEUES[4], "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["queue"] == QUEUES[4]


def test_a_queue_published_before_keys_keeps_its_topic_and_its_waiting_messages(kafka_bootstrap, namespace, tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(catalog(["Old_Queue"])))
    apply_paths(kafka_bootstrap, namespace, [path])
    # As a release before keys left it: the queue's record without a key, its topic its name,
    # a message waiting there.
    legacy = f"kbroker.{namespace}.queue.Old_Queue"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(legacy, 2, 1)])[legacy].result(30)
    publish_object(kafka_bootstrap, namespace, "queue", Queue(name="Old_Queue", partitions=2))
    with Broker(kafka_bootstrap, namespace) as b:
        b.refresh_catalog()
        assert (
            b.catalog.queue("Old_Queue").topic_key == "Old_Queue"
            and names.queue_topic(namespace, "Old_Queue") == legacy
        )
        waiting = b.send(b.begin_dialog("//k/From", "//k/0", "//k/C"), "//k/M", {"waiting": True})
    apply_paths(kafka_bootstrap, namespace, [path])  # the upgrade's apply keeps the key
    env = {**os.environ, "KBROKER_BOOTSTRAP": kafka_bootstrap, "KBROKER_NAMESPACE": namespace}
    got = subprocess.run(  # a new process: it learns the key from the catalog
        [KBROKER, "receive", "Old_Queue", "--wait", "15"], env=env, capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    [message] = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
    assert message["message_id"] == waiting
    assert [dict(r.headers())["kb.message_id"].decode() for r in read_to_end(kafka_bootstrap, legacy, 10) or []] == [
        waiting
    ]
