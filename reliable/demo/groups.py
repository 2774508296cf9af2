"""The demo's consumer groups: who they are and which business effect each one applies.

``reliable demo`` fans every order out to ``--groups N`` consumer groups on one topic (RocketMQ's normal
topology): the first is the ledger group (moves money, :mod:`.ledger`), the others are audit groups (one
audit row per order each, :mod:`.audit`). The producer stages every message for all of them
(``groups=[...]``), so each group has its own inbox row per message and must apply each order exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from reliable.demo import audit, ledger, stats
from reliable.demo.summary import GroupResult
from reliable.types import Envelope

LEDGER_GROUP = "demo_ledger"
AUDIT_GROUP = "demo_audit"
DEFAULT_GROUPS = 2


def group_names(n: int) -> list[str]:
    """``demo_ledger``, ``demo_audit``, ``demo_audit_2``, … (``n`` ≥ 1)."""
    if n < 1:
        raise ValueError(f"at least one consumer group, got {n}")
    return [LEDGER_GROUP] + [AUDIT_GROUP if i == 1 else f"{AUDIT_GROUP}_{i}" for i in range(1, n)]


def business_handler(group: str, worker: str) -> Callable[[Envelope, Session], None]:
    """The undecorated handler ``group`` runs behind its own ``@idempotent_consumer``."""
    if group == LEDGER_GROUP:
        return ledger.make_business_handler(worker)
    return audit.make_business_handler(group, worker)


def reset(engine: Engine, n_accounts: int) -> None:
    """(Re)create the demo's business tables: accounts and ledger, and the audit table."""
    ledger.reset(engine, n_accounts)
    audit.reset(engine)


class GroupCheck(Protocol):
    """What the verdict needs of one group: every produced order applied exactly once."""

    @property
    def ok(self) -> bool: ...
    @property
    def applied(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def double_applied(self) -> int: ...
    @property
    def lost_ids(self) -> tuple[str, ...]: ...
    @property
    def double_applied_ids(self) -> tuple[str, ...]: ...


def check(engine: Engine, group: str, order_ids: Sequence[str], n_accounts: int) -> GroupCheck:
    """The ledger invariant for the ledger group, the audit count for an audit group."""
    if group == LEDGER_GROUP:
        return ledger.check(engine, order_ids, n_accounts)
    return audit.check(engine, group, order_ids)


def results(
    engine: Engine,
    topic: str,
    groups: Sequence[str],
    snap: stats.Snapshot,
    order_ids: Sequence[str],
    n_accounts: int,
) -> dict[str, GroupResult]:
    """Each group's share of the run: its counters from ``snap``, its duplicate causes from the journal and
    its own exactly-once check against the produced ``order_ids``."""
    causes = stats.duplicate_causes(engine, topic)
    out: dict[str, GroupResult] = {}
    for name in groups:
        g = snap.group(name)
        found = check(engine, name, order_ids, n_accounts)
        out[name] = GroupResult(
            confirmed=g.confirmed,
            dead=g.dead,
            pending=g.pending,
            deliveries=g.deliveries,
            duplicates_delivered=g.duplicates_delivered,
            duplicates_suppressed=g.duplicates_suppressed,
            duplicate_causes=causes.get(name, {}),
            applied=found.applied,
            lost=found.lost,
            double_applied=found.double_applied,
            lost_ids=list(found.lost_ids),
            double_applied_ids=list(found.double_applied_ids),
            check_ok=found.ok,
        )
    return out
