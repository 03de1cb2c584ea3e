"""The transport face (NServiceBus's SQL Server transport), pure: its endpoints and messages
(docs/transport.md)."""
