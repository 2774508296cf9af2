"""Storage primitives of the consumer guard, one small interface per backend.

The guard (:mod:`reliable.guard`) is a state machine; everything it needs from the outside world is a handful
of primitives, in the spirit of AWS Powertools' idempotency persistence layers:

* :class:`reliable.stores.sql.SqlStore` — the source of truth: journal + watermark, the group's inbox row
  (lock, conditional confirm, insert), outcome updates. Each primitive is one or two pre-rendered statements
  so the hot path pays for round trips, not for an ORM.
* :class:`reliable.stores.lease.RedisLeaseStore` / :class:`reliable.stores.lease.NoLeaseStore` — the fast
  path: ``SET NX PX`` lease, ``done`` marker, compare-and-delete. Redis is an optimisation; every answer it
  gives that matters for correctness is re-checked in the database.

The value types below are what crosses that seam.
"""

from __future__ import annotations

import atexit
import datetime as dt
import enum
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from reliable.types import LogOutcome, StubStatus


class LeaseState(enum.Enum):
    """What the fast path learned about a message key."""

    ACQUIRED = "acquired"  # we set processing:{owner}; we must later mark done or compare-and-delete
    DONE = "done"  # a worker committed this message earlier (marker still within its TTL)
    HELD = "held"  # another worker holds a live processing lease
    UNAVAILABLE = "unavailable"  # Redis did not answer: the database alone decides
    DISABLED = "disabled"  # no Redis configured: the database alone decides


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """Result of one lease attempt. ``done_hash`` is the payload-hash tag stored with the done marker."""

    state: LeaseState
    done_hash: str | None = None


@dataclass(frozen=True, slots=True)
class InboxState:
    """The columns of one group's ``message_inbox`` row the guard decides on."""

    status: StubStatus
    payload_hash: str | None
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One ``message_log`` row to insert (``outcome`` ``None`` while the delivery is being processed).

    ``topic``/``queue_id``/``queue_offset``: the delivered position (``Envelope.source_topic``);
    ``original_topic``: the message's business topic (``Envelope.topic``); ``broker_name``: the broker group
    of the delivered queue (``Envelope.broker_name``), part of the watermark's key.
    """

    message_id: str
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    reconsume_times: int
    received_at: dt.datetime
    worker: str
    outcome: LogOutcome | None = None
    reason: str | None = None
    original_topic: str | None = None
    broker_name: str = ""


@dataclass(frozen=True, slots=True)
class OutcomeUpdate:
    """The final outcome of a journaled delivery."""

    log_id: int
    outcome: LogOutcome
    reason: str | None


@dataclass(frozen=True, slots=True)
class InboxRow:
    """A ``message_inbox`` row the guard writes itself (inbox pattern, no producer row): born CONFIRMED."""

    message_id: str
    payload_hash: str | None


def call_at_exit(method: Callable[[], object]) -> None:
    """Run the bound ``method`` at interpreter exit if its object is still alive then, without keeping it
    alive until then (a store's timer is a daemon thread, stopped without a word at exit: what it still
    buffers is sent by this call)."""
    atexit.register(_call_if_alive, weakref.WeakMethod(method))


def _call_if_alive(ref: weakref.WeakMethod[Callable[[], object]]) -> None:
    method = ref()
    if method is not None:
        method()
