"""Telling a person: log (always), e-mail over SMTP, webhook (HTTP POST JSON) — the delivery round.

What is told — a stub gone DEAD, a queue never consumed, a group that stopped consuming — and its text per
kind are in :mod:`.notices`; the channels in :mod:`.channels`; the owed rows in :mod:`.owed`. The log line
is written in the round that raises the notice, unconditionally, with the notice's ``log`` row. Every round
then, per configured channel (:func:`deliver_owed`):

1. **owe** — every told notice without a row for the channel gets one (whichever sweeper told it);
2. **deliver**, batch by batch: claim owed rows (short transaction), deliver them with no transaction open,
   one message per kind (a burst of 200 dead stubs is one e-mail listing them, not 200), record the outcome
   (short transaction). A channel that fails (SMTP refused, webhook 5xx, timeout) leaves its rows owed,
   records the error, stops that channel for this round and lets the sweep go on; the next round retries.
   A kind that fails does not hold back the others. Once a notice has failed ``NOTIFY_ESCALATE_ATTEMPTS``
   times, or is owed ``NOTIFY_ESCALATE_AGE_S`` after it was raised, the failure is an ERROR, not a WARNING;
3. **watch** — what every channel still owes goes to the gauges ``reliable_sweeper_notices_owed`` and
   ``reliable_sweeper_notices_owed_oldest_seconds``, this sweeper's channels included at 0; a channel that
   this sweeper does not have, owed longer than ``NOTIFY_ESCALATE_AGE_S``, is an ERROR (a channel dropped
   from the configuration: nobody delivers its rows).

Delivery is at-least-once per channel: a sweeper killed between the channel's acceptance and the record
repeats those notices once its claim ends; two sweepers never claim the same rows.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine

from reliable import constants as C
from reliable.sweeper import metrics
from reliable.sweeper.channels import Channel
from reliable.sweeper.errors import NotifyError
from reliable.sweeper.notices import DeadNotice, NoticeKind, dead_line
from reliable.sweeper.owed import Claimed, Owed, claim, owe, owed_by_channel, settle

log = logging.getLogger("reliable.sweeper")

_ESCALATE_AGE = dt.timedelta(seconds=C.NOTIFY_ESCALATE_AGE_S)


def log_dead(notice: DeadNotice) -> None:
    """The always-on channel: one ERROR line per dead stub, in the round that gave up."""
    log.error("%s", dead_line(notice))


@dataclass
class NotifyResult:
    #: notices accepted, per channel name
    delivered: dict[str, int] = field(default_factory=dict)
    #: channels whose delivery failed this round (their notices are retried next round)
    failed_channels: list[str] = field(default_factory=list)
    #: what is still owed after the round, per channel with owed rows (configured here or not)
    owed: list[Owed] = field(default_factory=list)


def deliver_owed(
    engine: Engine,
    channels: Sequence[Channel],
    *,
    clock: Callable[[], dt.datetime],
    batch: int,
    claim_ttl: dt.timedelta = dt.timedelta(seconds=C.NOTIFY_CLAIM_TTL_S),
) -> NotifyResult:
    """Owe, deliver and watch (see the module doc); never raises for a channel failure."""
    result = NotifyResult()
    for channel in channels:
        owe(engine, channel.name, batch=batch)
        result.delivered[channel.name] = 0
        while True:
            delivered, failed = _deliver_batch(engine, channel, clock=clock, batch=batch, claim_ttl=claim_ttl)
            result.delivered[channel.name] += delivered
            if failed:
                result.failed_channels.append(channel.name)
                break
            if delivered < batch:
                break
    result.owed = owed_by_channel(engine)
    _watch(result.owed, [c.name for c in channels], clock())
    return result


def _deliver_batch(
    engine: Engine,
    channel: Channel,
    *,
    clock: Callable[[], dt.datetime],
    batch: int,
    claim_ttl: dt.timedelta,
) -> tuple[int, bool]:
    """One claimed batch of ``channel``'s owed rows, one delivery per kind; returns (rows delivered, whether
    a delivery failed)."""
    now = clock()
    until = now + claim_ttl
    claimed = claim(engine, channel.name, now=now, until=until, batch=batch)
    kinds: dict[NoticeKind, list[Claimed]] = {}
    for c in claimed:
        kinds.setdefault(c.notice.kind, []).append(c)
    delivered, failed = 0, False
    for kind, rows in kinds.items():
        keys = [c.key for c in rows]
        try:
            channel.deliver([c.notice for c in rows])
        except NotifyError as exc:
            settle(engine, channel.name, keys, until=until, now=clock(), error=str(exc))
            _failed(channel.name, kind, rows, exc, clock())
            failed = True
            continue
        settle(engine, channel.name, keys, until=until, now=clock(), error=None)
        delivered += len(keys)
    return delivered, failed


def _failed(
    channel: str, kind: NoticeKind, rows: Sequence[Claimed], exc: NotifyError, now: dt.datetime
) -> None:
    """A WARNING for a channel that failed; an ERROR once its notices failed often, or are owed long."""
    attempts = 1 + max(c.attempts for c in rows)
    since = min(c.owed_since for c in rows)
    if attempts >= C.NOTIFY_ESCALATE_ATTEMPTS or now - since >= _ESCALATE_AGE:
        log.error(
            "notify via %s keeps failing: %d %s notice(s) not delivered after %d attempt(s), owed since %s "
            "(gauge reliable_sweeper_notices_owed); fix the channel: %s",
            channel,
            len(rows),
            kind.value,
            attempts,
            since.isoformat(),
            exc,
        )
    else:
        log.warning(
            "notify via %s failed for %d %s notice(s), retried next round: %s",
            channel,
            len(rows),
            kind.value,
            exc,
        )


def _watch(owed: Sequence[Owed], configured: Sequence[str], now: dt.datetime) -> None:
    """The owed gauges of every channel; an ERROR for old notices owed to a channel this sweeper lacks."""
    metrics.NOTICES_OWED.clear()
    metrics.NOTICES_OWED_OLDEST_SECONDS.clear()
    for name in configured:
        metrics.NOTICES_OWED.labels(channel=name).set(0)
        metrics.NOTICES_OWED_OLDEST_SECONDS.labels(channel=name).set(0)
    for o in owed:
        age = now - o.oldest
        metrics.NOTICES_OWED.labels(channel=o.channel).set(o.count)
        metrics.NOTICES_OWED_OLDEST_SECONDS.labels(channel=o.channel).set(max(age.total_seconds(), 0.0))
        if o.channel not in configured and age >= _ESCALATE_AGE:
            log.error(
                "%d notice(s) owed to channel %r since %s, which this sweeper does not have: each sweeper "
                "delivers what its own channels owe; if no sweeper has it any more, configure it again, or "
                "delete them (DELETE FROM stub_notification WHERE channel = '%s' AND notified_at IS NULL)",
                o.count,
                o.channel,
                o.oldest.isoformat(),
                o.channel,
            )
