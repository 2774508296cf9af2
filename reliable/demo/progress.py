"""The live display: produced / consumed / duplicates suppressed / resent / dead / lag, twice a second.

It reads the same tables everyone else reads (never counters inside the consumer processes, which die on
purpose under ``--chaos``), so what it shows is what a DBA would see. Without a terminal (``--json``, CI logs)
it stays silent and the final summary is the only output.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from reliable.demo.stats import Snapshot


@dataclass
class ProgressState:
    """What the runner knows beyond the tables: how far production is, and the chaos log."""

    total: int
    produced: int = 0
    applied: int = 0
    consumers: int = 0
    faults_fired: int = 0
    last_fault: str = ""
    lag: int | None = None
    resent: int = 0
    phase: str = "starting"


def render(state: ProgressState, snap: Snapshot, elapsed_s: float) -> Group:
    """One frame of the display."""
    bar = ProgressBar(total=max(1, state.total), completed=snap.settled, width=30)
    t = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
    for col in ("produced", "consumed", "dup-suppr", "resent", "dead", "pending", "lag", "consumers"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_row(
        str(state.produced),
        str(state.applied),
        str(snap.duplicates_suppressed),
        str(state.resent),
        str(snap.dead),
        str(snap.pending),
        "-" if state.lag is None else str(state.lag),
        str(state.consumers),
    )
    head = Table.grid(padding=(0, 1))
    head.add_row(
        f"[bold]reliable demo[/] {state.phase}", bar, f"{snap.settled}/{state.total}", f"{elapsed_s:5.1f}s"
    )
    parts: list[Table | str] = [head, t]
    if state.last_fault:
        parts.append(f"[yellow]chaos[/] ({state.faults_fired} fired) last: {state.last_fault}")
    return Group(*parts)


class LiveProgress:
    """Refreshes :func:`render` on a thread while the run lasts (no-op when ``enabled`` is False)."""

    def __init__(
        self,
        console: Console,
        state: ProgressState,
        snapshot: Callable[[], Snapshot],
        enabled: bool,
        interval_s: float = 0.5,
    ) -> None:
        self.console = console
        self.state = state
        self.snapshot = snapshot
        self.enabled = enabled
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    def __enter__(self) -> LiveProgress:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _frame(self) -> Group:
        return render(self.state, self.snapshot(), time.monotonic() - self._t0)

    def _run(self) -> None:
        with Live(self._frame(), console=self.console, refresh_per_second=4, transient=False) as live:
            while not self._stop.wait(self.interval_s):
                try:
                    live.update(self._frame())
                except Exception as exc:  # a display hiccup (DB briefly down under chaos) is not fatal
                    live.update(f"[dim]progress unavailable: {type(exc).__name__}[/]")
            live.update(self._frame())
