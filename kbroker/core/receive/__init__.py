"""RECEIVE: the per-group receive buffer, leases of buffered records, out-of-order offset completion,
poison counting, reclaiming a queue's storage (pure)."""
