"""The queue consumer's group settings when the protocol is forced (no broker asked)."""

from kbroker.core.cluster import Cluster
from kbroker.kafka import group_protocol
from kbroker.kafka.poll_loop import consumer_settings

NOWHERE = Cluster.of("127.0.0.1:1")  # never connected to: a forced protocol asks nothing


def test_forced_classic_keeps_a_10_s_session_that_every_broker_accepts(monkeypatch):
    monkeypatch.setenv("KBROKER_GROUP_PROTOCOL", "classic")
    monkeypatch.delenv("KBROKER_QUEUE_SESSION_TIMEOUT_MS", raising=False)
    settings = consumer_settings(NOWHERE, "kbroker.ns.queue.Q")
    assert settings["group.protocol"] == "classic"
    assert settings["session.timeout.ms"] == 10_000 >= 6_000  # Kafka's default group.min.session.timeout.ms
    assert settings["heartbeat.interval.ms"] == 1_000
    assert settings["partition.assignment.strategy"] == "cooperative-sticky"


def test_a_measured_classic_session_sets_the_heartbeat_to_a_tenth(monkeypatch):
    monkeypatch.setenv("KBROKER_GROUP_PROTOCOL", "classic")
    monkeypatch.setenv("KBROKER_QUEUE_SESSION_TIMEOUT_MS", "3000")
    assert group_protocol.group_settings(NOWHERE, "g")["heartbeat.interval.ms"] == 300


def test_forced_consumer_protocol_sets_nothing_the_protocol_refuses(monkeypatch):
    """With group.protocol=consumer librdkafka refuses session.timeout.ms, heartbeat.interval.ms
    and partition.assignment.strategy: the group's config on the broker holds them."""
    monkeypatch.setenv("KBROKER_GROUP_PROTOCOL", "consumer")
    settings = consumer_settings(NOWHERE, "kbroker.ns.queue.Q")
    assert settings["group.protocol"] == "consumer"
    assert not {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"} & set(settings)


def test_the_group_config_asks_for_a_session_under_3_s_with_several_heartbeats_in_it():
    entries = {e.name: int(e.value) for e in group_protocol.group_config()}
    assert entries["consumer.session.timeout.ms"] < 3_000
    assert entries["consumer.session.timeout.ms"] >= 3 * entries["consumer.heartbeat.interval.ms"]
