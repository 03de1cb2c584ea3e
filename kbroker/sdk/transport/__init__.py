"""The transport face's SDK (NServiceBus's SQL Server transport): endpoints, their transactions,
readers and the asyncio form. The public entry point is `kbroker.transport`."""
