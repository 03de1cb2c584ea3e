"""Transactions, pure: a kbroker transaction's states; for Kafka's, what to do when one fails or
overruns, who committed a partition's offsets, and Kafka's transaction log parsed."""
