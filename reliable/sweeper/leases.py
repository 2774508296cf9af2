"""Reading the consumer guard's Redis leases, to tell a stuck stub from one a live worker is processing.

The guard (DESIGN.md §2 step 2) holds ``LEASE_KEY_FORMAT`` = ``{prefix}:{group}:{message_id}`` with the value
``processing:{owner}`` and a TTL of ``lease_ms`` while a handler runs, and ``done`` after its commit. The
sweeper only reads: a ``processing:`` key with time left means a worker is alive on it, so the stuck stub is
not re-sent and is looked at again when that lease runs out. A ``done`` key is not a live lease (the
worker finished; if the stub is still pending its confirmation was lost and a resend is the way out).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from reliable import constants as C
from reliable.redis_connect import REDIS_ERRORS, RedisClient


class LeaseState(enum.Enum):
    FREE = "free"  # no key, or ``done``: nobody is processing it
    LIVE = "live"  # ``processing:`` with time left
    UNKNOWN = "unknown"  # Redis did not answer: do not guess


@dataclass(frozen=True, slots=True)
class LeaseView:
    state: LeaseState
    #: time left on a live lease (the stub is postponed by this much); ``None`` otherwise.
    remaining: dt.timedelta | None = None


def lease_key(prefix: str, group: str, message_id: str) -> str:
    return C.LEASE_KEY_FORMAT.format(prefix=prefix, group=group, message_id=message_id)


def read_leases(
    client: RedisClient | None, prefix: str, keys: Sequence[tuple[str, str]], no_ttl_hold: dt.timedelta
) -> list[LeaseView]:
    """One view per ``(group, message_id)``, in order, from one pipelined round trip.

    ``client=None`` (a database-only guard, no Redis configured): every lease is FREE — there is nothing a
    worker could hold. A Redis error makes every view UNKNOWN; the caller postpones those stubs rather than
    risk re-sending what a live worker holds. A ``processing`` key without a TTL (should not happen) is
    treated as live for ``no_ttl_hold``.
    """
    if not keys:
        return []
    if client is None:
        return [LeaseView(LeaseState.FREE) for _ in keys]
    pipe = client.pipeline(transaction=False)
    for group, message_id in keys:
        name = lease_key(prefix, group, message_id)
        pipe.get(name)
        pipe.pttl(name)
    try:
        replies = pipe.execute()
    except REDIS_ERRORS:
        return [LeaseView(LeaseState.UNKNOWN) for _ in keys]
    views: list[LeaseView] = []
    processing = C.LEASE_PROCESSING_PREFIX.encode()
    for i in range(len(keys)):
        value, pttl = replies[2 * i], replies[2 * i + 1]
        raw = value.encode() if isinstance(value, str) else value
        if raw is None or not raw.startswith(processing):
            views.append(LeaseView(LeaseState.FREE))
        elif pttl is not None and int(pttl) > 0:
            views.append(LeaseView(LeaseState.LIVE, dt.timedelta(milliseconds=int(pttl))))
        elif pttl is not None and int(pttl) == -2:  # expired between GET and PTTL
            views.append(LeaseView(LeaseState.FREE))
        else:
            views.append(LeaseView(LeaseState.LIVE, no_ttl_hold))
    return views
