"""Stops the after-commit sends from stalling their caller while the broker hangs.

Why: a message staged with ``send_on_commit`` (or by a guarded handler) is sent right after its commit, on
the caller's thread — a consumer loop or a request handler. A broker that is refused answers at once, but one
that hangs (a partition, a black-holed address, a broker stuck flushing) makes each send wait for the
sender's timeout: a consumer that stages one follow-up per message then handles one message per timeout. The
stub is committed either way and the sweeper sends what was not, so after one send that failed *slowly* the
after-commit sends are deferred to the sweeper for ``retry_after_s``; the first one after that is tried again
(one timeout per interval, not one per message). A failure that came fast (a refused connection, a message the
broker rejects) costs its caller nothing and trips nothing. Explicit calls of ``send_staged`` are never
deferred: their caller asked for the attempt and its result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from reliable import constants as C

log = logging.getLogger("reliable.producer")


class SendBreaker:
    """Open for ``retry_after_s`` after a send that failed in ``slow_s`` or more; thread-safe."""

    def __init__(
        self,
        slow_s: float = C.SLOW_BROKER_CALL_S,
        retry_after_s: float = C.PRODUCER_SEND_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slow_s = slow_s
        self.retry_after_s = retry_after_s
        self.clock = clock
        self._open_until = 0.0
        self._lock = threading.Lock()

    def open(self) -> bool:
        """Whether after-commit sends are to be deferred to the sweeper now."""
        return self._open_until > 0.0 and self.clock() < self._open_until

    def record(self, started: float, ok: bool) -> None:
        """One send that began at ``started`` (this breaker's clock) ended, accepted or not."""
        if ok:
            self._open_until = 0.0
            return
        took = self.clock() - started
        if took < self.slow_s:
            return
        with self._lock:
            first = not self.open()
            self._open_until = self.clock() + self.retry_after_s
        if first:
            log.warning(
                "a send failed after %.1f s: after-commit sends are left to the sweeper for %.0f s",
                took,
                self.retry_after_s,
            )
