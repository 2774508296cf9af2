"""Poll-with-timeout: the one way a test waits for what another thread, process or server does.

Why one helper: a sleep used as synchronisation passes or fails with the machine's speed, while a poll waits
exactly as long as the condition needs and, when it never holds, fails naming what it waited for. The
timeout only decides how long a failing test takes to say so, so the default is generous.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: how long a condition may take before the test fails (a passing test never waits this long)
TIMEOUT_S = 60.0


def wait_until(
    cond: Callable[[], T], timeout: float = TIMEOUT_S, what: str = "condition", *, interval: float = 0.01
) -> T:
    """Call ``cond`` every ``interval`` seconds until it returns something truthy, and return that; raise
    ``AssertionError`` naming ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


#: how many statements of other sessions of the test's own database wait on a row lock, asked from outside
#: (SQLite's wait cannot be seen). Only this database: each pytest process has a scratch database of its
#: own, and a count over the whole server saw the lock waits of other test processes and benchmarks on the
#: same server. A test that must know *which* session waits uses tests.lock_waits.
LOCK_WAITS = {
    "postgresql": (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ),
    # the statement in progress on the server (innodb_trx's LOCK WAIT lags behind, from a cache)
    "mysql": (
        "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
        "AND info LIKE 'UPDATE message_inbox%'"
    ),
}
