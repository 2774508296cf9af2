"""A FastStream app as a user writes it, run as a script by the tests (start-up, SIGKILL mid-handler).

Why a script: FastStream resolves the handler's annotations when the subscriber starts, looking in the frames
on the call stack; a script's module frame holds the names a FastStream app imports (``KafkaBroker``,
``RabbitMessage``, aio-pika's ``Connection``), which a test function's frame does not. The app is the one
docs/getting-started.md §4.5 shows, started from the module's top level.

argv: rabbit|kafka broker_url source group db_url redis_url key_prefix [exit_after]; environment: SLOW (a
message id whose handler sleeps SLOW_S seconds). Prints ``BEGIN id`` / ``END id``; with ``exit_after`` it
stops once that many handler calls ended.
"""

import asyncio
import os
import sys

from aio_pika import Connection  # noqa: F401  (names a FastStream app's module commonly holds)
from faststream import AckPolicy, FastStream
from faststream.kafka import KafkaBroker, KafkaMessage  # noqa: F401
from faststream.rabbit import Channel, RabbitBroker, RabbitMessage  # noqa: F401
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

from reliable import Envelope, Reliability
from reliable.adapters.kafka import RetryPolicy
from reliable.integrations.faststream import reliable_subscriber
from reliable.integrations.faststream_kafka import kafka_parser

kind, url, source, group, db_url, redis_url, prefix = sys.argv[1:8]
exit_after = int(sys.argv[8]) if len(sys.argv) > 8 else 0
slow, slow_s = os.environ.get("SLOW", ""), float(os.environ.get("SLOW_S", "8"))

md = MetaData()
app_effects = Table(  # no unique constraint: the guard, not the schema, keeps an effect from repeating
    "faststream_app_effects",
    md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False),
    Column("grp", String(64), nullable=False),
)
rel = Reliability(db_url, redis_url, key_prefix=prefix, max_attempts=5, lease_ms=3000)
md.create_all(rel.engine)
ended: list[str] = []


async def on_order(env: Envelope, session: AsyncSession) -> None:
    print("BEGIN", env.message_id, flush=True)
    await session.execute(insert(app_effects).values(message_id=env.message_id, grp=group))
    if env.message_id == slow:
        await asyncio.sleep(slow_s)
    print("END", env.message_id, flush=True)
    ended.append(env.message_id or "")


if kind == "kafka":
    kafka_broker = KafkaBroker(url, logger=None)
    policy = RetryPolicy(delays_s=(0.3,))
    kafka_sub = kafka_broker.subscriber(
        *policy.topics(source),
        group_id=group,
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.ACK,
        no_reply=True,
        parser=kafka_parser,
        session_timeout_ms=4000,
        heartbeat_interval_ms=300,
    )
    reliable_subscriber(rel, group=group, kafka=policy, subscriber=kafka_sub)(on_order)
    app = FastStream(kafka_broker, logger=None)
else:
    rabbit_broker = RabbitBroker(url, logger=None, default_channel=Channel(prefetch_count=10))
    rabbit_sub = rabbit_broker.subscriber(source, no_reply=True)
    reliable_subscriber(rel, group=group, subscriber=rabbit_sub, retry_delay_s=0.1)(on_order)
    app = FastStream(rabbit_broker, logger=None)


async def main() -> None:
    await app.start()
    print("STARTED", flush=True)
    try:
        while not exit_after or len(ended) < exit_after:
            await asyncio.sleep(0.05)
    finally:
        await app.stop()
        await rel.aclose()


asyncio.run(main())  # from the module's top level, as a script does
