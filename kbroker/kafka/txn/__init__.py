"""Kafka transactions: the group committer, the guarded transactional producer, fencing, open transactions and the transaction log."""
