"""Stops the after-commit sends from stalling their caller while the broker hangs.

Why: a message staged with ``send_on_commit`` (or by a guarded handler) is sent right after its commit, on
the caller's thread — a consumer loop or a request handler. A broker that is refused answers at once, but one
that hangs (a partition, a black-holed address, a broker stuck flushing) makes each send wait for the
sender's timeout: a consumer that stages one follow-up per message then handles one message per timeout. The
stub is committed either way and the sweeper sends what was not, so after one send that failed *slowly* the
after-commit sends are deferred to the sweeper for ``retry_after_s``; after that *one* send is tried (the
trial) while the others stay deferred — with twenty consumer threads the interval's end would otherwise cost
twenty timeouts at once —, and its outcome closes the breaker or opens it for another interval. A failure that
came fast (a refused connection, a message the broker rejects) costs its caller nothing and trips nothing.
Explicit calls of ``send_staged`` are never deferred: their caller asked for the attempt and its result.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

from reliable import constants as C

log = logging.getLogger("reliable.producer")


class Pass(enum.Enum):
    """What :meth:`SendBreaker.admit` answers for one after-commit send."""

    SEND = "send"  # closed: send
    TRIAL = "trial"  # the interval is over and no trial is out: send, and report it with trial=True
    DEFER = "defer"  # open, or another send is the trial: leave the message to the sweeper


class SendBreaker:
    """Open for ``retry_after_s`` after a send that failed in ``slow_s`` or more, then one trial send;
    thread-safe."""

    def __init__(
        self,
        slow_s: float = C.SLOW_BROKER_CALL_S,
        retry_after_s: float = C.PRODUCER_SEND_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slow_s = slow_s
        self.retry_after_s = retry_after_s
        self.clock = clock
        self._open_until = 0.0  # 0.0: closed
        self._trial_until = 0.0  # a trial is out until then (a trial never reported frees the slot)
        self._lock = threading.Lock()

    def open(self) -> bool:
        """Whether the breaker has tripped and not closed since (deferring, or waiting for a trial)."""
        return self._open_until > 0.0

    def admit(self) -> Pass:
        """Whether one after-commit send may go now; a :attr:`Pass.TRIAL` is given to one caller at a time."""
        if self._open_until == 0.0:
            return Pass.SEND
        with self._lock:
            now = self.clock()
            if self._open_until == 0.0:
                return Pass.SEND
            if now < self._open_until or now < self._trial_until:
                return Pass.DEFER
            self._trial_until = now + self.retry_after_s
            return Pass.TRIAL

    def record(self, started: float, ok: bool, *, trial: bool = False) -> None:
        """One send that began at ``started`` (this breaker's clock) ended, accepted or not; ``trial``: it was
        the send :meth:`admit` let through as the trial."""
        took = self.clock() - started
        slow = not ok and took >= self.slow_s
        with self._lock:
            if trial:
                self._trial_until = 0.0
            if ok or (trial and not slow):  # a landed send, or a trial the broker answered at once
                self._open_until = 0.0
                return
            if not slow:
                return
            first = self._open_until == 0.0
            self._open_until = self.clock() + self.retry_after_s
        if first:
            log.warning(
                "a send failed after %.1f s: after-commit sends are left to the sweeper for %.0f s",
                took,
                self.retry_after_s,
            )
