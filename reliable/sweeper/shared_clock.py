"""The sweepers' shared clock: the database server's time, read once a round.

Why: a claim (:mod:`reliable.sweeper.claim`) moves its rows' ``resend_at`` to ``until`` — the claiming
sweeper's now plus the claim window — and every other sweeper's selection compares ``resend_at`` with *its
own* now. Two hosts whose clocks differ by the claim's last fifth (60 s with the default 5-minute window)
re-claim each other's rows while the first still sends them: a whole batch sent twice, and each row's
budget spent twice (found by the review of 2026-11-29: 90 s of skew, every row of a batch twice). NTP keeps
hosts far closer than that, but a VM resumed from a snapshot, a container on a host whose time daemon died
or a laptop running a sweeper against production does not. The database is the one thing every sweeper
shares, so by default a sweeper runs its rounds on the database's clock: :meth:`DatabaseClock.sync` reads
it once a round (one statement), and the time after that is the reading plus the local monotonic time
since — never the host's wall clock.

SQLite runs inside the sweeper's process: its clock is the host's (a file shared between hosts is not a
deployment SQLite supports), so there is nothing to read.

The host's own clock is still compared with the database's at each sync: an offset above
:data:`SKEW_WARNING_S` is logged at WARNING (once an hour), because the guards on that host write their
journal's timestamps with it and the sweeper's age rules (``stuck_after``) read them.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine, text

from reliable.models import utcnow

log = logging.getLogger("reliable.sweeper")

#: an offset between this host's clock and the database's worth a WARNING (seconds)
SKEW_WARNING_S = 5.0
#: how often that WARNING may repeat (seconds)
_WARN_EVERY_S = 3600.0

_NOW_SQL = {
    "postgresql": "SELECT clock_timestamp()",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
    "mariadb": "SELECT UTC_TIMESTAMP(6)",
}


class DatabaseClock:
    """A clock callable (``() -> aware datetime``) that tells the database server's time.

    ``wall`` is the host's clock — used only on SQLite, and to warn about an offset. ``monotonic`` measures
    the time since the last :meth:`sync`. Before the first sync the clock syncs itself.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        wall: Callable[[], dt.datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.wall = wall
        self.monotonic = monotonic
        self._sql = _NOW_SQL.get(engine.dialect.name)
        self._base: dt.datetime | None = None
        self._at = 0.0
        self._warned_at: float | None = None
        #: the database's clock minus this host's at the last sync (seconds)
        self.offset_s = 0.0

    def sync(self) -> None:
        """Read the database's time (one statement; on SQLite nothing)."""
        if self._sql is None:
            return
        before = self.monotonic()
        with self.engine.connect() as conn:
            value = conn.execute(text(self._sql)).scalar_one()
        after = self.monotonic()
        if not isinstance(value, dt.datetime):
            raise TypeError(f"the database answered {value!r} for its time")
        read = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)  # UTC_TIMESTAMP is UTC
        self._base, self._at = read.astimezone(dt.UTC), (before + after) / 2
        self.offset_s = (self._base - self.wall()).total_seconds() + (after - self._at)
        self._warn(after)

    def __call__(self) -> dt.datetime:
        if self._sql is None:
            return self.wall()
        if self._base is None:
            self.sync()
            assert self._base is not None
        return self._base + dt.timedelta(seconds=self.monotonic() - self._at)

    def _warn(self, now: float) -> None:
        if abs(self.offset_s) < SKEW_WARNING_S:
            return
        if self._warned_at is not None and now - self._warned_at < _WARN_EVERY_S:
            return
        self._warned_at = now
        log.warning(
            "this host's clock is %.1f s %s the database's: the sweeper runs on the database's clock, but "
            "the guards on this host date their deliveries with theirs (the stuck rule reads those dates)",
            abs(self.offset_s),
            "behind" if self.offset_s > 0 else "ahead of",
        )
