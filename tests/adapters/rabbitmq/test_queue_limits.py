"""Queue limits an ordinary RabbitMQ deployment sets, under two consumer groups (billing reads, audit is slow
or stopped): ``x-max-length`` with the default overflow ``drop-head``, ``x-overflow reject-publish`` (and
``-dlx``), and ``x-message-ttl``. The broker discards or dead-letters messages by these limits without telling
a consumer. The promise checked: each message applied once per group in the end, or a person told (a DEAD
notice) — never lost in silence; billing receives no copy meant for audit; resends the limit drops or refuses
again are bounded by the budget and end in a notice; a copy the *broker* dead-lettered (TTL or overflow into
the queue's dead-letter exchange) is not taken for one reliable dead-lettered (the row is not DEAD, no
DEAD_LETTER journal row, the sweeper still owes it); the reconciliation report (its DuckDB reference) counts
such messages as lost / dead, never as confirmed.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from reliable import Reliability, StubProducer, StubStatus
from reliable.adapters.rabbitmq import HEADER_DEAD_REASON, RabbitMQSender, Topology
from reliable.models import MessageLog, utcnow
from reliable.producer import SendOutcome
from reliable.reconcile.export import export_tables
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.sweeper.notices import NoticeKind
from reliable.sweeper.summary import RoundSummary
from reliable.types import LogOutcome
from tests.adapters.rabbitmq.conftest import TOPIC, queue_depth
from tests.adapters.rabbitmq.test_two_groups import (
    GROUPS,
    Fanout,
    declared,
    drain,
    effect_counts,
    effects,
    inbox,
    md,
)
from tests.sweeper.helpers import MemoryChannel
from tests.waiting import wait_until

pytestmark = pytest.mark.rabbitmq

FAST, SLOW = GROUPS  # billing keeps up, audit is slow or stopped
#: rounds run on a clock this far apart pass any backoff of the tests' sweepers (FixedBackoff 60 s, backlog
#: estimate capped at a minute)
STEP = dt.timedelta(minutes=5)
MAX_AGE_S = 3600.0


@pytest.fixture
def rel(rel: Reliability) -> Reliability:
    """The adapter tests' ``Reliability`` with test_two_groups' effect table (one row per group's effect)."""
    md.create_all(rel.engine)
    with rel.engine.begin() as conn:
        conn.execute(delete(effects))
    return rel


@pytest.fixture
def limited(request: pytest.FixtureRequest, rabbitmq_url: str) -> Iterator[Fanout]:
    """One exchange, billing's queue without limits, audit's with the arguments the test is parametrised
    with (declared with reliable's topology: the queue's dead-letter exchange is ``{queue}.dlx``)."""
    name = f"limits_{uuid.uuid4().hex[:10]}"
    exchange = f"{name}.x"
    slow_args: dict[str, Any] = request.param
    topos = {
        FAST: Topology(queue=f"{name}.{FAST}", exchange=exchange, binding_key=TOPIC),
        SLOW: Topology(
            queue=f"{name}.{SLOW}", exchange=exchange, binding_key=TOPIC, queue_arguments=slow_args
        ),
    }
    yield from declared(rabbitmq_url, Fanout(exchange, topos))


class Clock:
    """The sweeper's clock, set by the test before each round."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> dt.datetime:
        return self.now


def sweeper(
    rel: Reliability, sender: RabbitMQSender, channel: MemoryChannel, clock: Clock, max_sends: int
) -> Sweeper:
    return Sweeper(
        rel,
        sender,
        channels=[channel],
        backoff=FixedBackoff((60.0,)),
        backlog_cap_s=60.0,
        max_sends=max_sends,
        max_unconfirmed_age_s=MAX_AGE_S,
        stall_after_s=10 * MAX_AGE_S,  # the stall alarm is another test's subject
        clock=clock,
    )


def round_at(sweep: Sweeper, clock: Clock, at: dt.datetime) -> RoundSummary:
    clock.now = at
    return sweep.run_once()


def deliveries(rel: Reliability, group: str) -> Counter[tuple[str, LogOutcome | None]]:
    with rel.session() as s:
        rows = s.execute(
            select(MessageLog.message_id, MessageLog.outcome).where(MessageLog.consumer_group == group)
        ).all()
    return Counter((m, o) for m, o in rows)


def holds(admin: Any, queue: str, n: int) -> Callable[[], bool]:
    """Whether ``queue`` holds ``n`` messages (a condition for :func:`wait_until`)."""
    return lambda: queue_depth(admin, queue) == n


def dead_notices(channel: MemoryChannel) -> list[tuple[str, str]]:
    return sorted((n.consumer_group, n.message_id) for n in channel.notices if n.kind is NoticeKind.DEAD)


def broker_dead_letters(admin: Any, topo: Topology) -> list[tuple[str, str]]:
    """What the broker itself dead-lettered into ``{queue}.dlq``: (message id, x-death reason)."""
    out: list[tuple[str, str]] = []
    while True:
        method, props, _ = admin.basic_get(topo.dead_letter_queue, auto_ack=True)
        if method is None:
            return sorted(out)
        headers = props.headers or {}
        assert HEADER_DEAD_REASON not in headers, "reliable dead-lettered it, not the broker"
        out.append((str(props.message_id), str(headers["x-death"][0]["reason"])))


def report(rel: Reliability, tmp_path: Path, as_of: dt.datetime) -> dict[str, Any]:
    """The reconciliation report's per-group figures (the DuckDB reference of docs/reconcile.md)."""
    pytest.importorskip("duckdb")
    from bench import reconcile_duckdb as ref

    run = tmp_path / uuid.uuid4().hex[:6]
    export_tables(rel.engine, run / "export")
    out = ref.reference_report(run / "export", run / "out", as_of, grace_s=60, stuck_after_s=900)
    groups: dict[str, Any] = out["groups"]
    return groups


def figures(groups: dict[str, Any], group: str) -> dict[str, int]:
    f = groups[group]
    return {k: int(f[k]) for k in ("confirmed", "pending", "dead", "lost", "unsent")}


@pytest.mark.parametrize("limited", [{"x-max-length": 2}], indirect=True)
def test_drop_head_drops_the_slow_groups_oldest_they_are_resent_to_it_alone_and_applied_once(
    rel: Reliability, limited: Fanout, rabbitmq_url: str, admin: Any, tmp_path: Path
) -> None:
    """audit's queue holds 2 (drop-head): of 5 messages the broker dropped the 3 oldest for audit only —
    the producer's sends were all confirmed. Once audit reads the 2 newest, its position has passed the 3
    (overtaken): they are re-sent into audit's queue, which drops one of those resends again; the next round
    re-sends that one. In the end each message once per group, billing never got a second copy."""
    mids = [f"m-{i}" for i in range(5)]
    channel = MemoryChannel()
    with RabbitMQSender(rabbitmq_url, exchange=limited.exchange, group_queue=limited.group_queue) as sender:
        producer = StubProducer(rel, sender)
        results = [producer.publish(m, TOPIC, m.encode(), groups=GROUPS) for m in mids]
        assert [r.outcome for r in results] == [SendOutcome.SENT] * 5
        assert queue_depth(admin, limited.queue(SLOW)) == 2
        drain(rabbitmq_url, limited, rel, FAST, 5)
        drain(rabbitmq_url, limited, rel, SLOW, 2)
        dropped = {(m, "maxlen") for m in mids[:3]}
        assert set(broker_dead_letters(admin, limited.topologies[SLOW])) == dropped
        now = utcnow()
        groups = report(rel, tmp_path, now + STEP)
        assert figures(groups, SLOW) == {"confirmed": 2, "pending": 3, "dead": 0, "lost": 3, "unsent": 0}
        assert figures(groups, FAST) == {"confirmed": 5, "pending": 0, "dead": 0, "lost": 0, "unsent": 0}

        clock = Clock()
        sweep = sweeper(rel, sender, channel, clock, max_sends=4)
        for n in range(1, 5):
            summary = round_at(sweep, clock, now + n * STEP)
            assert summary.dead == 0, summary.line()
            depth = queue_depth(admin, limited.queue(SLOW))
            if depth:
                drain(rabbitmq_url, limited, rel, SLOW, depth)
            if all(inbox(rel, SLOW, m).status is StubStatus.CONFIRMED for m in mids):
                break
    assert effect_counts(rel) == {(g, m): 1 for g in GROUPS for m in mids}
    assert deliveries(rel, FAST) == {(m, LogOutcome.SUCCESS): 1 for m in mids}  # no copy meant for audit
    assert queue_depth(admin, limited.queue(FAST)) == 0
    assert [inbox(rel, FAST, m).resend_count for m in mids] == [0] * 5
    assert all(inbox(rel, SLOW, m).resend_count >= 1 for m in mids[:3])
    assert dead_notices(channel) == []
    groups = report(rel, tmp_path, utcnow() + STEP)
    for g in GROUPS:
        assert figures(groups, g) == {"confirmed": 5, "pending": 0, "dead": 0, "lost": 0, "unsent": 0}


@pytest.mark.parametrize(
    "limited",
    [
        {"x-max-length": 1, "x-overflow": "reject-publish"},
        {"x-max-length": 1, "x-overflow": "reject-publish-dlx"},
    ],
    indirect=True,
    ids=["reject-publish", "reject-publish-dlx"],
)
def test_a_full_queue_refusing_sends_is_a_failed_send_and_its_resends_end_in_one_notice_each(
    rel: Reliability, limited: Fanout, rabbitmq_url: str, admin: Any, tmp_path: Path
) -> None:
    """audit's queue holds 1 and refuses the rest (publisher confirm: nack), audit's consumers are stopped.
    The producer's send of m-1 and m-2 is a failed send (billing's copy landed: the broker nacks a message
    any one queue refused); the sweeper re-sends them to audit only, each resend is refused again, and the
    budget ends each in DEAD with one notice — not an endless loop, and not a success that was dropped."""
    mids = ["m-0", "m-1", "m-2"]
    channel = MemoryChannel()
    with RabbitMQSender(rabbitmq_url, exchange=limited.exchange, group_queue=limited.group_queue) as sender:
        producer = StubProducer(rel, sender)
        results = [producer.publish(m, TOPIC, m.encode(), groups=GROUPS) for m in mids]
        assert [r.outcome for r in results] == [SendOutcome.SENT, SendOutcome.FAILED, SendOutcome.FAILED]
        drain(rabbitmq_url, limited, rel, FAST, 3)
        clock = Clock()
        sweep = sweeper(rel, sender, channel, clock, max_sends=3)
        now = utcnow()
        failures = 0
        for n in range(1, 6):
            summary = round_at(sweep, clock, now + n * STEP)
            assert summary.resent == 0, summary.line()
            failures += summary.send_failures
    assert failures == 4  # two resends each for m-1 and m-2, then DEAD; none after that
    assert dead_notices(channel) == [(SLOW, "m-1"), (SLOW, "m-2")]
    assert [inbox(rel, SLOW, m).status for m in mids] == [
        StubStatus.PENDING,
        StubStatus.DEAD,
        StubStatus.DEAD,
    ]
    assert deliveries(rel, FAST) == {(m, LogOutcome.SUCCESS): 1 for m in mids}  # no copy meant for audit
    assert queue_depth(admin, limited.queue(SLOW)) == 1  # m-0 waits for audit
    drain(rabbitmq_url, limited, rel, SLOW, 1)  # audit back
    assert effect_counts(rel) == {**{(FAST, m): 1 for m in mids}, (SLOW, "m-0"): 1}
    groups = report(rel, tmp_path, utcnow() + STEP)
    assert figures(groups, SLOW) == {"confirmed": 1, "pending": 0, "dead": 2, "lost": 0, "unsent": 0}


@pytest.mark.parametrize("limited", [{"x-message-ttl": 300}], indirect=True)
def test_messages_expiring_while_the_slow_group_is_down_are_resent_and_end_in_a_notice_when_it_stays_down(
    rel: Reliability, limited: Fanout, rabbitmq_url: str, admin: Any, tmp_path: Path
) -> None:
    """audit read m-0, then its consumers stopped; its queue's TTL (300 ms) expires m-1 and m-2 into its
    dead-letter queue (the broker's doing, reason ``expired``). reliable must not take them for its own dead
    letters: the rows stay PENDING (no DEAD_LETTER journal row), are held while they may be queued, re-sent
    once ``max_unconfirmed_age`` old — a resend that expires as well — and DEAD with one notice each at the
    budget. m-3, sent after audit is back, is applied once."""
    channel = MemoryChannel()
    slow = limited.topologies[SLOW]
    with RabbitMQSender(rabbitmq_url, exchange=limited.exchange, group_queue=limited.group_queue) as sender:
        producer = StubProducer(rel, sender)
        producer.publish("m-0", TOPIC, b"m-0", groups=GROUPS)
        drain(rabbitmq_url, limited, rel, SLOW, 1)
        for m in ("m-1", "m-2"):
            producer.publish(m, TOPIC, m.encode(), groups=GROUPS)
        drain(rabbitmq_url, limited, rel, FAST, 3)
        wait_until(lambda: queue_depth(admin, slow.dead_letter_queue) == 2, 20, "m-1 and m-2 to expire")
        assert broker_dead_letters(admin, slow) == [("m-1", "expired"), ("m-2", "expired")]
        assert queue_depth(admin, slow.queue) == 0
        clock = Clock()
        sweep = sweeper(rel, sender, channel, clock, max_sends=3)
        now = utcnow()
        summary = round_at(sweep, clock, now + STEP)  # may still be queued behind a backlog: held
        assert (summary.resent, summary.dead) == (0, 0), summary.line()
        assert [inbox(rel, SLOW, m).status for m in ("m-1", "m-2")] == [StubStatus.PENDING] * 2
        assert deliveries(rel, SLOW) == {("m-0", LogOutcome.SUCCESS): 1}  # no DEAD_LETTER of reliable's
        age = dt.timedelta(seconds=MAX_AGE_S) + STEP
        resent = 0
        for n in range(1, 4):
            summary = round_at(sweep, clock, now + n * age)
            resent += summary.resent
            # every resend lands in audit's queue and expires into its dead-letter queue
            wait_until(holds(admin, slow.dead_letter_queue, resent), 20, "resends to expire")
        assert resent == 4  # two each, both expired; then the budget ends
        assert queue_depth(admin, slow.queue) == 0
        assert [m for m, _ in broker_dead_letters(admin, slow)] == ["m-1", "m-1", "m-2", "m-2"]
        assert dead_notices(channel) == [(SLOW, "m-1"), (SLOW, "m-2")]
        producer.publish("m-3", TOPIC, b"m-3", groups=GROUPS)
        drain(rabbitmq_url, limited, rel, SLOW, 1)  # audit back in time for m-3
        drain(rabbitmq_url, limited, rel, FAST, 1)
    assert deliveries(rel, FAST) == {(m, LogOutcome.SUCCESS): 1 for m in ("m-0", "m-1", "m-2", "m-3")}
    assert deliveries(rel, SLOW) == {("m-0", LogOutcome.SUCCESS): 1, ("m-3", LogOutcome.SUCCESS): 1}
    assert effect_counts(rel) == {
        **{(FAST, m): 1 for m in ("m-0", "m-1", "m-2", "m-3")},
        (SLOW, "m-0"): 1,
        (SLOW, "m-3"): 1,
    }
    groups = report(rel, tmp_path, utcnow() + STEP)
    assert figures(groups, SLOW) == {"confirmed": 2, "pending": 0, "dead": 2, "lost": 0, "unsent": 0}


@pytest.mark.parametrize("limited", [{"x-max-length": 1, "x-overflow": "reject-publish"}], indirect=True)
def test_a_full_slow_queue_refusing_resends_does_not_hold_back_the_fast_groups_resend(
    rel: Reliability, limited: Fanout, rabbitmq_url: str, admin: Any
) -> None:
    """billing lost m-0 (its queue purged by hand); audit's full queue refuses m-1..m-4, which are due first.
    The round re-sends m-0 to billing: audit's refusals are its own queue's. Until the sweeper counted
    refusals per group queue, three of audit's paused the whole topic for the round, and billing's lost
    message waited behind every due row of audit, three a round."""
    channel = MemoryChannel()
    with RabbitMQSender(rabbitmq_url, exchange=limited.exchange, group_queue=limited.group_queue) as sender:
        producer = StubProducer(rel, sender)
        producer.publish("m-0", TOPIC, b"m-0", groups=GROUPS)
        admin.queue_purge(limited.queue(FAST))
        for i in range(1, 5):
            producer.publish(f"m-{i}", TOPIC, b"x", groups=GROUPS)
        drain(rabbitmq_url, limited, rel, FAST, 4)
        clock = Clock()
        sweep = sweeper(rel, sender, channel, clock, max_sends=3)
        summary = round_at(sweep, clock, utcnow() + STEP)
        assert inbox(rel, FAST, "m-0").resend_count == 1, summary.line()
        drain(rabbitmq_url, limited, rel, FAST, 1)
    assert effect_counts(rel) == {(FAST, f"m-{i}"): 1 for i in range(5)}
