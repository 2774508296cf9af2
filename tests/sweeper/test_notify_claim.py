"""Delivering owed notices holds no lock across the channel's network call, yet each notice goes to each
channel once however many sweepers deliver, and one that dies mid-delivery leaves its notices owed."""

from __future__ import annotations

import collections
import datetime as dt
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import event, insert, select, text

from reliable import Reliability
from reliable import constants as C
from reliable.models import StubNotification
from reliable.sweeper import WebhookChannel
from reliable.sweeper.giveup import tell_unreported
from reliable.sweeper.notices import DeadNotice
from reliable.sweeper.notify import deliver_owed
from tests.sweeper.helpers import T0, MemoryChannel, add_stub
from tests.sweeper.test_notify import _owe, _Receiver

TTL = dt.timedelta(seconds=C.NOTIFY_CLAIM_TTL_S)


class SlowChannel:
    """Shared by several sweepers: keeps what it was given, taking a moment per delivery."""

    name = "memory"

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        time.sleep(0.02)
        with self.lock:
            self.keys += [(n.message_id, n.consumer_group) for n in notices]


class Crash(Exception):
    """The process dying mid-delivery (SIGKILL, OOM): nothing after this point runs."""


class DyingChannel:
    name = "memory"

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        raise Crash


def _owe_many(rel: Reliability, count: int, channel: str = "memory") -> list[tuple[str, str]]:
    rows = [
        {
            "message_id": f"d{i:04d}",
            "consumer_group": group,
            "channel": ch,
            "reason": "DEAD: never received after 3 send(s)",
            "created_at": T0,
            "notified_at": T0 if ch == C.NOTIFY_CHANNEL_LOG else None,
            "attempts": 0,
        }
        for i in range(count)
        for group in ("billing", "audit")
        for ch in (channel, C.NOTIFY_CHANNEL_LOG)
    ]
    with rel.engine.begin() as conn:
        conn.execute(insert(StubNotification), rows)
    return sorted({(f"d{i:04d}", group) for i in range(count) for group in ("billing", "audit")})


def test_three_sweepers_deliver_each_notice_once(server_url: str) -> None:
    with Reliability(server_url, redis_url="") as rel:
        expected = _owe_many(rel, 150)
        channel, barrier = SlowChannel(), threading.Barrier(3)

        def sweeper() -> None:
            with Reliability(server_url, redis_url="") as mine:
                barrier.wait()
                deliver_owed(mine.engine, [channel], clock=lambda: T0, batch=20)

        threads = [threading.Thread(target=sweeper) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        counts = collections.Counter(channel.keys)
        assert sorted(counts) == expected and set(counts.values()) == {1}


def test_a_sweeper_that_dies_mid_delivery_leaves_its_notices_owed(db_url: str) -> None:
    with Reliability(db_url, redis_url="") as rel:
        expected = _owe_many(rel, 3)
        with pytest.raises(Crash):
            deliver_owed(rel.engine, [DyingChannel()], clock=lambda: T0, batch=20)
        memory = MemoryChannel()
        # another sweeper meanwhile: the dead one's claim stands (it may yet have reached the channel)
        result = deliver_owed(rel.engine, [memory], clock=lambda: T0 + TTL / 2, batch=20)
        assert result.delivered == {"memory": 0} and memory.notices == []
        # once the claim ends they are delivered (at-least-once per channel)
        result = deliver_owed(rel.engine, [memory], clock=lambda: T0 + TTL, batch=20)
        assert sorted((n.message_id, n.consumer_group) for n in memory.notices) == expected
        with rel.engine.connect() as conn:
            owed = conn.execute(
                select(StubNotification.message_id).where(StubNotification.notified_at.is_(None))
            )
            assert owed.all() == []


@pytest.mark.mariadb
def test_a_slow_channel_holds_up_no_other_sweepers_give_up_on_mariadb(mariadb_url: str) -> None:
    """Its locking read of the owed rows stayed open across the HTTP call: another sweeper giving a row up
    inserts notice rows in its record transaction, which holds the group's inbox rows — it waited as long as
    the receiver took, and so did the consumers waiting on those inbox rows."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(mariadb_url)
    receiver = _Receiver(hold=True)
    with Reliability(mariadb_url, redis_url="") as rel:
        try:
            add_stub(rel, "m-old", groups=["billing"])
            _owe(rel, "m-old", "billing", "DEAD: never received after 3 send(s)", T0)
            notifying = threading.Thread(
                target=deliver_owed,
                args=(rel.engine, [WebhookChannel(receiver.url, timeout_s=30)]),
                kwargs={"clock": lambda: T0, "batch": 10},
            )
            notifying.start()
            assert receiver.arrived.wait(30)
            with rel.engine.connect() as conn:  # another sweeper's give-up, as its record writes it
                conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
                for channel, notified in (("webhook", None), ("log", T0)):
                    conn.execute(
                        insert(StubNotification).values(
                            message_id="m-new",
                            consumer_group="billing",
                            channel=channel,
                            reason="DEAD: never received after 3 send(s)",
                            created_at=T0,
                            notified_at=notified,
                            attempts=0,
                        )
                    )
                conn.commit()
            receiver.release.set()
            notifying.join(30)
            assert receiver.events == ["reliable.stub.dead"]
        finally:
            receiver.close()


@pytest.mark.mariadb
def test_two_sweepers_telling_dead_letters_at_once_do_not_deadlock_on_mariadb(mariadb_url: str) -> None:
    """Each removed the earlier notice rows of the rows it told with a DELETE that matched nothing, which at
    REPEATABLE READ took a gap lock; both then inserted their notices into that gap, and one sweeper's round
    died of a deadlock (three sweepers telling 400 guard dead-letters: one run in three)."""
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(mariadb_url)
    with Reliability(mariadb_url, redis_url="") as a, Reliability(mariadb_url, redis_url="") as b:
        for i in range(200):
            add_stub(a, f"bug-{i:03d}")
        with a.engine.begin() as conn:  # as the guard leaves them after max_attempts
            conn.execute(text("UPDATE message_inbox SET status = 'DEAD', last_error = 'DEAD: max_attempts'"))
        both_inserting = threading.Barrier(2, timeout=10)

        def meet_before_inserting(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
            if statement.startswith("INSERT INTO stub_notification"):
                both_inserting.wait()  # each has done everything before its insert

        told: list[int] = []

        def sweeper(rel: Reliability) -> None:
            event.listen(rel.engine, "before_cursor_execute", meet_before_inserting)
            with rel.engine.begin() as conn:
                told.append(len(tell_unreported(conn, now=T0, limit=50)))

        threads = [threading.Thread(target=sweeper, args=(r,)) for r in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert told == [50, 50]
