"""Users' SCRAM-SHA-512 credentials, set and deleted through the admin API (the credentials live
in the cluster's metadata log; only a principal allowed to alter the cluster may change them), and
the ACLs a removed user leaves behind."""

from __future__ import annotations

from confluent_kafka import KafkaError
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kbroker.core.cluster import ClusterLike
from kbroker.kafka import clients

ITERATIONS = 8192  # Kafka accepts 4096 to 16384


def set_password(cluster: ClusterLike, user: str, password: str) -> None:
    """Create `user`'s SCRAM-SHA-512 credential, or replace its password."""
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, ITERATIONS)
    client = clients.admin(cluster)  # kept until the answer: a client collected first fails its futures
    futures = client.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())])
    clients.result_of(futures[user], f"setting the SCRAM-SHA-512 password of user {user}")


def delete(cluster: ClusterLike, user: str) -> bool:
    """Delete `user`'s SCRAM-SHA-512 credential; whether it existed."""
    client = clients.admin(cluster)
    futures = client.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)])
    failure = futures[user].exception()
    if failure is not None and failure.args and failure.args[0].code() == KafkaError.RESOURCE_NOT_FOUND:
        return False  # already gone
    clients.result_of(futures[user], f"deleting the SCRAM-SHA-512 credential of user {user}")
    return True
