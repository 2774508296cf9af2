"""The Kafka consumer loop: each record through the guard, in order per partition, committed after the answer.

Per polled batch, the records of each partition are handled in offset order, and the partition's offset is
committed (synchronously, once per batch) only up to the last record whose answer is *final*:

==========================  ===============================================================================
answer                      what happens before the offset may move past the record
==========================  ===============================================================================
``SUCCESS``                 nothing more (the effect is committed, or was a suppressed duplicate)
``RECONSUME_LATER``         retry topics (default): a copy goes to ``{topic}.retry.{n}`` due after the n-th
(handler failed or raised)  delay, and after the last delay to ``{topic}.dlt``; the delivery report must
                            arrive before the commit. Blocking mode: the partition is paused and seeked
                            back to the record, which is redelivered after the delay (order kept).
``RECONSUME_LATER``         lease conflict, database unavailable, confirm conflict: not the record's fault,
(infrastructure)            so always the blocking path — pause, seek back, try again after the first delay
``DEAD_LETTER``             a copy to ``{topic}.dlt`` with the reason in ``reliable-reason``
undecodable record          straight to ``{topic}.dlt`` with the reason, its bytes untouched
==========================  ===============================================================================

A retry topic's records carry the time they are due (``reliable-not-before-ms``); one that is not due yet
pauses its partition until it is, and the other partitions keep flowing. A forward whose delivery report
fails keeps the offset where it is and seeks back, so nothing is committed that is not somewhere.

With ``db_offsets=True`` the stored positions of :mod:`reliable.adapters.kafka_offsets` are where the
consumer starts on every assignment, and the loop writes each batch's final positions there too (wrap the
handler in :func:`~reliable.adapters.kafka_offsets.offsets_in_db` so processed records write theirs in the
guard's own transaction, never past the partition's first record whose answer is not final: each record
carries that commit floor, see :mod:`~reliable.adapters.kafka_offsets`). Not thread-safe: one loop per
thread or process, like the confluent consumer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from reliable import constants as C
from reliable.adapters import kafka_offsets
from reliable.adapters.kafka.admin import consumer_config, producer_config
from reliable.adapters.kafka.forwarder import Forwarder
from reliable.adapters.kafka.loop import TP, GuardedLoop, deadline_of, run_outcome
from reliable.adapters.kafka_common import (
    Record,
    RetryMode,
    RetryPolicy,
    UndecodableRecord,
    raw_forward_headers,
)
from reliable.adapters.kafka_steps import Step, copy_headers
from reliable.errors import ConfigurationError
from reliable.types import Envelope

log = logging.getLogger("reliable.adapters.kafka")

GuardedHandler = Callable[[Envelope], Any]


def to_record(msg: Message) -> Record:
    """The neutral view of a confluent-kafka message."""
    _kind, ts = msg.timestamp()
    raw = msg.headers() or ()
    headers = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return Record(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        timestamp_ms=ts if ts and ts > 0 else None,
    )


class KafkaGuardedConsumer(GuardedLoop[GuardedHandler]):
    """Consumes ``topic`` and its retry topics for ``group`` through ``handler`` (a guarded handler).

    ``retry``: the :class:`RetryPolicy` (delays, retry topics or blocking). ``batch`` (default on, retry
    topics only): guard each partition's polled records with one ``decide_batch`` call — one journal and one
    work transaction per chunk instead of per record; a failing handler rolls back only its own record.
    ``db_offsets`` with ``rel``: positions in the application database (module doc). ``allow_position_id``:
    a record with neither id header nor key gets ``topic-partition-offset`` as its id (with a warning);
    off, it is dead-lettered as having no id. ``config``/``producer``: confluent-kafka settings on top of
    :data:`~reliable.adapters.kafka.admin.CONSUMER_DEFAULTS` / ``PRODUCER_DEFAULTS`` (the producer
    forwards records to retry topics and the DLT).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        handler: GuardedHandler,
        *,
        retry: RetryPolicy | None = None,
        rel: Any = None,
        db_offsets: bool = False,
        batch_size: int = 100,
        batch: bool = True,
        poll_s: float = 0.1,
        id_header: str = C.KAFKA_ID_HEADER,
        allow_position_id: bool = True,
        config: Mapping[str, Any] | None = None,
        producer: Mapping[str, Any] | None = None,
    ) -> None:
        if db_offsets and rel is None:
            raise ConfigurationError(
                "db_offsets=True needs rel (the Reliability whose database keeps offsets)"
            )
        super().__init__(
            topic, group, handler, retry=retry, batch_size=batch_size, poll_s=poll_s, id_header=id_header,
            allow_position_id=allow_position_id,
        )  # fmt: skip
        self.rel = rel
        self.db_offsets = db_offsets
        decide_batch = getattr(handler, "decide_batch", None) or getattr(handler, "batch", None)
        #: batch mode: one guard call per partition chunk (retry topics only: blocking retry needs each
        #: record's answer before the next one runs)
        self._batching = batch and self.retry.mode is RetryMode.TOPICS and callable(decide_batch)
        self._decide_batch: Callable[[Sequence[Envelope]], Sequence[object]] | None = (
            decide_batch if self._batching else None
        )
        self._stop = threading.Event()
        self._failures = self._book.failures  # consecutive failures at each partition head
        #: the partitions this member holds now
        self.assigned: set[TP] = set()
        self._consumer = Consumer(consumer_config(bootstrap, group, config))
        self._forwarder = Forwarder(producer_config(bootstrap, producer))
        self._consumer.subscribe(
            self.retry.topics(topic), on_assign=self._on_assign, on_revoke=self._on_revoke
        )

    # --- loop ------------------------------------------------------------------------------------------

    def run(self, until: Callable[[], bool] | None = None, timeout_s: float | None = None) -> bool:
        """Consume until ``until()`` is true (then ``True``), :meth:`stop`, or ``timeout_s`` (``False``)."""
        deadline = deadline_of(timeout_s)
        while not self._stop.is_set():
            outcome = run_outcome(until, deadline)
            if outcome is not None:
                return outcome
            self.poll_once()
        return False

    def poll_once(self) -> int:
        """One poll and its batch; returns how many records the poll returned."""
        self._resume_due()
        messages = self._consumer.consume(self.batch_size, self.poll_s)
        runs: dict[TP, list[Record]] = defaultdict(list)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", err)
                continue
            rec = to_record(msg)
            if (rec.topic, rec.partition) not in self._paused:
                runs[(rec.topic, rec.partition)].append(rec)
        positions: dict[TP, int] = {}
        for tp, records in runs.items():
            done = self._run(tp, sorted(records, key=lambda r: r.offset))
            if done is not None:
                positions[tp] = done
        self._settle(positions)
        return len(messages)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Leave the group (committed offsets stay) and flush the forwarding producer."""
        self._forwarder.close()
        self._consumer.close()

    def __enter__(self) -> KafkaGuardedConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one partition's run ------------------------------------------------------------------------------

    def _run(self, tp: TP, records: Sequence[Record]) -> int | None:
        """Answer ``records`` of one partition in order; the next offset to commit (``None``: none final).

        Decodable, due records are guarded in chunks (one call per record, or one ``decide_batch`` call per
        chunk in batch mode); an undecodable record or a retry copy that is not due ends a chunk.
        """
        done: int | None = None
        chunk: list[tuple[Record, dict[str, str], Envelope]] = []
        for rec in records:
            try:
                headers, wait, env = self._read(rec)
            except UndecodableRecord as exc:
                done = self._decide_chunk(tp, chunk, done)
                chunk = []
                if tp in self._paused:
                    return done
                if not self._dead_letter_raw(tp, rec, exc):
                    return done
                done = rec.offset + 1
                continue
            if self._foreign(rec, headers):
                done = self._decide_chunk(tp, chunk, done)
                chunk = []
                if tp in self._paused:
                    return done
                done = rec.offset + 1
                continue
            if env is None:  # a retry copy that is not due yet: hold the partition until it is
                done = self._decide_chunk(tp, chunk, done)
                if tp not in self._paused:
                    self._hold(tp, rec.offset, wait)
                return done
            chunk.append((rec, headers, env))
            if not self._batching:
                done = self._decide_chunk(tp, chunk, done)
                chunk = []
                if tp in self._paused:
                    return done
        return self._decide_chunk(tp, chunk, done)

    def _dead_letter_raw(self, tp: TP, rec: Record, exc: UndecodableRecord) -> bool:
        """Journal an undecodable record (a guard's stand-in, :mod:`~reliable.adapters.kafka.loop`), then
        copy its raw bytes to the dead-letter topic; ``False``: held here, the journal could not take it."""
        stand_in = self._undecodable(rec, exc)
        if stand_in is not None:
            delay = self._unjournaled_delay(tp, self._decide_safely(stand_in))
            if delay is not None:
                self._hold(tp, rec.offset, delay)
                return False
        self.counts["undecodable"] += 1
        log.error("%s-%d@%d undecodable, dead-lettered: %s", rec.topic, rec.partition, rec.offset, exc)
        dlt = self.retry.dlt_topic(self.topic)
        self._forwarder.send(rec, dlt, raw_forward_headers(rec, f"undecodable: {exc}"))
        return True

    def _decide_chunk(
        self,
        tp: TP,
        chunk: Sequence[tuple[Record, dict[str, str], Envelope]],
        done: int | None,
    ) -> int | None:
        """Guard a chunk and act on each answer in order; the new commit position."""
        if not chunk:
            return done
        (rec0, headers0, env0), *rest = chunk
        chunk = [(rec0, headers0, self._at_head(tp, env0)), *rest]
        batched = self._decide_batch is not None and len(chunk) > 1
        # the furthest a record's own transaction may store the position (kafka_offsets.offsets_in_db): not
        # past a copy still unconfirmed, nor past the chunk's start while any of a batch may yet fail
        pending = self._forwarder.first_pending(tp)
        chunk = [
            (rec, h, kafka_offsets.with_floor(env, rec0.offset if batched else rec.offset + 1, pending))
            for rec, h, env in chunk
        ]
        envs = [env for _, _, env in chunk]
        answers: list[object]
        if self._decide_batch is not None and batched:
            try:
                answers = list(self._decide_batch(envs))
            except Exception as exc:  # never commit past records whose answer we do not have
                log.exception("batch guard call raised for %d records of %s-%d", len(envs), *tp)
                answers = [exc] * len(envs)
        else:
            answers = [self._decide_safely(env) for env in envs]
        for (rec, headers, env), answer in zip(chunk, answers, strict=True):
            if not self._answer(tp, rec, headers, env, answer):
                return done
            done = rec.offset + 1
        return done

    def _decide_safely(self, env: Envelope) -> object:
        try:
            return self._decide(env)
        except Exception as exc:  # a bare handler's bug: retry it like a failure, never commit past it
            self.counts["handler_error"] += 1
            log.exception(
                "handler raised for %s at %s %d@%d",
                env.message_id,
                env.source_topic,
                env.queue_id,
                env.queue_offset,
            )
            return exc

    def _answer(
        self,
        tp: TP,
        rec: Record,
        headers: dict[str, str],
        env: Envelope,
        answer: object,
    ) -> bool:
        """Act on one answer (:func:`~reliable.adapters.kafka_steps.next_step`); ``False``: held here."""
        action = self._book.step(tp, answer, env, self.retry)
        if action.step is Step.HOLD:
            self._hold(tp, rec.offset, action.delay_s)
            return False
        if action.step is not Step.ACK:
            assert action.topic is not None
            wire = copy_headers(rec, headers, env, action, self.id_header, self.group)
            self._forwarder.send(rec, action.topic, wire)
        return True

    # --- pause, resume, commit ----------------------------------------------------------------------------

    def _hold(self, tp: TP, offset: int, delay_s: float) -> None:
        """Pause the partition and seek back to ``offset``: it is delivered again after ``delay_s``."""
        self.counts["held"] += 1
        part = TopicPartition(tp[0], tp[1], offset)
        self._consumer.pause([part])
        self._consumer.seek(part)
        self._paused[tp] = time.monotonic() + delay_s

    def _resume_due(self) -> None:
        now = time.monotonic()
        due = [tp for tp, at in self._paused.items() if at <= now]
        if due:
            self._consumer.resume([TopicPartition(t, p) for t, p in due])
            for tp in due:
                del self._paused[tp]

    def _settle(self, positions: dict[TP, int]) -> None:
        """Wait for the copies' delivery reports, then commit what is final (to the database first)."""
        for source, offset, error in self._forwarder.settle():
            log.error("copy of %s-%d@%d failed (%s): not committed, redelivered", *source, offset, error)
            if positions.get(source, offset + 1) > offset:
                positions[source] = offset
                self._hold(source, offset, self.retry.delays_s[0] if self.retry.delays_s else 1.0)
        if not positions:
            return
        if self.db_offsets:
            kafka_offsets.record_engine(self.rel.engine, self.group, positions)
        self._commit_to_kafka([TopicPartition(t, p, o) for (t, p), o in positions.items()])

    def _commit_to_kafka(self, offsets: list[TopicPartition]) -> None:
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # the records are final; at worst they replay as suppressed duplicates
            log.warning("offset commit failed (%s); those records may be delivered again", exc)

    # --- rebalance ------------------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = {(p.topic, p.partition) for p in partitions}
        if self.db_offsets:
            stored = kafka_offsets.load(self.rel.engine, self.group, {p.topic for p in partitions})
            for p in partitions:
                at = stored.get((p.topic, p.partition))
                if at is not None:
                    p.offset = at
            consumer.assign(partitions)
        # librdkafka keeps a partition's pause across a revoke and a new assignment, while the revoke made us
        # forget why it was paused: left alone, a partition held at a rebalance would never flow again here.
        # Assigned afresh, it starts from its committed offset, so a held record is simply delivered again.
        fresh = [p for p in partitions if (p.topic, p.partition) not in self._paused]
        if fresh:
            consumer.resume(fresh)
        log.info("%s assigned %s", self.group, sorted((p.topic, p.partition, p.offset) for p in partitions))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("%s revoked %s", self.group, sorted((p.topic, p.partition) for p in partitions))
        revoked = [(p.topic, p.partition) for p in partitions]
        self.assigned.difference_update(revoked)
        self._forget(revoked)
