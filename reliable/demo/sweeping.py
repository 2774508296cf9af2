"""The demo's sweeper: one :class:`reliable.sweeper.Sweeper` round per interval on a thread of the demo,
with its round summaries added up for the run's summary (``sweeper`` in the JSON)."""

from __future__ import annotations

import logging
import threading

from reliable.demo import parts
from reliable.demo.progress import ProgressState
from reliable.facade import Reliability
from reliable.sender import Sender

log = logging.getLogger("reliable.demo")

#: the round counters the summary reports (successful resends only in ``resent``)
TOTALS = ("rounds", "failed_rounds", "resent", "send_failures", "stuck_recovered", "dead", "never_consumed")


class SweepLoop:
    def __init__(self, rel: Reliability, sender: Sender, interval_s: float, state: ProgressState) -> None:
        self.rel = rel
        self.sender = sender
        self.interval_s = interval_s
        self.state = state
        self.totals = dict.fromkeys(TOTALS, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sweeper", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        sweeper = parts.sweeper(self.rel, self.sender)  # the sender is also the broker probe
        while not self._stop.wait(self.interval_s):
            try:
                r = sweeper.run_once()
            except Exception as exc:  # a failed round (DB or broker down under chaos) is retried next time
                self.totals["failed_rounds"] += 1
                log.warning("sweep round failed: %s: %s", type(exc).__name__, exc)
                continue
            t = self.totals
            t["rounds"] += 1
            t["resent"] += r.resent
            t["send_failures"] += r.send_failures
            t["stuck_recovered"] += r.stuck_recovered
            t["dead"] += r.dead
            t["never_consumed"] += r.never_consumed
            self.state.resent = t["resent"]
