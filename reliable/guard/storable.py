"""What a delivery carries that no column can: found before any statement, so dead-lettered, not retried.

A database refuses (or, worse, changes) some values a broker hands over: PostgreSQL cuts a text at a NUL
once its statements are prepared — ``k\\x00A`` would be stored, and confirmed, as ``k``, and a later message
``k`` answered as its duplicate, never run —, and refuses it on a fresh connection, as every database
refuses an integer wider than its column. Reported as an error of the statement, either would make the
guard answer "database unavailable" for ever: a poison delivery redelivered without end, blocking the queue
or partition behind it. Here such a delivery is bad input instead (``bad_message``, dead-lettered with the
reason), and its journal row gets values the columns can hold (:func:`storable`), so the reason is kept.

``reconsume_times`` is only the broker's count of earlier attempts (a forged ``x-delivery-count`` or retry
header can carry anything): it is clamped to its column, not refused.
"""

from __future__ import annotations

from dataclasses import replace

from reliable.names import text_fault
from reliable.types import Envelope

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    return min(max(value, bounds[0]), bounds[1])


def _position_fault(env: Envelope) -> str | None:
    if _clamp(env.queue_id, INT32) != env.queue_id:
        return f"queue id {env.queue_id} does not fit a 32-bit column"
    if _clamp(env.queue_offset, INT64) != env.queue_offset:
        return f"queue offset {env.queue_offset} does not fit a 64-bit column"
    return None


def unfit(env: Envelope) -> str | None:
    """Why a column cannot hold this delivery (``None``: every value fits)."""
    for name, value in (
        ("message id", env.message_id or ""),
        ("topic", env.topic),
        ("delivered topic", env.source_topic),
        ("broker name", env.broker_name),
    ):
        fault = text_fault(name, value)
        if fault is not None:
            return fault
    return _position_fault(env)


def printable(value: str) -> str:
    """``value`` with NULs and lone surrogates written as escapes (what the journal keeps of a bad text)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def storable(env: Envelope) -> Envelope:
    """The delivery as its journal row can hold it: texts escaped, an impossible position journaled at
    offset ``-1`` (it cannot raise a watermark), the attempt count clamped."""
    fits = _position_fault(env) is None
    return replace(
        env,
        message_id=None if env.message_id is None else printable(env.message_id),
        topic=printable(env.topic),
        delivered_topic=None if env.delivered_topic is None else printable(env.delivered_topic),
        broker_name=printable(env.broker_name),
        queue_id=_clamp(env.queue_id, INT32),
        queue_offset=env.queue_offset if fits else -1,
        reconsume_times=clamped_attempts(env.reconsume_times),
    )


def clamped_attempts(reconsume_times: int) -> int:
    """The broker's attempt count as its column holds it (never below 0)."""
    return _clamp(reconsume_times, (0, INT32[1]))
