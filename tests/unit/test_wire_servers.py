"""kafka/wire.py connects from a Cluster: the (host, port) pairs it reads from the cluster's
bootstrap list."""

import pytest

from kbroker.core.cluster import Cluster
from kbroker.kafka.wire import servers


def test_every_server_of_the_list_in_order_with_prefixes_and_brackets_removed():
    cluster = Cluster(" 127.0.0.1:9092, PLAINTEXT://kafka-2:19092,[::1]:9093 ,")
    assert servers(cluster) == [("127.0.0.1", 9092), ("kafka-2", 19092), ("::1", 9093)]
    assert servers("localhost:9092") == [("localhost", 9092)]  # a bootstrap string is a cluster too


@pytest.mark.parametrize("bootstrap", ["localhost", "localhost:port", ",", "PLAINTEXT://"])
def test_a_list_without_a_host_and_port_is_refused(bootstrap):
    with pytest.raises(ValueError):
        servers(bootstrap)
