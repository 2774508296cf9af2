"""The asyncio flavour of the Kafka adapter, on ``aiokafka``: a guarded consumer loop and an async Sender.

Same rules as the confluent-kafka loop (:mod:`reliable.adapters.kafka.consumer`), from the same code: the
records become :class:`~reliable.adapters.kafka_common.Record`, the envelope, message id, header codec and
the decision after each answer (:func:`~reliable.adapters.kafka_steps.next_step`: acknowledge, copy to a
retry topic, copy to the dead-letter topic, or hold the partition) are the shared pure functions; only the
I/O is aiokafka's. Each record's answer is awaited in offset order per partition; a copy is produced with
``send_and_wait`` before the offset may move past its record, and the offsets are committed once per poll.

Limits of this flavour: no ``db_offsets`` (positions live in Kafka's group offsets; replays after a crash
are suppressed by the guard as duplicates) and no batch guard call (one awaited guard call per record).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import KafkaError

from reliable import constants as C
from reliable.adapters.kafka.loop import TP, GuardedLoop, deadline_of, run_outcome
from reliable.adapters.kafka_common import (
    Record,
    RetryPolicy,
    UndecodableRecord,
    raw_forward_headers,
    send_headers,
)
from reliable.adapters.kafka_steps import Step, copy_headers
from reliable.errors import ConfigurationError, SendError
from reliable.sender import OutgoingMessage, SendReceipt
from reliable.types import Envelope

log = logging.getLogger("reliable.adapters.kafka")

AsyncGuardedHandler = Callable[[Envelope], Awaitable[Any]]
WireHeaders = Sequence[tuple[str, str | bytes | None]]

#: what reliable consumption needs (aiokafka's names for the confluent defaults of ``kafka.admin``)
AIO_CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "enable_auto_commit": False,
    "auto_offset_reset": "earliest",
    "isolation_level": "read_committed",
}
AIO_PRODUCER_DEFAULTS: Mapping[str, Any] = {"enable_idempotence": True, "acks": "all", "linger_ms": 0}


def to_record(msg: ConsumerRecord[bytes, bytes]) -> Record:
    """The neutral view of an aiokafka record."""
    return Record(
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        key=msg.key,
        value=msg.value,
        headers=list(msg.headers or ()),
        timestamp_ms=msg.timestamp if msg.timestamp and msg.timestamp > 0 else None,
    )


def _wire(headers: WireHeaders) -> list[tuple[str, bytes]]:
    """aiokafka wants ``bytes`` header values (a null value travels as empty)."""
    return [(k, v.encode("utf-8") if isinstance(v, str) else (v or b"")) for k, v in headers]


class AioKafkaGuardedConsumer(GuardedLoop[AsyncGuardedHandler]):
    """Consumes ``topic`` and its retry topics for ``group`` through an async guarded ``handler``.

    ``await start()`` (or ``async with``), then ``await run(until=…, timeout_s=…)``; ``config``/``producer``
    are aiokafka keyword arguments on top of :data:`AIO_CONSUMER_DEFAULTS` / :data:`AIO_PRODUCER_DEFAULTS`.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        handler: AsyncGuardedHandler,
        *,
        retry: RetryPolicy | None = None,
        batch_size: int = 100,
        poll_s: float = 0.1,
        id_header: str = C.KAFKA_ID_HEADER,
        allow_position_id: bool = True,
        config: Mapping[str, Any] | None = None,
        producer: Mapping[str, Any] | None = None,
    ) -> None:
        if not bootstrap:
            raise ConfigurationError("no Kafka bootstrap servers given")
        super().__init__(
            topic, group, handler, retry=retry, batch_size=batch_size, poll_s=poll_s, id_header=id_header,
            allow_position_id=allow_position_id,
        )  # fmt: skip
        self._stop = asyncio.Event()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, **{**AIO_CONSUMER_DEFAULTS, **(config or {})}
        )
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, **{**AIO_PRODUCER_DEFAULTS, **(producer or {})}
        )

    async def start(self) -> None:
        """Connect the forwarding producer and join the group; on failure both are stopped before the error
        goes up (``async with`` never reaches ``__aexit__`` then)."""
        try:
            await self._producer.start()
            self._consumer.subscribe(self.retry.topics(self.topic), listener=_Forgetting(self))
            await self._consumer.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Leave the group (committed offsets stay) and flush the forwarding producer."""
        try:
            await self._consumer.stop()
        finally:
            await self._producer.stop()

    async def __aenter__(self) -> AioKafkaGuardedConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stop(self) -> None:
        self._stop.set()

    @property
    def assigned(self) -> set[TP]:
        """The partitions the group gave this member (empty before the first assignment)."""
        return {(p.topic, p.partition) for p in self._consumer.assignment()}

    async def run(self, until: Callable[[], bool] | None = None, timeout_s: float | None = None) -> bool:
        """Consume until ``until()`` is true (then ``True``), :meth:`stop`, or ``timeout_s`` (``False``)."""
        deadline = deadline_of(timeout_s)
        while not self._stop.is_set():
            outcome = run_outcome(until, deadline)
            if outcome is not None:
                return outcome
            await self.poll_once()
        return False

    async def poll_once(self) -> int:
        """One fetch and its answers; how many records it returned."""
        self._resume_due()
        fetched = await self._consumer.getmany(
            timeout_ms=int(self.poll_s * 1000), max_records=self.batch_size
        )
        positions: dict[TopicPartition, int] = {}
        for part, msgs in fetched.items():
            tp = (part.topic, part.partition)
            if tp in self._paused:  # fetched before the hold took: back to its first record, still held
                self._consumer.seek(part, min(m.offset for m in msgs))
                self._consumer.pause(part)
                continue
            done = await self._run(tp, [to_record(m) for m in sorted(msgs, key=lambda m: m.offset)])
            if done is not None:
                positions[part] = done
        # a partition the group took away while its records were answered is the new owner's now: it starts
        # from the committed offset, and committing ours there too would fail the commit of every partition
        owned = self._consumer.assignment()
        positions = {part: at for part, at in positions.items() if part in owned}
        if positions:
            try:
                await self._consumer.commit(positions)
            except KafkaError as exc:  # the records are final; at worst they replay as suppressed duplicates
                log.warning("offset commit failed (%s); those records may be delivered again", exc)
        return sum(len(m) for m in fetched.values())

    async def _run(self, tp: TP, records: Sequence[Record]) -> int | None:
        """Answer one partition's records in order; the next offset to commit (``None``: none final)."""
        done: int | None = None
        for rec in records:
            if not self._owns(tp):  # revoked while earlier records were answered: the new owner has them
                return done
            try:
                headers, wait, env = self._read(rec)
            except UndecodableRecord as exc:
                stand_in = self._undecodable(rec, exc)  # journaled first (kafka.loop), held if it cannot be
                delay = (
                    None
                    if stand_in is None
                    else self._unjournaled_delay(tp, await self._decide_safely(stand_in))
                )
                if delay is not None:
                    self._hold(tp, rec.offset, delay)
                    return done
                self.counts["undecodable"] += 1
                log.error("%s-%d@%d undecodable, dead-lettered: %s", *tp, rec.offset, exc)
                dlt = self.retry.dlt_topic(self.topic)
                if not await self._copy(tp, rec, dlt, raw_forward_headers(rec, f"undecodable: {exc}")):
                    return done
                done = rec.offset + 1
                continue
            if self._foreign(rec, headers):
                done = rec.offset + 1
                continue
            if env is None:  # a retry copy that is not due yet: hold the partition until it is
                self._hold(tp, rec.offset, wait)
                return done
            env = self._at_head(tp, env)
            if not await self._answer(tp, rec, headers, env, await self._decide_safely(env)):
                return done
            done = rec.offset + 1
        return done

    async def _decide_safely(self, env: Envelope) -> object:
        try:
            return await self._decide(env)
        except Exception as exc:  # a bare handler's bug: retried like a failure, never committed past
            self.counts["handler_error"] += 1
            log.exception("handler raised for %s at %s", env.message_id, env.source_topic)
            return exc

    async def _answer(
        self, tp: TP, rec: Record, headers: dict[str, str], env: Envelope, answer: object
    ) -> bool:
        """Act on one answer (:func:`~reliable.adapters.kafka_steps.next_step`); ``False``: held here."""
        action = self._book.step(tp, answer, env, self.retry)
        if action.step is Step.HOLD:
            self._hold(tp, rec.offset, action.delay_s)
            return False
        if action.step is Step.ACK:
            return True
        assert action.topic is not None
        wire = copy_headers(rec, headers, env, action, self.id_header, self.group)
        return await self._copy(tp, rec, action.topic, wire)

    async def _copy(self, tp: TP, rec: Record, topic: str, headers: WireHeaders) -> bool:
        """Send a copy and wait for it; on failure hold the partition at ``rec`` (nothing is lost)."""
        try:
            await self._producer.send_and_wait(topic, value=rec.value, key=rec.key, headers=_wire(headers))
        except KafkaError as exc:
            log.error("copy of %s-%d@%d to %s failed (%s): redelivered", *tp, rec.offset, topic, exc)
            self._hold(tp, rec.offset, self.retry.delays_s[0] if self.retry.delays_s else 1.0)
            return False
        return True

    def _owns(self, tp: TP) -> bool:
        return TopicPartition(*tp) in self._consumer.assignment()

    def _hold(self, tp: TP, offset: int, delay_s: float) -> None:
        """Pause ``tp`` and seek back to ``offset``. A partition revoked while its record was answered
        (aiokafka rebalances in the background, during an awaited handler) is not ours to pause: its new
        owner starts from the committed offset, which never moved past ``offset``. Until 2026-11-29 the
        pause raised ``IllegalStateError`` there and the member's ``run`` died with it."""
        self.counts["held"] += 1
        if not self._owns(tp):
            log.info("%s-%d revoked while %d was answered: left to its new owner", *tp, offset)
            self._forget([tp])
            return
        part = TopicPartition(*tp)
        self._consumer.pause(part)
        self._consumer.seek(part, offset)
        self._paused[tp] = time.monotonic() + delay_s

    def _resume_due(self) -> None:
        now = time.monotonic()
        assigned = self._consumer.assignment()
        for tp, at in list(self._paused.items()):
            part = TopicPartition(*tp)
            if part not in assigned:  # revoked meanwhile: the new owner starts from the committed offset
                del self._paused[tp]
            elif at <= now:
                self._consumer.resume(part)
                del self._paused[tp]


class _Forgetting(ConsumerRebalanceListener):  # type: ignore[misc]
    """At a revoke the loop forgets the partitions' holds and failure counts. aiokafka forgets a pause at
    a new assignment and fetches from the committed offset: a member still counting a partition as held
    skipped what it fetched there, then committed past it with the next records it answered — a held
    record never applied in this group."""

    def __init__(self, loop: AioKafkaGuardedConsumer) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self.loop._forget([(p.topic, p.partition) for p in revoked])

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        return None


class AioKafkaSender:
    """:class:`~reliable.sender.AsyncSender` over one idempotent aiokafka producer (``acks=all``).

    Same record as :class:`~reliable.adapters.kafka.KafkaSender` (id as key and header, send count, tags,
    target group); the receipt is the record's partition and offset. :meth:`max_offset` is the awaited
    probe (the partition's high watermark). ``await start()`` or ``async with`` first.
    """

    #: a targeted resend goes to the topic (every group gets it): the sweeper sends one copy per message
    targets_groups = False

    def __init__(
        self,
        bootstrap: str,
        *,
        config: Mapping[str, Any] | None = None,
        timeout_s: float = 10.0,
        id_header: str = C.KAFKA_ID_HEADER,
    ) -> None:
        if not bootstrap:
            raise ConfigurationError("no Kafka bootstrap servers given")
        self.bootstrap, self.timeout_s, self.id_header = bootstrap, timeout_s, id_header
        options = {**AIO_PRODUCER_DEFAULTS, "request_timeout_ms": int(timeout_s * 1000), **(config or {})}
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **options)
        self._probe: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Connect the producer. One that cannot (no broker answers) is stopped before the error goes up:
        ``async with`` never reaches ``__aexit__`` then, and the half-started producer was left open
        (aiokafka's "Unclosed AIOKafkaProducer" at exit)."""
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()
            raise

    async def close(self) -> None:
        try:
            await self._producer.stop()
        finally:
            if self._probe is not None:
                await self._probe.stop()
                self._probe = None

    async def __aenter__(self) -> AioKafkaSender:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, message: OutgoingMessage) -> SendReceipt:
        headers = send_headers(message, self.id_header)
        try:
            meta = await asyncio.wait_for(
                self._producer.send_and_wait(
                    message.topic,
                    value=message.body,
                    key=message.message_id.encode("utf-8"),
                    headers=_wire(headers),
                ),
                self.timeout_s + 1.0,
            )
        except (KafkaError, TimeoutError) as exc:
            raise SendError(f"message {message.message_id}: {type(exc).__name__}: {exc}") from exc
        if meta.offset is None or meta.offset < 0:
            raise SendError(f"message {message.message_id}: delivery report without a position")
        return SendReceipt(meta.partition, meta.offset, f"{message.topic}-{meta.partition}-{meta.offset}")

    async def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The partition's high watermark (``None``: the broker cannot tell)."""
        return await self._offset(topic, queue_id, high=True)

    async def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The partition's log start offset: retention deleted the records below it."""
        return await self._offset(topic, queue_id, high=False)

    async def _offset(self, topic: str, queue_id: int, *, high: bool) -> int | None:
        if self._probe is None:
            self._probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
            await self._probe.start()
        part = TopicPartition(topic, queue_id)
        try:
            if high:
                answers = await self._probe.end_offsets([part])
            else:
                answers = await self._probe.beginning_offsets([part])
        except KafkaError as exc:
            log.warning("%s watermark of %s-%d unknown: %s", "high" if high else "low", topic, queue_id, exc)
            return None
        answer = answers.get(part)
        return None if answer is None else int(answer)
