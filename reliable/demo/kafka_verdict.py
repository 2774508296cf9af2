"""The Kafka demo's result: per consumer group, every order applied exactly once (and the ledger balances)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from sqlalchemy import func, select

from reliable.demo import groups as demo_groups
from reliable.demo import ledger
from reliable.demo.kafka_consumers import PARTITIONS, TOPIC
from reliable.facade import Reliability
from reliable.models import MessageLog
from reliable.types import LogOutcome

N_ACCOUNTS = 50


@dataclass
class KafkaDemoResult:
    produced: int = 0
    groups: dict[str, dict[str, int]] = field(default_factory=dict)
    duplicates_suppressed: int = 0
    resent: int = 0
    faults: list[str] = field(default_factory=list)
    ledger_ok: bool = False
    settled: bool = False
    wall_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.ledger_ok and all(
            g["lost"] == 0 and g["double_applied"] == 0 for g in self.groups.values()
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, sort_keys=True)

    def lines(self) -> list[str]:
        out = [f"produced {self.produced} orders to {TOPIC} ({PARTITIONS} partitions) on Tansu"]
        for g, c in self.groups.items():
            out.append(
                f"group {g}: applied {c['applied']}, lost {c['lost']}, applied twice {c['double_applied']}"
            )
        out += [
            f"duplicates suppressed by the guard: {self.duplicates_suppressed}",
            f"re-sent by the sweeper: {self.resent}",
            f"faults: {', '.join(self.faults) or 'none'}",
            f"ledger balanced: {self.ledger_ok}",
            f"verdict: {'OK' if self.ok else 'BROKEN'} in {self.wall_time_s:.1f}s",
        ]
        return out


def check(rel: Reliability, group: str, ids: list[str]) -> demo_groups.GroupCheck:
    """Every order applied once by ``group`` (and, for the ledger group, the ledger balances)."""
    return demo_groups.check(rel.engine, group, ids, N_ACCOUNTS)


def verdict(rel: Reliability, groups: list[str], orders: list[ledger.Order], result: KafkaDemoResult) -> None:
    """Fill ``result`` from the tables: what each group applied, lost and applied twice, and the ledger."""
    ids = [o.order_id for o in orders]
    result.ledger_ok = True
    for g in groups:
        c = check(rel, g, ids)
        result.groups[g] = {"applied": c.applied, "lost": c.lost, "double_applied": c.double_applied}
        result.ledger_ok = result.ledger_ok and c.ok
    with rel.engine.connect() as conn:
        result.duplicates_suppressed = int(
            conn.execute(select(func.count()).where(MessageLog.outcome == LogOutcome.DUPLICATE)).scalar_one()
        )
