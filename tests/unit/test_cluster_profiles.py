"""Which client settings a route's destination is reached with (kafka/profiles.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kbroker.core.catalog.models import Route
from kbroker.core.cluster import Cluster
from kbroker.errors import InvalidArgumentError
from kbroker.kafka.profiles import ClusterProfiles

LOCAL = Cluster.with_properties("local:9092", {"security.protocol": "SSL"})
SCRAM = (
    "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
    'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="b" password="p";\n'
)


@pytest.fixture
def profiles(tmp_path):
    (tmp_path / "east.properties").write_text("bootstrap.servers=east1:9093,east2:9093\n" + SCRAM)
    (tmp_path / "broken.properties").write_text("security.protocol=SSL\n")
    return ClusterProfiles(LOCAL, tmp_path)


def test_a_named_profile_gives_its_settings(profiles):
    c = profiles.cluster_for("east1:9093,east2:9093", "east")
    assert c.bootstrap == "east1:9093,east2:9093" and c.properties["sasl.mechanism"] == "SCRAM-SHA-512"
    assert "bootstrap.servers" not in c.properties


def test_this_process_cluster_keeps_its_own_settings_in_any_server_order(profiles):
    assert profiles.cluster_for("LOCAL:9092") is LOCAL


def test_a_profile_listing_the_servers_is_found_without_a_name(profiles):
    assert profiles.cluster_for("east2:9093, east1:9093").properties["security.protocol"] == "SASL_SSL"


def test_an_unknown_cluster_is_reached_without_settings(profiles):
    assert profiles.cluster_for("west:9092") == Cluster("west:9092")


def test_a_missing_or_mismatched_profile_is_a_typed_error(profiles):
    with pytest.raises(InvalidArgumentError, match="'nope' not found"):
        profiles.cluster_for("east1:9093", "nope")
    with pytest.raises(InvalidArgumentError, match="is for east1:9093,east2:9093, not west:9092"):
        profiles.cluster_for("west:9092", "east")
    with pytest.raises(InvalidArgumentError, match="names no bootstrap.servers"):
        profiles.cluster_for("x:1", "broken")


def test_a_route_names_a_profile_only_with_a_cluster_address():
    assert Route(name="r", address="kafka://east1:9093/sales", profile="east").profile == "east"
    with pytest.raises(ValidationError, match="cannot name a profile"):
        Route(name="r", address="LOCAL", profile="east")
    with pytest.raises(ValidationError, match="profile"):
        Route(name="r", address="kafka://east1:9093/sales", profile="no spaces")
