"""Activation's Kafka side: the queue watch's counts, the clients they share, the events topic."""
