"""Dialogs on Kafka: the endpoints topic's cache, conversation leases, the timer service."""
