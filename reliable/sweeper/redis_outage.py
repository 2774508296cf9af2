"""Since when the sweepers' Redis lease reads have failed — kept in the database, said past ``stuck_after``.

While Redis cannot be read every stuck row is held (``lease_unknown``) until its message is
``max_unconfirmed_age + stuck_after`` old (:func:`reliable.sweeper.leases.defers_resend`), and the guard runs
on the database alone: an outage of a day is a day of stuck messages recovered late. So a read failing for
longer than ``stuck_after`` is said: the gauge ``reliable_sweeper_redis_unreadable_seconds`` (how long; 0
once a read answers), one ERROR a round, and ONE notice per outage to a person through the notice channels
(kind ``REDIS_UNREADABLE``, :mod:`.notices`).

Why in the database: until 2026-11-30 the outage's start lived in the sweeper process, so a sweeper run
once a round by cron (``reliable sweep --once``, a documented way to run it) began from zero every run —
Redis could be down for days with the gauge at 0, no ERROR, nobody told. The outage is now an **episode**,
one row of the notice table on the ``log`` channel under its own key (``C.REDIS_OUTAGE_KEY``), the way a
stalled group's is (:mod:`.stall`), shared by every sweeper and every run, long-running or not:

* a round whose lease read failed opens it, unless one is open: ``REDIS_WATCH since=…`` — *watching*, told
  to nobody (:func:`reliable.sweeper.owed.owe` skips it), its start the round's time;
* a round that finds it open for ``stuck_after`` or more (its own ``stuck_after``) turns it into the notice,
  ``REDIS_UNREADABLE since=…`` (one ``UPDATE`` from the watching row: of two sweepers, one tells), which
  every sweeper then owes on its channels;
* a round whose read answered ends it: an INFO line, its rows deleted but the ones a channel still owes,
  which are delivered anyway saying when it ended (as a stall's are). A later outage is a new episode.

A round that did not ask Redis (nothing due, no Redis configured) changes nothing. The time is the round's
(by default the database's: every sweeper reads one clock). Sweepers that disagree — one host cut off from a
Redis the others read — end each other's episode: the one that cannot read starts again from its next failure.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from reliable import constants as C
from reliable.sweeper import metrics
from reliable.sweeper.leases import RoundLeases
from reliable.sweeper.notices import RedisPhase, parse_redis, redis_reason
from reliable.sweeper.owed import delete_rows, told_rows
from reliable.sweeper.selection import notif

log = logging.getLogger("reliable.sweeper")

_KEY = (C.REDIS_OUTAGE_KEY, C.REDIS_OUTAGE_GROUP)
_MINE = and_(notif.c.message_id == C.REDIS_OUTAGE_KEY, notif.c.consumer_group == C.REDIS_OUTAGE_GROUP)
_EPISODE = and_(_MINE, notif.c.channel == C.NOTIFY_CHANNEL_LOG)


@dataclass(frozen=True, slots=True)
class Outage:
    """An open episode: since when Redis has been unreadable, and whether a person was told."""

    since: dt.datetime
    told: bool


def current(conn: Connection) -> Outage | None:
    """The open episode, or ``None`` (a plain read)."""
    row = conn.execute(select(notif.c.reason, notif.c.created_at).where(_EPISODE)).first()
    if row is None:
        return None
    parsed = parse_redis(row.reason)
    if parsed is None:  # not written by a sweeper (a person edited it): watched, from when it was written
        return Outage(row.created_at, told=False)
    phase, since = parsed
    return Outage(since if since is not None else row.created_at, told=phase is RedisPhase.TOLD)


def begin(engine: Engine, now: dt.datetime) -> Outage:
    """The open episode; one opened at ``now`` when there is none (another sweeper's, if it opened one
    meanwhile)."""
    with engine.begin() as conn:
        found = current(conn)
    if found is not None:
        return found
    reason = redis_reason(
        RedisPhase.WATCHING, now, "the sweeper's Redis lease reads fail; told once they fail for stuck_after"
    )
    row = told_rows([_KEY], [reason], now)  # the episode row is written delivered, as every log row is
    try:
        with engine.begin() as conn:
            conn.execute(insert(notif), row)
    except IntegrityError:  # another sweeper opened it at the same time
        with engine.begin() as conn:
            other = current(conn)
        if other is not None:
            return other
        raise
    return Outage(now, told=False)


def tell(engine: Engine, outage: Outage, now: dt.datetime, threshold: dt.timedelta, held: int) -> bool:
    """Turn the watched episode into the notice; ``False`` when another sweeper told it, or ended it."""
    text = (
        f"the resend sweeper has not been able to read Redis (the consumer guard's leases) since "
        f"{outage.since.isoformat()}, {now - outage.since} as of {now.isoformat()} — longer than stuck_after "
        f"({threshold}). Stuck rows are held as lease_unknown ({held} in the round that told this) until "
        "their message is max_unconfirmed_age + stuck_after old, then re-sent (the guard's database check "
        "absorbs a duplicate); the consumers' guard decides on the database alone meanwhile. Restore Redis "
        "(the server, the network, the sweeper's --redis URL or password); this clears at the first read "
        "that answers."
    )
    watched = notif.c.reason.startswith(f"{RedisPhase.WATCHING.value} ", autoescape=True)
    with engine.begin() as conn:
        # an earlier outage's rows on the channels (delivered, or still owed saying it cleared) would keep
        # this one from being owed there: this notice replaces them, as a stall's does
        leftovers = conn.execute(
            select(notif.c.channel).where(_MINE, notif.c.channel != C.NOTIFY_CHANNEL_LOG)
        ).scalars()
        delete_rows(conn, [(*_KEY, channel) for channel in leftovers])
        done = conn.execute(
            update(notif)
            .where(_EPISODE, watched)
            .values(reason=redis_reason(RedisPhase.TOLD, outage.since, text), created_at=now, notified_at=now)
        )
    return done.rowcount == 1


def end(engine: Engine, now: dt.datetime) -> Outage | None:
    """End the open episode, if any (returned): its rows go, but the ones a channel still owes, which say
    when it ended."""
    with engine.begin() as conn:
        found = current(conn)
        if found is None:
            return None
        if found.told:  # an outage only watched owes nothing (what is owed is an earlier one's, said already)
            cleared = f" Cleared at {now.isoformat()}: the sweeper's Redis lease reads answer again."
            owed = and_(_MINE, notif.c.notified_at.is_(None))
            conn.execute(update(notif).where(owed).values(reason=notif.c.reason + cleared))
        conn.execute(delete(notif).where(_MINE, notif.c.notified_at.is_not(None)))
    return found


@dataclass
class UnreadableRedis:
    """A round's part in the outage episode (see the module doc): the gauge, the ERROR a round past
    ``threshold`` (``stuck_after``), the notice once an outage, the end."""

    engine: Engine
    threshold: dt.timedelta

    def after_round(self, leases: RoundLeases, now: dt.datetime, held: int) -> None:
        """Take a round's outcome (``held``: its rows counted ``lease_unknown``)."""
        if leases.answered is None:
            return
        if leases.answered:
            metrics.REDIS_UNREADABLE_SECONDS.set(0)
            ended = end(self.engine, now)
            if ended is not None:
                log.info(
                    "Redis lease reads answer again: unreadable since %s (%s)%s",
                    ended.since.isoformat(),
                    now - ended.since,
                    "; the notice sent for it stands, a later outage is told again" if ended.told else "",
                )
            return
        outage = begin(self.engine, now)
        down = max(now - outage.since, dt.timedelta(0))
        metrics.REDIS_UNREADABLE_SECONDS.set(down.total_seconds())
        if down < self.threshold:
            return
        told = not outage.told and tell(self.engine, outage, now, self.threshold, held)
        log.error(
            "Redis lease reads have failed for %s (since %s), longer than stuck_after (%s): %d stuck "
            "row(s) held as lease_unknown this round, each until its message is max_unconfirmed_age + "
            "stuck_after old (then re-sent, the guard's database check absorbing a duplicate); the "
            "guard runs on the database alone meanwhile — restore Redis%s",
            down,
            outage.since.isoformat(),
            self.threshold,
            held,
            " (a person is told: notice REDIS_UNREADABLE, once this outage)" if told else "",
        )
