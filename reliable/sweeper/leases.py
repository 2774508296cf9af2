"""Reading the consumer guard's Redis leases, to tell a stuck row from one a live worker is processing.

The guard (DESIGN.md §2 step 2, :mod:`reliable.stores.lease`) holds ``lease_key(prefix, group, message_id)``
with the value ``processing:{owner}`` and a TTL of ``lease_ms`` while a handler runs, and ``done`` after its
commit. The sweeper only reads, and speaks the guard's vocabulary (:class:`reliable.stores.LeaseState`):

* ``HELD`` — a ``processing:`` key with time left: a worker is alive on it; the row is not re-sent and is
  looked at again when that lease runs out;
* ``DONE`` — the worker finished (if the row is still pending its confirmation was lost: a resend is the way
  out); no key at all reads the same way (``state=None``: nobody holds it);
* ``UNAVAILABLE`` — Redis did not answer: do not guess, postpone (a stuck row: until the message is
  ``max_unconfirmed_age + stuck_after`` old, then re-sent on the guard's database check);
* ``DISABLED`` — no Redis configured (a database-only guard): nobody can hold a lease.

Every row the sweeper is about to re-send is looked at, received or not (:func:`defers_resend`). A worker
killed mid-handler journaled nothing (its work transaction died with it), so to the sweeper the group never
received the message; its copy is back on the broker (RabbitMQ requeues an unacknowledged delivery) or
re-read by the next owner of its queue, and its lease says so for ``lease_ms``. Until 2026-11-29 only stuck
rows were looked at: such a row was re-sent as ``TOO_OLD`` or ``OVERTAKEN`` (a later message consumed)
beside the copy in flight — one needless copy per killed delivery, a send of the group's budget each.

A round reads them once a batch through :class:`RoundLeases`, which leaves a Redis that failed a read alone
for ``SWEEP_LEASE_RETRY_AFTER_S``: a hung Redis costs a round one timeout an interval, not one a batch.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reliable import constants as C
from reliable.redis_connect import REDIS_ERRORS, RedisClient
from reliable.stores import LeaseState
from reliable.stores.lease import lease_key
from reliable.sweeper.selection import Candidate

log = logging.getLogger("reliable.sweeper")


@dataclass(frozen=True, slots=True)
class LeaseView:
    #: ``None``: no key (nobody holds it)
    state: LeaseState | None
    #: time left on a held lease (the row is postponed by this much); ``None`` otherwise.
    remaining: dt.timedelta | None = None
    #: a ``processing:`` key without a TTL: nothing will end it (the guard always sets one)
    endless: bool = False

    @property
    def blocks_resend(self) -> bool:
        """A live worker holds it, or Redis could not tell: leave the row alone for now."""
        return self.state in (LeaseState.HELD, LeaseState.UNAVAILABLE)


#: the view of a row nobody can be processing (no key, or no Redis)
FREE = LeaseView(None)


def defers_resend(view: LeaseView, cand: Candidate, *, now: dt.datetime, patience: dt.timedelta) -> bool:
    """Whether ``cand``, judged for a resend, waits for its lease instead (held until the lease's end).

    A received row (stuck): while a worker holds it, or Redis cannot tell. But a key without a TTL (a Redis
    restored from a snapshot, a ``PERSIST``, a bug: the guard always sets one), or a Redis that cannot be
    read, holds it only until the message is ``patience`` old, counted from its stage (``created_at``):
    every copy re-sent meanwhile meets the key, is answered ``LEASE_CONFLICT`` and journaled, so a count from
    the newest delivery or copy would start again at each resend (the give-up ``max_sends`` times
    ``patience`` away). Past it the stuck verdict stands: a resend, or at the budget the give-up and its
    notice. The resend is safe either way: the key keeps the copy from being processed twice, and with Redis
    down the guard decides on the database alone — the group's inbox row, locked by the work transaction,
    admits one delivery and answers the other ``DUPLICATE_CONFIRMED`` (tests/core/test_guard_faults.py,
    test_guard_concurrency.py). Until 2026-11-29 such a row stayed PENDING for ever, seen only as
    ``lease_held`` — and, through a Redis outage of any length, as ``lease_unknown``.

    A row never received: only while a lease is held (Redis down: sent as before, the guard absorbs a
    duplicate — an outage of Redis must not stop every resend), and only while its newest copy is younger
    than ``patience`` (``max_unconfirmed_age + stuck_after``): no lease of ours lives that long (a worker
    holds one for ``lease_ms``, and a redelivery taken meanwhile is journaled: the row is then received), so
    a key still held by then — written without a TTL, or re-taken by workers that die in the handler before
    journaling — gets the verdict's resend, or at the budget the give-up and its notice: it never keeps a row
    pending unseen."""
    if cand.stuck:
        unbounded = view.endless or view.state is LeaseState.UNAVAILABLE  # nothing tells when it ends
        return view.blocks_resend and not (unbounded and now - cand.created_at >= patience)
    sent = cand.last_sent_at or cand.created_at
    return view.state is LeaseState.HELD and now - sent < patience


def unknown(keys: Sequence[object]) -> list[LeaseView]:
    """Redis could not tell: one ``UNAVAILABLE`` view per key."""
    return [LeaseView(LeaseState.UNAVAILABLE) for _ in keys]


@dataclass
class RoundLeases:
    """A round's lease reads (one a batch): after a failed one, Redis is not asked again for
    ``SWEEP_LEASE_RETRY_AFTER_S`` (the sweeper's ``monotonic``) — the leases are unknown meanwhile.

    Why: with Redis hung (it accepts connections and never answers) every read waits for the socket timeout,
    and until 2026-11-29 each batch of a round paid one: a round of 10 000 due rows (20 batches) took 13.6 s,
    now 3.6 s (3000 rows: 3.8 s, now 1.0 s), every round while Redis hangs. The rows are judged as when Redis
    cannot tell (:func:`defers_resend`: stuck rows held, rows never received re-sent), which each read that
    timed out gave anyway; Redis back in a long round is asked again after the interval, and every round
    starts by asking it. The failure is logged once a round (the rows are counted as ``lease_unknown``); the
    guard's own breaker does the same (:mod:`reliable.stores.lease`).
    """

    client: RedisClient | None
    prefix: str
    no_ttl_hold: dt.timedelta
    monotonic: Callable[[], float] = time.monotonic
    #: when (``monotonic``) Redis is asked again after a failed read; ``None``: the last read answered
    quiet_until: float | None = None
    #: failed reads this round
    failures: int = 0
    #: whether the round's newest read answered (``False`` too while Redis is left alone); ``None``: Redis was
    #: not asked (nothing due, or no Redis)
    answered: bool | None = None

    def read(self, keys: Sequence[tuple[str, str]]) -> list[LeaseView]:
        """One view per ``(group, message_id)`` of ``keys``, in order, from one pipelined round trip —
        unless a read failed less than the interval ago. No client: every view ``DISABLED``; a Redis
        error: every view ``UNAVAILABLE`` (the caller postpones those rows rather than risk re-sending what
        a live worker holds); a ``processing`` key without a TTL is held for ``no_ttl_hold``."""
        if not keys or self.client is None:
            return _read(self.client, self.prefix, keys, self.no_ttl_hold)
        if self.quiet_until is not None and self.monotonic() < self.quiet_until:
            return unknown(keys)
        try:
            views = _read(self.client, self.prefix, keys, self.no_ttl_hold)
        except REDIS_ERRORS as exc:
            self.answered = False
            self.failures += 1
            self.quiet_until = self.monotonic() + C.SWEEP_LEASE_RETRY_AFTER_S
            if self.failures == 1:
                log.warning(
                    "Redis lease read failed (%s: %s): leases are unknown until Redis is asked again in %g s "
                    "(stuck rows held, rows never received re-sent as without Redis); said once a round",
                    type(exc).__name__,
                    exc,
                    C.SWEEP_LEASE_RETRY_AFTER_S,
                )
            return unknown(keys)
        self.quiet_until = None
        self.answered = True
        return views


def _read(
    client: RedisClient | None, prefix: str, keys: Sequence[tuple[str, str]], no_ttl_hold: dt.timedelta
) -> list[LeaseView]:
    """The views of :meth:`RoundLeases.read`; a Redis error is raised."""
    if not keys:
        return []
    if client is None:
        return [LeaseView(LeaseState.DISABLED) for _ in keys]
    pipe = client.pipeline(transaction=False)
    for group, message_id in keys:
        name = lease_key(prefix, group, message_id)
        pipe.get(name)
        pipe.pttl(name)
    replies = pipe.execute()
    views: list[LeaseView] = []
    processing = C.LEASE_PROCESSING_PREFIX.encode()
    for i in range(len(keys)):
        value, pttl = replies[2 * i], replies[2 * i + 1]
        raw = value.encode() if isinstance(value, str) else value
        if raw is None:
            views.append(FREE)
        elif not raw.startswith(processing):
            views.append(LeaseView(LeaseState.DONE))
        elif pttl is not None and int(pttl) > 0:
            views.append(LeaseView(LeaseState.HELD, dt.timedelta(milliseconds=int(pttl))))
        elif pttl is not None and int(pttl) == -2:  # expired between GET and PTTL
            views.append(FREE)
        else:  # -1: no TTL (a Redis restored from a snapshot, a PERSIST): nothing ends it
            endless = pttl is not None and int(pttl) == -1
            views.append(LeaseView(LeaseState.HELD, no_ttl_hold, endless=endless))
    return views
