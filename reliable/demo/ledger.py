"""The demo's business effect: money moved between accounts, and the invariant that proves exactly-once.

Each order says "move ``amount`` from account ``src`` to account ``dst``". The handler applies it through the
guard's ``session``, so the balance updates, the ledger row and the stub confirmation commit together. The
ledger deliberately has **no** unique constraint on ``order_id``: a double application must be *visible*
(two rows) rather than prevented by the schema, otherwise the demo would prove nothing about the guard.

Invariant checked at the end (:func:`check`):

* the total of all balances equals what it was at the start (money is moved, never created);
* every account's balance equals its opening balance plus what the ledger says came in minus what went out
  (the ledger and the balances agree, so no half-applied order);
* every produced order appears in the ledger exactly once: missing = ``lost``, more than once =
  ``double_applied``.

The two tables are the demo's own (``demo_account``, ``demo_ledger``), created in the same database as the
``reliable`` tables; :func:`reset` only ever drops these two.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from reliable.demo.errors import BadOrderError
from reliable.models import BigId, UTCDateTime, utcnow
from reliable.types import Envelope

demo_metadata = MetaData()

accounts = Table(
    "demo_account",
    demo_metadata,
    Column("account_id", Integer, primary_key=True, autoincrement=False),
    Column("balance", BigInteger, nullable=False),
)

ledger = Table(
    "demo_ledger",
    demo_metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("order_id", String(64), nullable=False, index=True),
    Column("src", Integer, nullable=False),
    Column("dst", Integer, nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("worker", String(64)),
    Column("applied_at", UTCDateTime, nullable=False),
)

OPENING_BALANCE = 1_000_000


@dataclass(frozen=True, slots=True)
class Order:
    """One transfer: the body of a demo message (JSON)."""

    order_id: str
    src: int
    dst: int
    amount: int

    def to_body(self) -> bytes:
        return json.dumps(
            {"order_id": self.order_id, "src": self.src, "dst": self.dst, "amount": self.amount},
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def from_body(cls, body: bytes) -> Order:
        """Parse a body; anything malformed is a :class:`BadOrderError` (the guard dead-letters it)."""
        try:
            data = json.loads(body)
            order = cls(str(data["order_id"]), int(data["src"]), int(data["dst"]), int(data["amount"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadOrderError(f"not a demo order: {exc}") from None
        if order.amount <= 0 or order.src == order.dst:
            raise BadOrderError(f"not a valid transfer: {order}")
        return order


def make_orders(run_id: str, count: int, n_accounts: int, seed: int) -> list[Order]:
    """``count`` random transfers between ``n_accounts`` accounts, the same for the same seed."""
    rng = random.Random(f"orders:{seed}")
    orders = []
    for i in range(count):
        src = rng.randrange(n_accounts)
        dst = (src + 1 + rng.randrange(n_accounts - 1)) % n_accounts
        orders.append(Order(f"{run_id}-{i:07d}", src, dst, rng.randint(1, 500)))
    return orders


def reset(engine: Engine, n_accounts: int) -> None:
    """(Re)create the demo's two tables and open ``n_accounts`` accounts. Touches no other table."""
    demo_metadata.drop_all(engine)
    demo_metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(accounts), [{"account_id": i, "balance": OPENING_BALANCE} for i in range(n_accounts)]
        )


def apply_order(session: Session, order: Order, worker: str) -> None:
    """Move the money and write the ledger row, inside the guard's transaction.

    Accounts are updated in id order so two concurrent transfers between the same pair cannot deadlock on
    PostgreSQL (row locks taken in the same order by everyone).
    """
    for account_id, delta in sorted(((order.src, -order.amount), (order.dst, order.amount))):
        session.execute(
            update(accounts)
            .where(accounts.c.account_id == account_id)
            .values(balance=accounts.c.balance + delta)
        )
    session.execute(
        insert(ledger).values(
            order_id=order.order_id,
            src=order.src,
            dst=order.dst,
            amount=order.amount,
            worker=worker,
            applied_at=utcnow(),
        )
    )


def make_business_handler(worker: str) -> Callable[[Envelope, Session], None]:
    """The undecorated handler ``handler(env, session)``: what the guard wraps."""

    def transfer(env: Envelope, session: Session) -> None:
        apply_order(session, Order.from_body(env.body), worker)

    transfer.__name__ = "transfer"
    return transfer


@dataclass(frozen=True, slots=True)
class ExactlyOnce:
    """How often each produced order was applied by one group: the part of every group's check that is the
    same (the ledger adds the money invariant)."""

    applied: int
    lost: int
    double_applied: int
    lost_ids: tuple[str, ...]
    double_applied_ids: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.double_applied == 0


def exactly_once(counts: Mapping[str, int], order_ids: Iterable[str], show: int = 50) -> ExactlyOnce:
    """``counts``: rows per order id of one group; ``order_ids``: the orders that were produced. Missing =
    lost, more than one row = applied twice (the first ``show`` ids of each are kept)."""
    wanted = list(order_ids)
    lost_ids = tuple(oid for oid in wanted if counts.get(oid, 0) == 0)
    double_ids = tuple(sorted(oid for oid, n in counts.items() if n > 1))
    return ExactlyOnce(
        applied=sum(1 for oid in wanted if counts.get(oid, 0) > 0),
        lost=len(lost_ids),
        double_applied=len(double_ids),
        lost_ids=lost_ids[:show],
        double_applied_ids=double_ids[:show],
    )


@dataclass(frozen=True, slots=True)
class LedgerCheck:
    """The outcome of the invariant check."""

    total_expected: int
    total_actual: int
    accounts_consistent: bool
    applied: int
    lost: int
    double_applied: int
    lost_ids: tuple[str, ...]
    double_applied_ids: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when money is conserved, balances match the ledger, and no order is missing or doubled."""
        return (
            self.total_expected == self.total_actual
            and self.accounts_consistent
            and self.lost == 0
            and self.double_applied == 0
        )


def applied_count(engine: Engine) -> int:
    """Distinct orders in the ledger (for the progress display)."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count(func.distinct(ledger.c.order_id)))).scalar_one())


def check(engine: Engine, order_ids: Iterable[str], n_accounts: int) -> LedgerCheck:
    """Check the invariant against the orders that were produced."""
    with engine.connect() as conn:
        total = int(conn.execute(select(func.coalesce(func.sum(accounts.c.balance), 0))).scalar_one())
        balances = {
            int(a): int(b) for a, b in conn.execute(select(accounts.c.account_id, accounts.c.balance))
        }
        counts = {
            str(oid): int(n)
            for oid, n in conn.execute(select(ledger.c.order_id, func.count()).group_by(ledger.c.order_id))
        }
        expected = dict.fromkeys(range(n_accounts), OPENING_BALANCE)
        for src, dst, amount in conn.execute(select(ledger.c.src, ledger.c.dst, ledger.c.amount)):
            expected[int(src)] -= int(amount)
            expected[int(dst)] += int(amount)
    return LedgerCheck(
        total_expected=n_accounts * OPENING_BALANCE,
        total_actual=total,
        accounts_consistent=balances == expected,
        **dataclasses.asdict(exactly_once(counts, order_ids)),
    )
