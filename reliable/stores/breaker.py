"""The Redis circuit breaker shared by the sync and the asyncio lease stores.

Why: Redis is an optimisation. When it stops answering, every message paying a socket timeout would stall
consumption, so after one failure the stores skip Redis for ``retry_after_s`` (the guard continues on the
database alone) and try again after that: one timeout per interval, not one per message. Each fallback is
logged and reported through ``on_fallback`` (the guard counts it).

A failure that no waiting mends — a wrong password or user, a missing ACL permission, a database number the
server does not have — is logged once at ERROR as "redis misconfigured" instead of an outage warning every
interval: the guard still runs on the database alone, but an operator must see that Redis will never help.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis as redis_lib

from reliable import constants as C
from reliable.redis_connect import REDIS_OR_SOCKET_ERRORS

log = logging.getLogger(C.GUARD_LOGGER)

FallbackHook = Callable[[str, BaseException], None]

#: how a permanent error reads (a Sentinel client reports its sentinels' errors inside MasterNotFoundError)
_MISCONFIGURED = (
    "authentication",
    "wrongpass",
    "noauth",
    "noperm",
    "db index is out of range",
    "unknown command",
)


def misconfigured(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is set up wrong for us (it will fail the same way on every try)."""
    if isinstance(exc, (redis_lib.AuthenticationError, redis_lib.exceptions.NoPermissionError)):
        return True
    return isinstance(exc, redis_lib.RedisError) and any(m in str(exc).lower() for m in _MISCONFIGURED)


class RedisBreaker:
    """Open for ``retry_after_s`` after a failure; thread-safe (the sync store is shared by threads)."""

    def __init__(
        self,
        retry_after_s: float = C.DEFAULT_REDIS_RETRY_AFTER_S,
        on_fallback: FallbackHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_after_s = retry_after_s
        self.on_fallback = on_fallback
        self._clock = clock
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._misconfig_logged = False  # "redis misconfigured" said once until Redis answers again

    def open(self) -> bool:
        """Whether Redis is to be skipped now."""
        return self._down_until > 0.0 and self._clock() < self._down_until

    def skipped(self, operation: str) -> None:
        """Report a call not made because the breaker is open."""
        if self.on_fallback is not None:
            self.on_fallback(operation, ConnectionError("redis marked down (circuit open)"))

    def failed(self, operation: str, exc: BaseException) -> None:
        with self._lock:
            self._down_until = self._clock() + self.retry_after_s
        if not isinstance(exc, REDIS_OR_SOCKET_ERRORS):  # a client's own bug, not the server's absence
            log.error("redis client raised %s during %s", type(exc).__name__, operation, exc_info=exc)
        if not misconfigured(exc):
            log.warning("redis unavailable during %s, continuing on the database alone: %r", operation, exc)
        elif not self._misconfig_logged:
            self._misconfig_logged = True
            log.error("redis misconfigured, the guard runs on the database alone: %s", exc)
        else:
            log.debug("redis misconfigured during %s: %r", operation, exc)
        if self.on_fallback is not None:
            self.on_fallback(operation, exc)

    def succeeded(self) -> None:
        self._down_until = 0.0
        self._misconfig_logged = False
