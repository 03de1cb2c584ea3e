"""The cluster value (core/cluster.py) and what the one client factory (kafka/clients.py) makes of
it for librdkafka, Faust and Spark: a bootstrap string is a cluster with no settings; settings
travel to every client under their Kafka names; credentials never show in a repr."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.cluster import Cluster
from kbroker.errors import UnsupportedSettingError
from kbroker.kafka import clients

SECURED = Cluster.with_properties(
    "b1:9093,b2:9093",
    {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "s3cret",
    },
)


def test_a_string_is_a_cluster_without_settings_and_a_cluster_is_itself():
    c = Cluster.of("localhost:9092")
    assert c == Cluster("localhost:9092") and c.properties == {} and str(c) == "localhost:9092"
    assert Cluster.of(SECURED) is SECURED


@pytest.mark.parametrize("bad", ["", "   ", None, 9092])
def test_a_cluster_needs_bootstrap_servers(bad):
    with pytest.raises(ValueError, match="bootstrap servers"):
        Cluster(bad)  # type: ignore[arg-type]


def test_bootstrap_servers_is_not_a_setting_and_no_setting_is_given_twice():
    with pytest.raises(ValueError, match="bootstrap.servers"):
        Cluster.with_properties("b:1", {"bootstrap.servers": "other:2"})
    with pytest.raises(ValueError, match="twice"):
        Cluster("b:1", (("acks", "all"), ("acks", "1")))


def test_a_repr_names_settings_but_never_shows_their_values():
    text = repr(SECURED)
    assert "sasl.password" in text and "s3cret" not in text and "app" not in text


def test_every_client_gets_the_bootstrap_servers_and_the_settings():
    settings = clients.base(SECURED, **{"acks": "all"})
    assert settings["bootstrap.servers"] == "b1:9093,b2:9093"
    assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.password"] == "s3cret"
    assert settings["acks"] == "all" and "logger" in settings
    assert clients.base("b:1") == {"bootstrap.servers": "b:1", "logger": clients.KAFKA_LOG}


def test_spark_options_are_java_client_properties_prefixed_with_kafka():
    assert clients.spark_options(SECURED) == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": (
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="app" password="s3cret";'
        ),
    }


def test_a_setting_no_client_takes_is_refused_when_a_client_is_built():
    with pytest.raises(UnsupportedSettingError, match="acks"):
        clients.base(Cluster.with_properties("b:1", {"acks": "all"}))


def test_the_faust_broker_url_lists_every_server():
    assert clients.faust_broker(SECURED) == "kafka://b1:9093;kafka://b2:9093"
    assert clients.faust_broker("localhost:9092") == "kafka://localhost:9092"


@given(
    st.dictionaries(
        st.text("abcdefghij.", min_size=1, max_size=12).filter(lambda k: k != "bootstrap.servers"),
        st.text(max_size=8),
        max_size=6,
    )
)
def test_settings_round_trip_whatever_their_order(props):
    c = Cluster.with_properties("b:1", props)
    assert c.properties == props
    assert c == Cluster.with_properties("b:1", dict(reversed(list(props.items()))))
