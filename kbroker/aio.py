"""`kbroker.aio`: the asyncio SDK (kept at this path for users; the code is kbroker.sdk.aio)."""

from kbroker.sdk.aio import AsyncBroker, AsyncTransaction, connect

__all__ = ["AsyncBroker", "AsyncTransaction", "connect"]
