"""The transport face on Kafka: its queues' topics and receivers, and secondary (per-instance)
queues."""
