"""Reading the consumer guard's Redis leases, to tell a stuck row from one a live worker is processing.

The guard (DESIGN.md §2 step 2, :mod:`reliable.stores.lease`) holds ``lease_key(prefix, group, message_id)``
with the value ``processing:{owner}`` and a TTL of ``lease_ms`` while a handler runs, and ``done`` after its
commit. The sweeper only reads, and speaks the guard's vocabulary (:class:`reliable.stores.LeaseState`):

* ``HELD`` — a ``processing:`` key with time left: a worker is alive on it; the row is not re-sent and is
  looked at again when that lease runs out;
* ``DONE`` — the worker finished (if the row is still pending its confirmation was lost: a resend is the way
  out); no key at all reads the same way (``state=None``: nobody holds it);
* ``UNAVAILABLE`` — Redis did not answer: do not guess, postpone;
* ``DISABLED`` — no Redis configured (a database-only guard): nobody can hold a lease.

Every row the sweeper is about to re-send is looked at, received or not (:func:`defers_resend`). A worker
killed mid-handler journaled nothing (its work transaction died with it), so to the sweeper the group never
received the message; its copy is back on the broker (RabbitMQ requeues an unacknowledged delivery) or
re-read by the next owner of its queue, and its lease says so for ``lease_ms``. Until 2026-11-29 only stuck
rows were looked at: such a row was re-sent as ``TOO_OLD`` or ``OVERTAKEN`` (a later message consumed)
beside the copy in flight — one needless copy per killed delivery, a send of the group's budget each.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from reliable import constants as C
from reliable.redis_connect import REDIS_ERRORS, RedisClient
from reliable.stores import LeaseState
from reliable.stores.lease import lease_key
from reliable.sweeper.selection import Candidate


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

    A received row (stuck): while a worker holds it, or Redis cannot tell — as ever. But a key without a TTL
    (a Redis restored from a snapshot, a ``PERSIST``, a bug: the guard always sets one) holds it only until
    the message is ``patience`` old, counted from its stage (``created_at``): every copy re-sent meanwhile
    meets the key, is answered ``LEASE_CONFLICT`` and journaled, so a count from the newest delivery or copy
    would start again at each resend (the give-up ``max_sends`` times ``patience`` away). Past it the stuck
    verdict stands: a resend (the key still keeps it from being processed twice), or at the budget the
    give-up and its notice. Until 2026-11-29 such a row stayed PENDING for ever, seen only as ``lease_held``.

    A row never received: only while a lease is held (Redis down: sent as before, the guard absorbs a
    duplicate — an outage of Redis must not stop every resend), and only while its newest copy is younger
    than ``patience`` (``max_unconfirmed_age + stuck_after``): no lease of ours lives that long (a worker
    holds one for ``lease_ms``, and a redelivery taken meanwhile is journaled: the row is then received), so
    a key still held by then — written without a TTL, or re-taken by workers that die in the handler before
    journaling — gets the verdict's resend, or at the budget the give-up and its notice: it never keeps a row
    pending unseen."""
    if cand.stuck:
        return view.blocks_resend and not (view.endless and now - cand.created_at >= patience)
    sent = cand.last_sent_at or cand.created_at
    return view.state is LeaseState.HELD and now - sent < patience


def read_leases(
    client: RedisClient | None, prefix: str, keys: Sequence[tuple[str, str]], no_ttl_hold: dt.timedelta
) -> list[LeaseView]:
    """One view per ``(group, message_id)``, in order, from one pipelined round trip.

    ``client=None``: every view is ``DISABLED``. A Redis error makes every view ``UNAVAILABLE``; the caller
    postpones those rows rather than risk re-sending what a live worker holds. A ``processing`` key without
    a TTL (should not happen) is treated as held for ``no_ttl_hold``.
    """
    if not keys:
        return []
    if client is None:
        return [LeaseView(LeaseState.DISABLED) for _ in keys]
    pipe = client.pipeline(transaction=False)
    for group, message_id in keys:
        name = lease_key(prefix, group, message_id)
        pipe.get(name)
        pipe.pttl(name)
    try:
        replies = pipe.execute()
    except REDIS_ERRORS:
        return [LeaseView(LeaseState.UNAVAILABLE) for _ in keys]
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
        else:
            views.append(LeaseView(LeaseState.HELD, no_ttl_hold, endless=int(pttl) == -1))
    return views
