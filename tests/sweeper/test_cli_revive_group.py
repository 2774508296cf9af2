"""``reliable stubs revive --group G --all-dead``: every DEAD row of one group back to PENDING, in batches.

After an outage the sweeper gives a group's rows up by the thousand, and reviving them meant naming every
message id. The bulk revive does what revive by id does to each row (a new budget, due at the next round,
the stub's status derived, that row's notices forgotten), a few statements per batch of
``DEFAULT_REVIVE_BATCH`` rows, one transaction per batch; other groups' rows are not touched. Without
``--group`` it refuses: reviving every group's dead rows by accident re-sends what nobody has fixed yet.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, insert, select

from reliable import Reliability
from reliable import constants as C
from reliable.cli import main
from reliable.models import utcnow
from reliable.sweeper.selection import inbox, notif, stub
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, add_inbox_without_stub, add_stub, get_inbox, get_stub

BATCH = C.DEFAULT_REVIVE_BATCH
#: more DEAD rows than two batches: the walk crosses two batch boundaries and ends on a short batch
N = 2 * BATCH + 1


def _mid(i: int) -> str:
    return f"d-{i:05d}"


def _seed_outage(rel: Reliability) -> None:
    """``N`` messages for billing and audit, billing's rows all DEAD with a notice owed; audit gave up on
    the even ones (a notice owed too) and confirmed the odd ones."""
    stubs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    notices: list[dict[str, Any]] = []
    for i in range(N):
        m = _mid(i)
        stubs.append({"message_id": m, "topic": "orders", "content": b"{}", "status": StubStatus.DEAD})
        audit = StubStatus.DEAD if i % 2 == 0 else StubStatus.CONFIRMED
        for group, status in (("billing", StubStatus.DEAD), ("audit", audit)):
            rows.append(
                {
                    "consumer_group": group,
                    "message_id": m,
                    "status": status,
                    "attempts": 4,
                    "resend_count": 7,
                    "resend_at": None,
                    "last_error": "DEAD: never received" if status is StubStatus.DEAD else None,
                }
            )
            if status is StubStatus.DEAD:
                notices.append(
                    {
                        "message_id": m,
                        "consumer_group": group,
                        "channel": "log",
                        "reason": "DEAD: never received",
                        "attempts": 1,
                        "created_at": T0,
                    }
                )
    with rel.engine.begin() as conn:
        conn.execute(insert(stub), stubs)
        conn.execute(insert(inbox), rows)
        conn.execute(insert(notif), notices)


def _count(rel: Reliability, group: str, status: StubStatus) -> int:
    with rel.engine.connect() as conn:
        q = select(func.count()).where(inbox.c.consumer_group == group, inbox.c.status == status)
        return int(conn.execute(q.select_from(inbox)).scalar_one())


def _notices(rel: Reliability, group: str) -> int:
    with rel.engine.connect() as conn:
        q = select(func.count()).where(notif.c.consumer_group == group)
        return int(conn.execute(q.select_from(notif)).scalar_one())


@pytest.fixture
def writes() -> Iterator[list[str]]:
    """Every ``UPDATE message_inbox`` and commit of every engine, in order, while the test runs."""
    seen: list[str] = []

    def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE MESSAGE_INBOX"):
            seen.append("update")

    def on_commit(conn: Any) -> None:
        seen.append("commit")

    event.listen(Engine, "before_cursor_execute", on_statement)
    event.listen(Engine, "commit", on_commit)
    yield seen
    event.remove(Engine, "before_cursor_execute", on_statement)
    event.remove(Engine, "commit", on_commit)


def test_all_dead_revives_every_dead_row_of_the_group_in_batches_and_no_other_groups(
    rel: Reliability, db_url: str, writes: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _seed_outage(rel)
    add_stub(rel, "p-1", resend_at=T0 + dt.timedelta(hours=1))  # billing, PENDING: not DEAD, left alone
    add_inbox_without_stub(rel, "q-orphan", status=StubStatus.DEAD)  # nothing to re-send: stays DEAD
    add_stub(rel, "z-audit", groups=["audit"], status=StubStatus.DEAD)  # another group's only: untouched
    before = utcnow()
    assert main(["stubs", "revive", "--group", "billing", "--all-dead", "--db", db_url]) == 0
    after = utcnow()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"revived {N} DEAD row(s) of group billing: PENDING, send budget reset, due at the next sweep round"
    )
    assert out[1].startswith("left 1 DEAD row(s) of group billing as they are: their stub is gone")
    assert len(out) == 2

    # bounded batches: one UPDATE of the inbox per batch of BATCH rows, each in a transaction of its own
    updates = [i for i, w in enumerate(writes) if w == "update"]
    assert len(updates) == 3, writes  # 500 + 500 + 1 (the orphan shares the last batch)
    assert all("commit" in writes[a:b] for a, b in itertools.pairwise(updates)), writes

    assert _count(rel, "billing", StubStatus.DEAD) == 1  # the orphan's
    assert _count(rel, "billing", StubStatus.PENDING) == N + 1  # with p-1
    for i in (0, BATCH - 1, BATCH, 2 * BATCH - 1, 2 * BATCH):  # either side of each boundary
        row = get_inbox(rel, _mid(i), "billing")
        assert (row.status, row.attempts, row.resend_count, row.last_error) == (
            StubStatus.PENDING,
            0,
            0,
            None,
        )
        assert row.resend_at is not None
        resend_at = row.resend_at.replace(tzinfo=dt.UTC) if row.resend_at.tzinfo is None else row.resend_at
        assert before - dt.timedelta(seconds=1) <= resend_at <= after + dt.timedelta(seconds=1)
        audit_gave_up = i % 2 == 0
        assert get_inbox(rel, _mid(i), "audit").status is (
            StubStatus.DEAD if audit_gave_up else StubStatus.CONFIRMED
        )
        # derived: a DEAD row outranks the PENDING one; with audit confirmed, billing is owed
        assert get_stub(rel, _mid(i)).status is (StubStatus.DEAD if audit_gave_up else StubStatus.PENDING)
    assert _count(rel, "audit", StubStatus.DEAD) == N // 2 + 1 + 1  # the even ones, and z-audit's
    assert get_inbox(rel, "p-1", "billing").resend_at is not None
    assert get_inbox(rel, "q-orphan", "billing").status is StubStatus.DEAD
    # the revived rows' notices are forgotten (a second death is reported again); audit's are still owed
    assert _notices(rel, "billing") == 0
    assert _notices(rel, "audit") == N // 2 + 1

    assert main(["stubs", "revive", "--group", "billing", "--all-dead", "--db", db_url]) == 0
    assert capsys.readouterr().out.startswith("revived 0 DEAD row(s) of group billing")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # every group's DEAD rows at once: what nobody has fixed yet would be re-sent
        (["--all-dead"], "--all-dead needs --group GROUP"),
        (["d-1", "--all-dead", "--group", "billing"], "give it no message ids"),
        ([], "name the message ids to revive"),
        (["--all-dead", "--group", "bilingg"], "no consumer group 'bilingg'"),  # a typo is not "0 rows"
    ],
    ids=["no-group", "ids-too", "nothing", "typo"],
)
def test_all_dead_refuses_without_a_group_in_one_line(
    rel: Reliability, db_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    add_stub(rel, "d-1", groups=["billing", "audit"], status=StubStatus.DEAD)
    assert main(["stubs", "revive", *argv, "--db", db_url]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("reliable: error:"), err
    assert message in err, err
    assert get_inbox(rel, "d-1", "billing").status is StubStatus.DEAD  # nothing changed
    assert get_inbox(rel, "d-1", "audit").status is StubStatus.DEAD
