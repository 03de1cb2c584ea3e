"""RECEIVE on Kafka: the queue's receiver and poll thread, partition assignment, leases, the group
protocol, rollbacks, dead letters, reclaim and retention."""
