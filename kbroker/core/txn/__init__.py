"""Kafka transactions: what to do when one fails or overruns, who committed a partition's offsets, Kafka's transaction log parsed (pure)."""
