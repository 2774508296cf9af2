""" "No message lost, or a person told": who is told does not depend on which sweeper gave the row up, an owed
notice is not deleted before it is delivered, and a channel that stays down — or that nobody delivers any
more — is visible (gauges) and loud (ERROR)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update

from reliable import Reliability
from reliable import constants as C
from reliable.models import StubNotification
from reliable.sweeper import Sweeper, WebhookChannel
from reliable.sweeper.errors import NotifyError
from reliable.sweeper.notices import DeadNotice, NoticeKind, body
from reliable.sweeper.selection import inbox
from reliable.types import StubStatus
from tests.sweeper.helpers import T0, Clock, MemoryChannel, QueueSender, add_stub, set_inbox, set_progress
from tests.sweeper.test_notify import Webhook
from tests.sweeper.test_stall import STALL_S, Probe, _stage

GUARD_DEAD = "DEAD: the handler failed at every attempt and the message was dead-lettered (max_attempts)"


class DownChannel:
    """A channel whose server refuses everything (an SMTP 554, a webhook 500)."""

    def __init__(self, name: str = "pager") -> None:
        self.name = name
        self.calls = 0

    def deliver(self, notices: Sequence[DeadNotice]) -> None:
        self.calls += 1
        raise NotifyError(f"{self.name}: refused (test)")


@pytest.fixture
def hook() -> Iterator[Webhook]:
    w = Webhook(fail_first=0)
    yield w
    w.close()


def _posted(hook: Webhook) -> list[tuple[str, str]]:
    return [(n["message_id"], n["consumer_group"]) for _, b in hook.posts for n in b["notices"]]


def _sample(name: str, channel: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"channel": channel})


def test_rows_a_sweeper_without_channels_gave_up_reach_a_person_through_one_with_channels(
    rel: Reliability, sender: QueueSender, clock: Clock, hook: Webhook
) -> None:
    """A second sweeper started without its env file (no channels) took the round: its give-ups, the
    guard's dead-letters it found and the alarms it raised were owed on no channel, and the sweeper with
    the webhook never posted them."""
    add_stub(rel, "doomed", send_count=3)
    add_stub(rel, "handler-bug")
    set_inbox(rel, "handler-bug", status=StubStatus.DEAD, last_error=GUARD_DEAD)  # as the guard leaves it
    bare = Sweeper(rel, sender, clock=clock)
    told = bare.run_once()
    assert (told.dead, told.dead_lettered) == (1, 1)

    full = Sweeper(rel, sender, clock=clock, channels=[WebhookChannel(hook.url, 5)])
    clock.advance(1)
    assert full.run_once().notified == 2
    assert sorted(_posted(hook)) == [("doomed", "billing"), ("handler-bug", "billing")]
    clock.advance(1)
    assert full.run_once().notified == 0  # once
    assert len(hook.posts) == 1


def test_a_channel_nobody_delivers_any_more_is_counted_and_said(
    rel: Reliability, sender: QueueSender, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The pager channel was dropped from the configuration while a notice was still owed to it: the row
    stayed owed for ever, and no metric or log line said so."""
    add_stub(rel, "doomed", send_count=3)
    assert Sweeper(rel, sender, clock=clock, channels=[DownChannel()]).run_once().notify_failures == 1
    memory = MemoryChannel()
    sweeper = Sweeper(rel, sender, clock=clock, channels=[memory])
    caplog.set_level(logging.WARNING, logger="reliable.sweeper")
    clock.advance(60)
    sweeper.run_once()
    assert [n.message_id for n in memory.notices] == ["doomed"]  # the configured channel was told
    assert _sample("reliable_sweeper_notices_owed", "pager") == 1
    assert _sample("reliable_sweeper_notices_owed_oldest_seconds", "pager") == 60
    assert _sample("reliable_sweeper_notices_owed", "memory") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "pager" in r.getMessage()]
    clock.advance(C.NOTIFY_ESCALATE_AGE_S)
    sweeper.run_once()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("owed to channel 'pager'" in m and "does not have" in m for m in said)


def test_a_channel_that_keeps_failing_is_an_error_not_just_warnings(
    rel: Reliability, sender: QueueSender, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    add_stub(rel, "doomed", send_count=3)
    down = DownChannel()
    sweeper = Sweeper(rel, sender, clock=clock, channels=[down])
    caplog.set_level(logging.WARNING, logger="reliable.sweeper")
    levels = []
    for _ in range(C.NOTIFY_ESCALATE_ATTEMPTS):
        caplog.clear()
        clock.advance(30)
        sweeper.run_once()
        levels += [r.levelname for r in caplog.records if "notify via pager" in r.getMessage()]
    assert down.calls == C.NOTIFY_ESCALATE_ATTEMPTS
    assert levels == ["WARNING"] * (C.NOTIFY_ESCALATE_ATTEMPTS - 1) + ["ERROR"]


def test_a_stall_that_clears_while_its_notice_is_owed_is_still_told(
    rel: Reliability, clock: Clock, hook: Webhook
) -> None:
    """The webhook was down for the whole stall: clearing it deleted the owed notice, and a person reading
    the webhook's channel never heard of a group that stopped for an hour."""
    hook.fail_first = 3
    sweeper = Sweeper(
        rel,
        QueueSender(),
        probe=Probe({("orders", 0): 1013}),
        channels=[WebhookChannel(hook.url, 5)],
        clock=clock,
        stall_after_s=STALL_S,
        purge_duty_cycle=1,
    )
    set_progress(rel, 1009, updated_at=T0)
    _stage(rel, 1010, 3)
    clock.advance(STALL_S + 1)
    assert sweeper.run_once().stall_alarms == 1
    clock.advance(3600)
    sweeper.run_once()  # still down
    set_progress(rel, 1012, updated_at=clock.now)  # the group resumed and took them
    for m in ("m1010", "m1011", "m1012"):
        set_inbox(rel, m, status=StubStatus.CONFIRMED)
    clock.advance(1)
    sweeper.run_once()  # cleared; this delivery fails too
    clock.advance(1)
    assert sweeper.run_once().notified == 1
    [(_, post)] = [p for p in hook.posts if p[0] == 204]
    assert post["event"] == "reliable.group.stalled"
    assert (
        f"Cleared at {clock.now - dt.timedelta(seconds=1):%Y-%m-%dT%H:%M:%S}" in post["notices"][0]["reason"]
    )
    with rel.engine.connect() as conn:
        left = conn.execute(select(StubNotification.channel).where(StubNotification.notified_at.is_(None)))
        assert left.all() == []


def test_a_never_consumed_alarm_outlives_the_message_it_names(
    rel: Reliability, clock: Clock, hook: Webhook
) -> None:
    """The alarm was owed on its example message's key; that message then went DEAD (too old at budget), the
    give-up deleted the owed alarm, and its marker kept it from being raised again: never told."""
    hook.fail_first = 2  # down for the first two rounds
    sweeper = Sweeper(
        rel,
        QueueSender(),
        probe=Probe({("orders", 0): 2000}),
        channels=[WebhookChannel(hook.url, 5)],
        clock=clock,
        max_unconfirmed_age_s=86400,
        stall_after_s=10**7,
        purge_duty_cycle=1,
    )
    hour_ago = T0 - dt.timedelta(hours=1)
    add_stub(
        rel, "m-nc", queue_id=0, queue_offset=1500, send_count=3, created_at=hour_ago, last_sent_at=hour_ago
    )
    assert sweeper.run_once().never_consumed == 1
    clock.advance(86400 + 60)  # the copy is older than max_unconfirmed_age now: given up at budget
    assert sweeper.run_once().dead == 1
    clock.advance(60)
    sweeper.run_once()
    events = sorted(post["event"] for status, post in hook.posts if status == 204)
    assert events == ["reliable.queue.never_consumed", "reliable.stub.dead"]


def test_the_guards_dead_letters_count_as_dead_and_their_mail_says_so(
    rel: Reliability, sender: QueueSender, clock: Clock
) -> None:
    """The ReliableMessageDead page reads reliable_sweeper_dead_total: rows the guard dead-lettered were
    told but never counted, and their e-mail said the resend sweeper gave up on them."""
    add_stub(rel, "handler-bug")
    with rel.engine.begin() as conn:
        conn.execute(update(inbox).values(status=StubStatus.DEAD.value, last_error=GUARD_DEAD))
    before = REGISTRY.get_sample_value("reliable_sweeper_dead_total") or 0.0
    assert Sweeper(rel, sender, clock=clock).run_once().dead_lettered == 1
    assert REGISTRY.get_sample_value("reliable_sweeper_dead_total") == before + 1
    notice = DeadNotice("handler-bug", "orders", "billing", 1, 0, 7, GUARD_DEAD[6:], T0.isoformat())
    text = body(NoticeKind.DEAD, [notice])
    assert "dead-lettered" in text.split("\n\n")[0] and "the resend sweeper gave up on them" not in text
