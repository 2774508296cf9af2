"""FastStream's Kafka broker behind the guard: the Kafka half of :mod:`reliable.integrations.faststream`.

::

    policy = RetryPolicy(delays_s=(1.0, 10.0))
    broker = KafkaBroker("127.0.0.1:9092")

    @reliable_subscriber(rel, group="billing", kafka=policy, subscriber=broker.subscriber(
        *policy.topics("orders"), group_id="billing", auto_offset_reset="earliest",
        ack_policy=AckPolicy.ACK, no_reply=True, parser=kafka_parser))
    async def on_order(env: Envelope, session: AsyncSession) -> None: ...

``ack_policy=AckPolicy.ACK`` is required (any policy but FastStream's default ``ACK_FIRST``, which turns on
aiokafka's auto-commit: offsets committed while the handler runs, a crash loses the record); the offset is
committed once the guard answered and any copy was published. The function never raises into FastStream —
an error (a copy that could not be published, a failed commit) seeks back to the record and takes it again
after a pause — so FastStream's policy never acts on an error. ``batch=True`` is refused
(:mod:`reliable.integrations.faststream_binding`).

The subscriber listens to the topic *and* its retry topics (``policy.topics``). Each record becomes an
:class:`~reliable.types.Envelope` and, after the guard's answer, takes the step the shared
:func:`~reliable.adapters.kafka_steps.next_step` gives — as in both Kafka consumer loops: acknowledge,
a copy to ``{topic}.retry.{n}`` (due after the n-th delay), or a copy to ``{topic}.dlt`` with the reason
in ``reliable-reason``; the copy is published through the broker (awaited) before the record is
acknowledged.

Limits, because FastStream owns the consumer: a retry copy that is not due yet is *waited for* in the
handler (the subscriber's other partitions wait too), and a hold (lease conflict, database down) waits and
asks the guard again in place rather than pausing one partition. FastStream's ``publish`` takes text headers,
so an undecodable header's bytes reach the DLT backslash-escaped (the confluent and aiokafka loops keep them
untouched); FastStream also adds its own ``content-type``/``correlation_id`` headers to the copies. A header
that is not UTF-8 makes FastStream's own parser drop the record (committed past, an error logged) before the
subscriber is called: pass :func:`kafka_parser` as the subscriber's ``parser=``.
"""

# no ``from __future__ import annotations``: FastStream resolves the annotations of ``consume`` when the
# subscriber starts, and string annotations would be looked up in the caller's frames first — a user's module
# that imported ``KafkaBroker`` (the class) would make ``broker: "KafkaBroker"`` one FastStream cannot inject
import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faststream.kafka.annotations import KafkaBroker, KafkaMessage

from reliable import constants as C
from reliable.adapters.kafka_common import (
    Record,
    RetryPolicy,
    UndecodableRecord,
    decode_headers,
    due_in_s,
    forwarded_by_another_group,
    last_attempt,
    raw_forward_headers,
    to_envelope,
)
from reliable.adapters.kafka_steps import AnswerBook, Step, copy_headers, undecodable_envelope, unjournaled
from reliable.errors import ConfigurationError
from reliable.integrations.faststream_binding import bind, check
from reliable.types import Envelope

log = logging.getLogger("reliable.integrations.faststream")

Consume = Callable[..., Awaitable[None]]
AsyncDecide = Callable[[Envelope], Awaitable[Any]]


def error_pause_s(in_a_row: int) -> float:
    """How long the FastStream Kafka wrapper waits before taking a record again after its ``in_a_row``-th
    error in a row on that partition: from :data:`~reliable.constants.KAFKA_ERROR_PAUSE_MIN_S`, doubling, at
    most :data:`~reliable.constants.KAFKA_ERROR_PAUSE_MAX_S`."""
    exponent = min(max(in_a_row, 1) - 1, 32)
    return float(min(C.KAFKA_ERROR_PAUSE_MIN_S * 2**exponent, C.KAFKA_ERROR_PAUSE_MAX_S))


def _text(headers: Sequence[tuple[str, str | bytes | None]]) -> dict[str, str]:
    """FastStream publishes text headers: bytes that are not UTF-8 are backslash-escaped."""
    return {
        k: v if isinstance(v, str) else (v or b"").decode("utf-8", "backslashreplace") for k, v in headers
    }


async def kafka_parser(record: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """FastStream's Kafka parser, except that a record with a header that is not UTF-8 reaches the guarded
    subscriber: FastStream decodes every header as UTF-8, and on one that is not it logged an error and
    committed past the record — a silent skip. Pass it as the subscriber's ``parser=``; the subscriber reads
    the record's own bytes (``raw_message``), journals it as undecodable and sends it to the DLT with its
    header bytes untouched."""
    try:
        return await original(record)
    except UnicodeDecodeError:
        headers = [(k, (v or b"").decode("utf-8", "backslashreplace").encode()) for k, v in record.headers]
        message = await original(dataclasses.replace(record, headers=headers))
        message.raw_message = record
        return message


def faststream_kafka_consumer(
    handle: Any,
    *,
    subscriber: Any = None,
    retry: RetryPolicy | None = None,
    topic: str | None = None,
    id_header: str = C.KAFKA_ID_HEADER,
    allow_position_id: bool = True,
    counts: "Counter[str] | None" = None,
) -> Any:
    """Register on ``subscriber`` (``broker.subscriber(…)`` of a ``KafkaBroker``) a function that runs every
    record through the guarded ``handle``; returns FastStream's handler wrapper.

    ``topic``: the business topic whose ``.dlt`` takes undecodable records (default: the record's topic).
    ``counts``: a counter of what happened (``success``, ``retry_topic``, ``dead_letter`` …).
    """
    check(subscriber, kafka=True)
    policy = retry or RetryPolicy()
    decide = getattr(handle, "decide", None)
    judge: AsyncDecide = decide if callable(decide) else handle
    book = AnswerBook()
    if counts is not None:
        book.counts = counts
    tally: Counter[str] = book.counts
    group = str(getattr(handle, "group", "") or "")  # the guard's group, named on the copies it forwards
    # a database outage while journaling an undecodable record: never a hot loop, even with delays_s (0, …)
    pause_s = max(policy.delays_s[0] if policy.delays_s else 1.0, C.KAFKA_ERROR_PAUSE_MIN_S)
    errors: Counter[tuple[str, int]] = Counter()  # the wrapper's own errors in a row, per partition

    async def answer(env: Envelope) -> object:
        try:
            return await judge(env)
        except Exception as exc:  # a bare handler's bug: retried like a failure
            tally["handler_error"] += 1
            log.exception("handler raised for %s", env.message_id)
            return exc

    async def one(message: KafkaMessage, broker: KafkaBroker) -> None:
        raw = message.raw_message
        if isinstance(raw, tuple):  # refused when the subscriber was registered; kept as a last stop
            raise ConfigurationError("reliable_subscriber(kafka=…) guards one record a call, not batch=True")
        ts = raw.timestamp if raw.timestamp and raw.timestamp > 0 else None
        rec = Record(raw.topic, raw.partition, raw.offset, raw.key, raw.value, list(raw.headers or ()), ts)
        try:
            headers = decode_headers(rec.headers)
            if forwarded_by_another_group(rec, headers, group, policy):  # not this group's to handle
                tally["foreign_retry"] += 1
                await message.ack()
                return
            wait = due_in_s(rec, headers, policy)
            if wait > 0:  # a retry copy that is not due yet
                tally["waited"] += 1
                await asyncio.sleep(wait)
            env = to_envelope(rec, id_header=id_header, allow_position_id=allow_position_id)
            env = last_attempt(env, policy)
        except UndecodableRecord as exc:
            tally["undecodable"] += 1
            if callable(decide):  # journaled before its dead-letter copy, as the consumer loops do
                stand_in = undecodable_envelope(rec, topic or rec.topic, exc)
                while unjournaled(await answer(stand_in)):
                    tally["held"] += 1
                    await asyncio.sleep(pause_s)
            wire = raw_forward_headers(rec, f"undecodable: {exc}")
            await broker.publish(
                rec.value, policy.dlt_topic(topic or rec.topic), key=rec.key, headers=_text(wire)
            )
            await message.ack()
            return
        tp = (rec.topic, rec.partition)
        while True:
            env = last_attempt(env, policy, book.handler_failures[tp])  # blocking: this head's failures
            action = book.step(tp, await answer(env), env, policy)
            if action.step is not Step.HOLD:
                break
            tally["held"] += 1
            await asyncio.sleep(action.delay_s)
        if action.step is not Step.ACK:
            assert action.topic is not None
            wire = copy_headers(rec, headers, env, action, id_header, group)
            await broker.publish(rec.value, action.topic, key=rec.key, headers=_text(wire))
        await message.ack()

    async def consume(message: KafkaMessage, broker: KafkaBroker) -> None:
        raw = message.raw_message
        tp = ("", -1) if isinstance(raw, tuple) else (raw.topic, raw.partition)
        try:
            await one(message, broker)
        except Exception as exc:
            # never into FastStream: its ACK (and REJECT_ON_ERROR) policy would commit past the record; seek
            # back to it instead and take it again after a pause (a failed copy publish, a failed commit),
            # doubling while the error persists: a lasting one is a log line a minute, not a hot loop
            tally["error"] += 1
            errors[tp] += 1
            pause = error_pause_s(errors[tp])
            where = f"{tp[0]}-{tp[1]}@{raw.offset}" if not isinstance(raw, tuple) else "batch"
            log.exception(
                "record %s: %r; taken again in %.1f s (error %d in a row)", where, exc, pause, errors[tp]
            )
            await asyncio.sleep(pause)
            await message.nack()
        else:
            errors.pop(tp, None)

    consume.__name__ = consume.__qualname__ = getattr(handle, "__name__", consume.__name__)
    return bind(subscriber, consume, kafka=True)
