"""The catalog on Kafka: the catalog topic and `kbroker apply`."""
