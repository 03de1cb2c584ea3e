"""Security: the ACLs each role needs, GRANT/DENY/REVOKE as ACLs, Kafka client security settings,
who may use the worker's HTTP API (pure)."""
