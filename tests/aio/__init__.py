"""The asyncio flavour: async engine and Redis, the async guard, aio-pika and FastStream (issue #14)."""
