"""The demo's result: one object, printed as a table for people and as JSON (``--json``) for scripts and CI.

The JSON keys are a stable schema (tests and docs/demo.md rely on them)::

    produced, groups{name: GroupResult}, confirmed, deliveries, duplicates_delivered, duplicates_suppressed,
    resent, dead, ledger_ok, lost, double_applied, faults{kind: count}, fault_log[...],
    duplicate_causes{cause: count}, report, reconciliation{...}|null, wall_time_s, ok, plus run details
    (mode, db, redis, seed, ...)

Every order is consumed by every group, so the counters are per group (``groups``); the top-level
``confirmed``, ``dead``, ``deliveries``, ``duplicates_*``, ``lost``, ``double_applied`` and
``duplicate_causes`` are sums over the groups (``confirmed`` counts (group, order) pairs). ``ok`` is what
decides the exit code: the ledger balances and *every* group applied every order exactly once.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from reliable.demo.chaos import FaultRecord


@dataclass
class GroupResult:
    """One consumer group's share of the run: its inbox rows, deliveries and its own exactly-once check."""

    confirmed: int = 0
    dead: int = 0
    pending: int = 0
    deliveries: int = 0
    duplicates_delivered: int = 0
    duplicates_suppressed: int = 0
    duplicate_causes: dict[str, int] = field(default_factory=dict)
    applied: int = 0
    lost: int = 0
    double_applied: int = 0
    lost_ids: list[str] = field(default_factory=list)
    double_applied_ids: list[str] = field(default_factory=list)
    #: the group's own invariant held (ledger: money conserved and balances = ledger; audit: the counts)
    check_ok: bool = False

    @property
    def ok(self) -> bool:
        return self.check_ok and self.lost == 0 and self.double_applied == 0


@dataclass
class DemoSummary:
    """Everything the demo reports about one run."""

    produced: int = 0
    groups: dict[str, GroupResult] = field(default_factory=dict)
    confirmed: int = 0
    deliveries: int = 0
    duplicates_delivered: int = 0
    duplicates_suppressed: int = 0
    #: copies the sweeper re-sent successfully (its round summaries); failed attempts are in ``sweeper``
    resent: int = 0
    #: ``sum(send_count - 1)`` over the stubs: every hand-over after the first, failed ones included
    send_attempts_beyond_first: int = 0
    sweeper: dict[str, int] = field(default_factory=dict)
    dead: int = 0
    pending: int = 0
    ledger_ok: bool = False
    lost: int = 0
    double_applied: int = 0
    total_balance_expected: int = 0
    total_balance_actual: int = 0
    lost_ids: list[str] = field(default_factory=list)
    double_applied_ids: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    faults_skipped: dict[str, int] = field(default_factory=dict)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    duplicate_causes: dict[str, int] = field(default_factory=dict)
    #: the broker's answers to the producer's sends, "group:STATUS" ("" group = one broker): on a
    #: SYNC_MASTER cluster whose slave is down, SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT (stored anyway)
    send_answers: dict[str, int] = field(default_factory=dict)
    report: str | None = None
    reconciliation: dict[str, Any] | None = None
    wall_time_s: float = 0.0
    #: start to "everything stopped and counted", i.e. without the Spark report
    pipeline_time_s: float = 0.0
    settled: bool = False
    mode: str = ""
    db: str = ""
    redis: str = ""
    messages: int = 0
    consumers: int = 0
    chaos: bool = False
    seed: int = 0
    workdir: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every order was produced and settled, the ledger balances, and every group applied every order
        exactly once (lost = 0 and double_applied = 0 per group)."""
        complete = self.produced == self.messages and self.settled and bool(self.groups)
        every_group = all(g.ok for g in self.groups.values())
        return complete and self.ledger_ok and every_group and self.lost == 0 and self.double_applied == 0

    def set_groups(self, groups: dict[str, GroupResult]) -> None:
        """Per-group results, and the top-level sums over them."""
        self.groups = dict(groups)
        results = list(groups.values())
        for name in ("confirmed", "dead", "pending", "deliveries", "duplicates_delivered"):
            setattr(self, name, sum(int(getattr(g, name)) for g in results))
        self.duplicates_suppressed = sum(g.duplicates_suppressed for g in results)
        self.lost = sum(g.lost for g in results)
        self.double_applied = sum(g.double_applied for g in results)
        causes: Counter[str] = Counter()
        for g in results:
            causes.update(g.duplicate_causes)
        self.duplicate_causes = dict(causes)
        self.lost_ids = [f"{n}:{i}" for n, g in groups.items() for i in g.lost_ids][:50]
        self.double_applied_ids = [f"{n}:{i}" for n, g in groups.items() for i in g.double_applied_ids][:50]

    def set_faults(self, records: list[FaultRecord]) -> None:
        injected = Counter(r.kind.value for r in records if r.injected)
        skipped = Counter(r.kind.value for r in records if not r.injected)
        self.faults = dict(sorted(injected.items()))
        self.faults_skipped = dict(sorted(skipped.items()))
        self.fault_log = [
            {
                "kind": r.kind.value,
                "at": r.at,
                "elapsed_s": r.elapsed_s,
                "injected": r.injected,
                "detail": r.detail,
            }
            for r in records
        ]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        for name, g in self.groups.items():
            data["groups"][name]["ok"] = g.ok
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def print_table(self, console: Console) -> None:
        """The human summary: the headline, the counters, and what went wrong if anything did."""
        verdict = "[bold green]OK[/]" if self.ok else "[bold red]FAILED[/]"
        console.print(
            f"\n{verdict}  {self.produced} orders × {len(self.groups)} groups, {self.consumers} consumers, "
            f"{'chaos seed ' + str(self.seed) if self.chaos else 'no chaos'}, {self.wall_time_s:.1f} s "
            f"({self.mode})"
        )
        t = Table(show_header=False, box=None, padding=(0, 2))
        rows: list[tuple[str, object]] = [
            ("produced", self.produced),
            ("resent by the sweeper", self.resent),
            ("ledger balances", self.ledger_ok),
        ]
        for name, g in self.groups.items():
            rows.append((f"[bold]{name}[/]", "[green]ok[/]" if g.ok else "[red]FAILED[/]"))
            rows += [
                ("  confirmed / dead", f"{g.confirmed} / {g.dead}"),
                ("  deliveries", g.deliveries),
                (
                    "  duplicates delivered / suppressed",
                    f"{g.duplicates_delivered} / {g.duplicates_suppressed}",
                ),
                ("  lost / applied twice", f"{g.lost} / {g.double_applied}"),
            ]
            causes = ", ".join(f"{c} {n}" for c, n in g.duplicate_causes.items() if n)
            if causes:
                rows.append(("  duplicate causes", causes))
        # the run's, not the last group's: not indented under it
        for kind, n in self.faults.items():
            rows.append((f"fault: {kind}", n))
        for kind, n in self.faults_skipped.items():
            rows.append((f"fault skipped: {kind}", n))
        for label, value in rows:
            t.add_row(label, str(value))
        console.print(t)
        if self.report:
            console.print(f"reconciliation report: [bold]{self.report}[/]")
        rec = (self.reconciliation or {}).get("totals")
        if rec:
            console.print(
                "reconciliation: "
                + ", ".join(
                    f"{k.replace('_', ' ')} {rec.get(k, 0)}"
                    for k in (
                        "inbox_rows",
                        "lost",
                        "stuck",
                        "dead",
                        "never_consumed_queues",
                        "duplicate_deliveries",
                    )
                )
            )
        for note in self.notes:
            console.print(f"note: {note}")
        if self.lost_ids:
            console.print(f"[red]lost (first {len(self.lost_ids)}):[/] {', '.join(self.lost_ids[:10])}")
        if self.double_applied_ids:
            console.print(f"[red]applied twice:[/] {', '.join(self.double_applied_ids[:10])}")
