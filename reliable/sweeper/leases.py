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
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import redis as redis_lib

from reliable import constants as C
from reliable.stores import LeaseState
from reliable.stores.lease import lease_key


@dataclass(frozen=True, slots=True)
class LeaseView:
    #: ``None``: no key (nobody holds it)
    state: LeaseState | None
    #: time left on a held lease (the row is postponed by this much); ``None`` otherwise.
    remaining: dt.timedelta | None = None

    @property
    def blocks_resend(self) -> bool:
        """A live worker holds it, or Redis could not tell: leave the row alone for now."""
        return self.state in (LeaseState.HELD, LeaseState.UNAVAILABLE)


#: the view of a row nobody can be processing (never delivered, or no Redis)
FREE = LeaseView(None)


def read_leases(
    client: redis_lib.Redis | None, prefix: str, keys: Sequence[tuple[str, str]], no_ttl_hold: dt.timedelta
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
    except redis_lib.RedisError:
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
            views.append(LeaseView(LeaseState.HELD, no_ttl_hold))
    return views
