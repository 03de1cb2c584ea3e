"""Security on Kafka: ACLs, SCRAM users, GRANT/DENY/REVOKE applied."""
