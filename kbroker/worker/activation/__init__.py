"""Activation in the worker: the queue monitors' service, the task handlers that run activated
readers, the queue watch, the cluster tick."""
