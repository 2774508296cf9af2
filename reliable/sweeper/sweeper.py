"""One sweep round: give up, re-send, notify, purge — and the summary line a person reads in the log.

A round, in order:

1. **sweep**, batch by batch: a short claim transaction takes the due stubs (see :mod:`.claim`: their
   ``resend_at`` moves a claim window ahead) and reads what their verdicts need from the database (stubs,
   watermarks) and commits; with no transaction open the broker is probed and the rows' Redis leases read
   (:mod:`.triage`), the rows judged, and the ones to re-send sent through the
   :class:`~reliable.sender.Sender`; a second short transaction records it all (holds, give-ups with their
   notices, never-consumed alarms, send outcomes) on the rows still PENDING and still claimed. No inbox row
   is locked while the broker is called;
2. **notify** — owe the notices told (by any sweeper) on this sweeper's channels and deliver them (a
   failing channel never stops the round), then show what every channel still owes (:mod:`.notify`);
3. **retention** — purge old log rows of settled stubs, yielding to consumers (rests between batches, at
   most ``DEFAULT_PURGE_ROUND_BUDGET_S`` per round; the next round goes on).

Between sweep and notify, a slice of PENDING stubs is settled (:func:`reliable.outbox.settle_slice`, round
after round through all of them), the rows the guard set DEAD (a handler failing ``max_attempts`` times) get
their notices (:func:`reliable.sweeper.giveup.tell_unreported`), and the stalled-group alarm is checked
(:mod:`.stall`).

Selection uses the round's start time, and every stub handled gets a ``resend_at`` after it, so the loop of
batches ends: no stub is handled twice in a round.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy import Engine

from reliable import constants as C
from reliable import otel, outbox
from reliable.facade import Reliability
from reliable.sender import BrokerProbe, RetentionProbe, Sender
from reliable.sweeper import metrics
from reliable.sweeper.backoff import BackoffPolicy, default_backoff
from reliable.sweeper.channels import Channel
from reliable.sweeper.claim import claim
from reliable.sweeper.errors import SweeperConfigError
from reliable.sweeper.giveup import tell_unreported
from reliable.sweeper.leases import RoundLeases
from reliable.sweeper.notify import deliver_owed
from reliable.sweeper.queues import Watermarks
from reliable.sweeper.redis_outage import UnreadableRedis
from reliable.sweeper.resend import OutagePause, Sent, record_batch, resend_topic, send_batch
from reliable.sweeper.retention import purge_logs
from reliable.sweeper.selection import Budget, Candidate, due_statement
from reliable.sweeper.shared_clock import DatabaseClock
from reliable.sweeper.stall import check_stalls
from reliable.sweeper.summary import RoundSummary
from reliable.sweeper.triage import Triage, observe, record, sort
from reliable.sweeper.verdict import RetrySchedule, RocketMQRetrySchedule

log = logging.getLogger("reliable.sweeper")


class Sweeper:
    """Re-sends what each consumer group lacks, through ``sender``; ``run_once()`` is one round.

    Defaults come from ``rel.settings`` (``max_sends``, ``stuck_after_s``, ``log_retention_s``,
    ``sweep_batch``, ``lease_ms``, ``purge_batch``, ``purge_duty_cycle``, ``stall_after_s``); keyword
    arguments override them. ``probe`` is the broker's view of its
    queues (:class:`~reliable.sender.BrokerProbe`; default: the sender itself when it is one) — it proves
    a loss on a quiet queue; without it ``max_unconfirmed_age_s`` is the last resort. ``retry_schedule`` is
    the broker's own redelivery delay (default RocketMQ's). ``clock`` is the time source of every due-time
    decision: by default the database server's, read once a round (:mod:`reliable.sweeper.shared_clock`:
    sweepers on hosts whose clocks differ would re-claim each other's rows); tests pass a controllable one.
    ``channels`` are the notification channels besides the log (see :mod:`reliable.sweeper.channels`,
    :mod:`reliable.sweeper.notify`). ``max_batches`` caps the batches per round (``None``: until
    nothing is due). ``claim_ttl_s`` is the claim window (:mod:`reliable.sweeper.claim`; default
    ``DEFAULT_CLAIM_TTL_S``): a batch is claimed by moving its rows' ``resend_at`` that far ahead and sent
    with no transaction open; the rows of a sweeper killed mid-batch are due again when it ends.
    """

    def __init__(
        self,
        rel: Reliability,
        sender: Sender,
        *,
        backoff: BackoffPolicy | None = None,
        probe: BrokerProbe | None = None,
        backlog_cap_s: float = C.DEFAULT_BACKLOG_CAP_S,
        channels: Sequence[Channel] = (),
        batch: int | None = None,
        max_sends: int | None = None,
        stuck_after_s: float | None = None,
        max_unconfirmed_age_s: float = C.DEFAULT_MAX_UNCONFIRMED_AGE_S,
        retry_schedule: RetrySchedule | None = None,
        log_retention_s: float | None = None,
        purge_duty_cycle: float | None = None,
        stall_after_s: float | None = None,
        claim_ttl_s: float | None = None,
        max_batches: int | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        s = rel.settings
        self.rel = rel
        self.engine: Engine = rel.engine
        self.sender = otel.traced_sender(rel, sender)
        self.backoff = backoff or default_backoff()
        if probe is None and isinstance(sender, BrokerProbe):
            probe = sender
        self.probe = probe
        self.backlog_cap_s = backlog_cap_s
        self.channels = list(channels)
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names) or C.NOTIFY_CHANNEL_LOG in names:
            raise SweeperConfigError(f"notification channels must be distinct and not 'log': {names}")
        self.batch = batch if batch is not None else s.sweep_batch
        self.max_sends = max_sends if max_sends is not None else s.max_sends
        self.stuck_after = dt.timedelta(
            seconds=stuck_after_s if stuck_after_s is not None else s.stuck_after_s
        )
        self.max_unconfirmed_age = dt.timedelta(seconds=max_unconfirmed_age_s)
        self.retry_schedule: RetrySchedule = retry_schedule or RocketMQRetrySchedule()
        retention = log_retention_s if log_retention_s is not None else s.log_retention_s
        if not 0 <= retention <= C.MAX_RETENTION_S:  # beyond it "now − retention" is before year 1
            raise SweeperConfigError(
                f"log_retention must be between 0 and {C.MAX_RETENTION_S // 86400} days, got {retention!r} s"
            )
        self.log_retention = dt.timedelta(seconds=retention)
        self.purge_batch = s.purge_batch
        self.purge_duty_cycle = purge_duty_cycle if purge_duty_cycle is not None else s.purge_duty_cycle
        if not 0 < self.purge_duty_cycle <= 1:
            raise SweeperConfigError(f"purge_duty_cycle must be in (0, 1], got {self.purge_duty_cycle!r}")
        stall = stall_after_s if stall_after_s is not None else s.stall_after_s
        if stall <= 0:
            raise SweeperConfigError(f"stall_after must be > 0, got {stall!r}")
        self.stall_after = dt.timedelta(seconds=stall)
        #: where the settle walk goes on next round (reliable.outbox.settle_slice)
        self._settle_at: outbox.SettleCursor = None
        ttl = claim_ttl_s if claim_ttl_s is not None else C.DEFAULT_CLAIM_TTL_S
        self.claim_ttl = dt.timedelta(seconds=ttl)
        self.lease_hold = dt.timedelta(milliseconds=s.lease_ms)
        self.max_batches = max_batches
        #: the round's time: by default the database's (:mod:`.shared_clock`: every sweeper reads one clock)
        self.clock: Callable[[], dt.datetime] = clock if clock is not None else DatabaseClock(self.engine)
        #: times the broker calls (a hung broker: sends and probes that wait for their timeout)
        self.monotonic: Callable[[], float] = time.monotonic
        if self.batch <= 0 or self.max_sends <= 0:
            raise SweeperConfigError("batch and max_sends must be > 0")
        if not C.MIN_CLAIM_TTL_S <= ttl <= C.MAX_CLAIM_TTL_S:  # rows of a killed sweeper wait this long
            raise SweeperConfigError(
                f"claim_ttl must be between {C.MIN_CLAIM_TTL_S:g} s and {C.MAX_CLAIM_TTL_S / 3600:g} h, "
                f"got {ttl!r} s"
            )
        if max_batches is not None and max_batches <= 0:
            raise SweeperConfigError("max_batches must be > 0")
        if max_unconfirmed_age_s <= 0:
            raise SweeperConfigError("max_unconfirmed_age must be > 0")
        self._stop = threading.Event()
        #: how long Redis has been unreadable, across rounds and runs (an episode in the database): an ERROR
        #: a round and one notice an outage past stuck_after
        self.redis_watch = UnreadableRedis(self.engine, self.stuck_after)

    def stop(self) -> None:
        """Ask a running round to stop after the current send (claimed leftovers are due after the claim
        window)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- the round --------------------------------------------------------------------------------------
    @otel.traced_round
    def run_once(self) -> RoundSummary:
        started = time.perf_counter()
        summary = RoundSummary()
        try:
            if isinstance(self.clock, DatabaseClock):
                self.clock.sync()
            leases, now = self._round_leases(), self.clock()
            self._sweep(now, summary, leases)
            self.redis_watch.after_round(leases, now, summary.lease_unknown)
            with outbox.read_committed(self.engine) as conn:  # last groups confirmed at one instant
                self._settle_at = outbox.settle_slice(
                    conn, self.clock(), self._settle_at, C.DEFAULT_SETTLE_BATCH
                )
            self._tell_dead_lettered(summary)
            self._stalls(summary)
            self._notify(summary)
            if not self.stopping:
                summary.purged = purge_logs(
                    self.engine,
                    now=self.clock(),
                    retention=self.log_retention,
                    batch=self.purge_batch,
                    duty_cycle=self.purge_duty_cycle,
                    budget_s=C.DEFAULT_PURGE_ROUND_BUDGET_S,
                    rest=self._stop.wait,
                    should_stop=self._stop.is_set,
                )
        except Exception:
            metrics.ROUND_ERRORS.inc()
            log.exception("sweep round failed")
            raise
        finally:
            summary.duration_s = time.perf_counter() - started
            self._observe(summary)
        log.info("%s", summary.line())
        return summary

    def _round_leases(self) -> RoundLeases:
        """The round's reader of the rows' leases, received or not (one round trip a batch): a worker killed
        in the handler journaled nothing, and its lease is what says its copy is still in flight; a read that
        fails leaves Redis alone for a while (:mod:`.leases`)."""
        return RoundLeases(self.rel.redis, self.rel.settings.key_prefix, self.stuck_after, self.monotonic)

    def _batches(self) -> range:
        return range(self.max_batches) if self.max_batches is not None else range(2**62)

    def _triage(self) -> Triage:
        return Triage(
            sender=self.sender,
            probe=self.probe,
            policy=self.backoff,
            max_sends=self.max_sends,
            stuck_after=self.stuck_after,
            max_unconfirmed_age=self.max_unconfirmed_age,
            retry_schedule=self.retry_schedule,
            lease_hold=self.lease_hold,
            monotonic=self.monotonic,
        )

    def _sweep(self, now: dt.datetime, summary: RoundSummary, leases: RoundLeases) -> None:
        """Batches of (claim → probe → judge → send → record) until nothing is due; no inbox row is locked
        while the broker is called (the probe or the sends)."""
        stmt = due_statement(
            now=now,
            stuck_after=self.stuck_after,
            max_sends=self.max_sends,
            limit=self.batch,
            budget=Budget.ANY,
            dialect=self.engine.dialect.name,
        )
        t = self._triage()
        outage = OutagePause(self.monotonic)  # counted over the round's batches
        copies: dict[str, outbox.SendAttempt] = {}  # one copy per message per round, however it is batched
        for _ in self._batches():
            if self.stopping:
                return
            marks = Watermarks()  # this batch's watermark reads, shared by triage and the record
            # 1. claim: a short transaction moves the rows' resend_at to the claim's end, reads what the
            # verdicts need from the database (stubs, watermarks) and commits
            until = self.clock() + self.claim_ttl
            with outbox.read_committed(self.engine) as conn:
                claimed = claim(conn, stmt, until=until)
                if not claimed:
                    return
                seen = observe(t, conn, claimed, marks)
            # 2. the broker's view of the rows' queues and the rows' Redis leases, with no transaction open
            # (a consumer confirming one of the rows does not wait for them); 3. the verdicts: send, hold
            # (a lease held), give up, alarm
            facts = t.facts(seen)
            views = leases.read([(row.cand.consumer_group, row.cand.message_id) for row in seen.rows])
            plan = sort(t, seen, facts, views, self.clock())
            # 4. the sends, still with no transaction open; none starts in the claim's last fifth: past its
            # end another sweeper may take the rows and send them too (the budget spent twice as fast)
            last_start = until - self.claim_ttl * C.CLAIM_SEND_SHARE_REMAINING
            sent = self._send(plan.send, outage, copies, last_start)
            if sent.unsent and not self.stopping and not sent.result.paused:
                self._window_ran_out(summary, len(sent.unsent), len(claimed))
            t.ask_landed(sent.landed())  # the landed queues' ends, for the backlog estimate
            # 5. record: a short transaction writes the verdicts and the send outcomes on the rows still
            # PENDING and still carrying this claim (a confirmation that landed meanwhile stands)
            with outbox.read_committed(self.engine) as conn:
                at = self.clock()
                triaged = record(conn, plan, claimed_until=until, now=at)
                result = record_batch(
                    conn,
                    sent,
                    policy=self.backoff,
                    estimator=t.known_ends(self.backlog_cap_s),
                    now=at,
                    marks=marks,
                    claimed_until=until,
                )
            summary.selected += len(claimed)
            summary.add(triaged)
            summary.add(result)
            if result.paused:  # the rows left unsent are due again: another batch would claim them again
                metrics.SEND_PAUSES.inc()
                log.error(
                    "resends failing in a row (%d sent, %d failed in this batch): the broker looks down; "
                    "the other due rows wait for the next round, their budget untouched",
                    result.resent,
                    result.send_failures,
                )
                return
            if len(claimed) < self.batch:
                return

    def _window_ran_out(self, summary: RoundSummary, unsent: int, claimed: int) -> None:
        """The claim's send window (its first four fifths) ended before the batch was sent: the rest is
        released, due again next round. Repeated every round it sends nothing at all — said, not silent."""
        summary.released += unsent
        metrics.CLAIM_RELEASED.inc(unsent)
        log.warning(
            "claim window %s ran out after %d of %d claimed rows (the probe and sends took longer): the "
            "other %d are released to the next round; raise --claim-ttl or lower the batch",
            self.claim_ttl,
            claimed - unsent,
            claimed,
            unsent,
        )

    def _send(
        self,
        candidates: Sequence[Candidate],
        outage: OutagePause,
        copies: dict[str, outbox.SendAttempt],
        last_start: dt.datetime,
    ) -> Sent:
        def should_stop() -> bool:
            return self._stop.is_set() or self.clock() >= last_start

        return send_batch(self.sender, candidates, should_stop=should_stop, outage=outage, copies=copies)

    def _tell_dead_lettered(self, summary: RoundSummary) -> None:
        for _ in self._batches():
            with outbox.read_committed(self.engine) as conn:
                told = tell_unreported(conn, now=self.clock(), limit=self.batch)
            summary.dead_lettered += len(told)
            if len(told) < self.batch or self.stopping:
                return

    def _stalls(self, summary: RoundSummary) -> None:
        found = check_stalls(
            self.engine,
            now=self.clock(),
            stall_after=self.stall_after,
            broker_max=self.probe.max_offset if self.probe is not None else None,
            broker_min=self.probe.min_offset if isinstance(self.probe, RetentionProbe) else None,
            resend_topic=lambda topic, group: resend_topic(self.sender, topic, group),
        )
        summary.stalled, summary.stall_alarms = found.open, found.raised

    def _notify(self, summary: RoundSummary) -> None:
        result = deliver_owed(self.engine, self.channels, clock=self.clock, batch=self.batch)
        summary.notified += sum(result.delivered.values())
        summary.notify_failures += len(result.failed_channels)
        for name, count in result.delivered.items():
            metrics.NOTIFIED.labels(channel=name).inc(count)
        for name in result.failed_channels:
            metrics.NOTIFY_FAILURES.labels(channel=name).inc()

    @staticmethod
    def _observe(s: RoundSummary) -> None:
        metrics.ROUNDS.inc()
        metrics.SELECTED.inc(s.selected)
        metrics.RESENT.inc(s.resent)
        metrics.SEND_FAILURES.inc(s.send_failures)
        metrics.STUCK_RECOVERED.inc(s.stuck_recovered)
        metrics.LEASE_HELD.inc(s.lease_held)
        metrics.LEASE_UNKNOWN.inc(s.lease_unknown)
        metrics.DEAD.inc(s.dead + s.dead_lettered)  # the guard's DEAD rows page as the sweeper's do
        metrics.DEAD_LETTERED.inc(s.dead_lettered)
        metrics.PURGED.inc(s.purged)
        metrics.LAST_ROUND_SECONDS.set(s.duration_s)
        metrics.LAST_ROUND_TIMESTAMP.set(time.time())
