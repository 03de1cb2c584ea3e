"""Kafka transactions: the group committer (its batch loop, producer ring and settling), the guarded
transactional producer, fencing, open transactions and the transaction log."""
