"""The broker rule with client properties (embedded.resolve_cluster): where the bootstrap comes
from, and the settings of the properties file and KBROKER_KAFKA_* variables beside it."""

from __future__ import annotations

import pytest

from kbroker.core.cluster import Cluster
from kbroker.embedded import resolve_cluster
from kbroker.errors import InvalidArgumentError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in ("KBROKER_BOOTSTRAP", "KBROKER_COMMAND_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KBROKER_DATA_DIR", str(tmp_path / "no-broker"))


@pytest.fixture
def props(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text("# a client\nbootstrap.servers=file:9093\nsecurity.protocol=SSL\nclient.id=from-file\n")
    return path


def test_an_explicit_address_takes_the_file_and_the_variables_settings(props, monkeypatch):
    monkeypatch.setenv("KBROKER_KAFKA_CLIENT_ID", "from-env")
    c = resolve_cluster("given:9092", command_config=props)
    assert c.bootstrap == "given:9092"
    assert c.properties == {"security.protocol": "SSL", "client.id": "from-env"}  # variables over the file


def test_the_file_bootstrap_servers_come_after_kbroker_bootstrap(props, monkeypatch):
    monkeypatch.setenv("KBROKER_COMMAND_CONFIG", str(props))
    assert resolve_cluster().bootstrap == "file:9093"
    monkeypatch.setenv("KBROKER_BOOTSTRAP", "env:9092")
    assert resolve_cluster().bootstrap == "env:9092"


def test_an_explicit_cluster_wins_whole(props):
    given = Cluster.with_properties("c:1", {"client.id": "mine"})
    assert resolve_cluster(given, command_config=props) is given


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(InvalidArgumentError, match="cannot read the client properties file .*missing"):
        resolve_cluster("b:1", command_config=tmp_path / "missing")
