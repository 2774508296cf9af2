"""What the two Kafka consumer loops (confluent-kafka's :mod:`~reliable.adapters.kafka.consumer` and
aiokafka's :mod:`~reliable.adapters.kafka.aio`) set up and read alike, written once.

Both take the same settings (topic and its retry policy, poll size and wait, the id header and whether a
record's position may stand in for a missing id), call the handler's ``decide`` when it has one (a guard:
its answer carries the reason) and the handler itself otherwise, count answers in one
:class:`~reliable.adapters.kafka_steps.AnswerBook`, keep the partitions they hold back, read a record's
headers, due time and envelope the same way, and stop on the same condition. What differs — blocking or
awaited I/O, batching, offsets in the database — stays in each loop.

An undecodable record (a header that is not UTF-8, broken forwarding headers) has no envelope of its own,
so both loops give the guard a stand-in (:meth:`GuardedLoop._undecodable`) before its raw copy goes to the
dead-letter topic: the journal gets a ``DEAD_LETTER`` row at the delivered position, reason
``bad_message: undecodable: …``, and the reconciliation report counts it. Until 2026-11-28 such records left
no row at all. A database that cannot take the row holds the record, as for any outage.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from reliable import constants as C
from reliable.adapters.kafka_common import (
    Record,
    RetryPolicy,
    UndecodableRecord,
    decode_headers,
    due_in_s,
    forwarded_by_another_group,
    last_attempt,
    to_envelope,
)
from reliable.adapters.kafka_steps import AnswerBook, undecodable_envelope, unjournaled
from reliable.types import Envelope

#: the handler's type: a plain callable (confluent-kafka loop) or one returning an awaitable (aiokafka)
H = TypeVar("H", bound=Callable[[Envelope], Any])


TP = tuple[str, int]


class GuardedLoop(Generic[H]):
    """The settings and bookkeeping of a guarded Kafka consumer loop (the base of both flavours)."""

    def __init__(
        self,
        topic: str,
        group: str,
        handler: H,
        *,
        retry: RetryPolicy | None,
        batch_size: int,
        poll_s: float,
        id_header: str = C.KAFKA_ID_HEADER,
        allow_position_id: bool = True,
    ) -> None:
        self.topic = topic
        self.group = group
        self.handler = handler
        self.retry = retry or RetryPolicy()
        self.batch_size = batch_size
        self.poll_s = poll_s
        self.id_header = id_header
        self.allow_position_id = allow_position_id
        decide = getattr(handler, "decide", None)
        #: a guard (it journals); a bare handler has no journal and never sees an undecodable record
        self._guarded = callable(decide)
        self._decide: H = decide if callable(decide) else handler
        #: answers so far: success, duplicate, retry_topic, dead_letter, held, undecodable, handler_error
        self._book = AnswerBook()
        self.counts: Counter[str] = self._book.counts
        self._paused: dict[TP, float] = {}  # partition → monotonic time it may resume

    def _forget(self, tps: Iterable[TP]) -> None:
        """A rebalance took these partitions: their holds and their heads' failure counts are not ours any
        more (the next owner, or this member assigned them afresh, starts from the committed offset)."""
        for tp in tps:
            self._paused.pop(tp, None)
            self._book.failures.pop(tp, None)
            self._book.handler_failures.pop(tp, None)

    def _read(self, rec: Record) -> tuple[dict[str, str], float, Envelope | None]:
        """A record's decoded headers, how long until it is due (a retry copy), and its envelope once it
        is due (``None`` before). Raises :class:`~reliable.adapters.kafka_common.UndecodableRecord`."""
        headers = decode_headers(rec.headers)
        wait = due_in_s(rec, headers, self.retry)
        env = None if wait > 0 else self._envelope(rec)
        return headers, wait, env

    def _foreign(self, rec: Record, headers: dict[str, str]) -> bool:
        """Another group's retry copy (:func:`~reliable.adapters.kafka_common.forwarded_by_another_group`):
        counted, and committed past unhandled by the caller."""
        if not forwarded_by_another_group(rec, headers, self.group, self.retry):
            return False
        self.counts["foreign_retry"] += 1
        return True

    def _envelope(self, rec: Record) -> Envelope:
        env = to_envelope(rec, id_header=self.id_header, allow_position_id=self.allow_position_id)
        return last_attempt(env, self.retry)

    def _undecodable(self, rec: Record, exc: UndecodableRecord) -> Envelope | None:
        """The stand-in the guard journals an undecodable record as (:func:`undecodable_envelope`);
        ``None``: a bare handler."""
        return undecodable_envelope(rec, self.topic, exc) if self._guarded else None

    def _unjournaled_delay(self, tp: TP, answer: object) -> float | None:
        """After the guard's answer for an undecodable record's stand-in: ``None`` once its row is written,
        else how long to hold the record (the database is down, or the guard raised: never commit past a
        record the journal does not have)."""
        if not unjournaled(answer):
            self._book.failures.pop(tp, None)
            return None
        self._book.failures[tp] += 1
        delays = self.retry.delays_s or (1.0,)
        return delays[min(self._book.failures[tp], len(delays)) - 1]

    def _at_head(self, tp: TP, env: Envelope) -> Envelope:
        """``env``, the first record of ``tp`` about to be decided, marked as its last attempt by the handler
        failures it has had (blocking mode keeps the count per partition head)."""
        return last_attempt(env, self.retry, self._book.handler_failures[tp])


def deadline_of(timeout_s: float | None) -> float | None:
    """The monotonic time a ``run(timeout_s=…)`` ends at (``None``: never)."""
    return None if timeout_s is None else time.monotonic() + timeout_s


def run_outcome(until: Callable[[], bool] | None, deadline: float | None) -> bool | None:
    """Before each poll of ``run``: ``True`` once ``until()`` holds, ``False`` once the deadline has
    passed, ``None`` to poll again."""
    if until is not None and until():
        return True
    if deadline is not None and time.monotonic() >= deadline:
        return False
    return None
