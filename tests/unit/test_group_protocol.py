"""The queue consumer's group settings: forced, or chosen from the brokers' minimum session
time-out (read here from a stand-in; tests/integration/test_failover.py reads a real broker's)."""

import logging

from kbroker.core.cluster import Cluster
from kbroker.kafka.receive import group_protocol
from kbroker.kafka.receive.poll_loop import consumer_settings

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
    monkeypatch.setattr(group_protocol, "_chosen", {})
    monkeypatch.setattr(group_protocol, "set_group_config", lambda _c, _g: None)  # the group's session set
    settings = consumer_settings(NOWHERE, "kbroker.ns.queue.Q")
    assert settings["group.protocol"] == "consumer"
    assert not {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"} & set(settings)


def chosen_by_default(monkeypatch, brokers_min: int | None) -> dict:
    monkeypatch.delenv("KBROKER_GROUP_PROTOCOL", raising=False)
    monkeypatch.delenv("KBROKER_QUEUE_SESSION_TIMEOUT_MS", raising=False)
    monkeypatch.setattr(group_protocol, "_classic_session", {})
    monkeypatch.setattr(group_protocol, "brokers_min_session_ms", lambda _c: brokers_min)
    return group_protocol.group_settings(NOWHERE, "g")


def test_by_default_the_classic_protocol_with_a_2_s_session_where_the_brokers_allow_it(monkeypatch):
    """The consumer protocol is opt-in: with librdkafka 2.16 it was seen to let two members
    commit the same partition (kafka/receive/group_protocol.py). The classic protocol's generation fences."""
    settings = chosen_by_default(monkeypatch, 1_000)
    assert settings == {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 2_000,
        "heartbeat.interval.ms": 200,
    }


def test_brokers_with_a_higher_minimum_get_10_s_and_one_warning_naming_the_setting(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="kbroker.receiver"):
        assert chosen_by_default(monkeypatch, 6_000)["session.timeout.ms"] == 10_000
        group_protocol.group_settings(NOWHERE, "another-group")  # the same cluster: asked and said once
    assert caplog.text.count("group.min.session.timeout.ms is 6000 ms") == 1
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="kbroker.receiver"):
        assert chosen_by_default(monkeypatch, None)["session.timeout.ms"] == 10_000  # unreadable: the safe one
    # A reader without DESCRIBE_CONFIGS cannot change the brokers' setting: told at debug, not warned.
    unreadable = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert [r.levelno for r in unreadable] == [logging.DEBUG]


def test_the_group_config_asks_for_a_session_under_3_s_with_several_heartbeats_in_it():
    entries = {e.name: int(e.value) for e in group_protocol.group_config()}
    assert entries["consumer.session.timeout.ms"] < 3_000
    assert entries["consumer.session.timeout.ms"] >= 3 * entries["consumer.heartbeat.interval.ms"]
