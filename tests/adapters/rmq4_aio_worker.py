"""A consumer process of the ``billing`` group as a team runs it: an ``async def`` handler behind a
broker_sim ``PushConsumer`` (``broker-sim serve``), until killed. Run by ``test_rocketmq4_aio_kill.py``:

    python -m tests.adapters.rmq4_aio_worker DB_URL REDIS_URL KEY_PREFIX NAMESRV HANG_ON READY_FILE

The handler of message ``HANG_ON`` writes its effect, creates ``READY_FILE`` and then waits for ever inside
the guard's open transaction (the test SIGKILLs the process there); ``-`` hangs on nothing.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

from reliable import Reliability
from reliable.types import Envelope
from tests.adapters.rmq4_aio_topology import Instances, async_handler


def main(argv: list[str]) -> None:
    db_url, redis_url, prefix, address, hang_on, ready = argv
    rel = Reliability(db_url, redis_url, key_prefix=prefix, lease_ms=3000)

    async def work(env: Envelope) -> None:
        await asyncio.sleep(0.01)  # the handler's downstream call

    async def hang(env: Envelope) -> None:
        if env.message_id == hang_on:
            Path(ready).touch()
            await asyncio.Event().wait()

    Instances().start(address, async_handler(rel, "billing", work, hang))
    threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main(sys.argv[1:])
