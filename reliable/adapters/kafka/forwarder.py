"""Copies of records on their way to a retry topic or the dead-letter topic, and whether they landed.

The consumer loop may commit a record's offset only once its copy is stored, so copies are produced as the
batch is answered and :meth:`Forwarder.settle` waits for their delivery reports before the commit, returning
the source positions whose copy failed (those are not committed and run again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from reliable.adapters.kafka_common import Record

TP = tuple[str, int]


@dataclass
class _Copy:
    source: TP
    offset: int
    error: KafkaError | None = None
    done: bool = False


class Forwarder:
    """One producer for the copies of one consumer loop (not thread-safe, like the loop)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._producer = Producer(dict(config))
        self._pending: list[_Copy] = []

    def send(self, rec: Record, topic: str, headers: Sequence[tuple[str, str | bytes | None]]) -> None:
        """Produce a copy of ``rec`` (its key and value) to ``topic`` with ``headers``."""
        copy = _Copy((rec.topic, rec.partition), rec.offset)
        self._pending.append(copy)

        def report(err: KafkaError | None, _msg: Message) -> None:
            copy.error, copy.done = err, True

        try:
            self._producer.produce(
                topic, key=rec.key, value=rec.value, headers=list(headers), on_delivery=report
            )
        except (KafkaException, BufferError) as exc:
            copy.error, copy.done = KafkaError(KafkaError._FAIL, str(exc)), True

    def first_pending(self, source: TP) -> int | None:
        """The lowest offset of ``source`` whose copy :meth:`settle` has not confirmed (``None``: none)."""
        return min((c.offset for c in self._pending if c.source == source), default=None)

    def settle(self, timeout_s: float = 30.0) -> list[tuple[TP, int, str]]:
        """Wait for every pending copy; the ``(source partition, offset, error)`` of those that failed."""
        pending, self._pending = self._pending, []
        if pending:
            self._producer.flush(timeout_s)
        return [
            (c.source, c.offset, str(c.error) if c.error is not None else "no delivery report")
            for c in pending
            if c.error is not None or not c.done
        ]

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)
