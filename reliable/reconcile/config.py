"""Parameters of the anomaly definitions and the alert thresholds (no Spark here)."""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field, fields
from pathlib import Path

from reliable import constants as C
from reliable.reconcile.errors import InputError, OptionError

#: bump when a key of summary.json is removed or changes meaning (adding keys keeps the version).
#: 2: figures per consumer group (inbox rows, not stubs), never-consumed queues, targeted resends.
#: 3: a queue is (consumer_group, topic, broker_name, queue_id): ``queues[]`` and ``never_consumed[]`` entries
#: carry ``broker_name`` and one (group, topic, queue id) may appear once per broker group.
SCHEMA_VERSION = 3

#: how long a PENDING stub may wait for its first delivery before "below the watermark, never logged"
#: means lost
DEFAULT_GRACE_S = 5 * 60
#: how many ids each "needs attention" list of the summary and the HTML page holds (the Parquet has them all)
DEFAULT_ATTENTION_LIMIT = 100
#: deliveries can be stamped slightly before the stub's created_at when producer and consumer clocks differ;
#: a window reads log rows this much earlier so such a delivery still counts for its message.
CLOCK_SKEW_S = 5 * 60
#: up to this many deliveries without a pair in the window, their ids are broadcast to find the orphan logs
#: (the stub ids are then scanned, not shuffled)
ORPHAN_BROADCAST_ROWS = 200_000


#: the contract tables the report reads, which is also the file layout of a Parquet input directory
TABLES = ("message_stub", "message_inbox", "message_log", "consume_progress")
#: RocketMQ (and broker_sim) deliver a group's retries, and the sweeper's resends targeted at one group,
#: from this topic + the group's name (DESIGN.md §3); another broker's retry topic is never matched.
RETRY_TOPIC_PREFIX = "%RETRY%"


def parquet_inputs(directory: Path) -> dict[str, Path]:
    """``directory/<table>.parquet`` for each table, or :class:`InputError` naming the missing ones."""
    paths = {t: directory / f"{t}.parquet" for t in TABLES}
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise InputError(f"Parquet input incomplete, missing: {', '.join(missing)} (see `reliable export`)")
    return paths


class DuplicateCause(enum.StrEnum):
    """Why a message was delivered more than once, judged per extra delivery."""

    #: the same delivered (topic, queue, offset) came again without a retry: a rebalance or a lost commit
    REDELIVERY = "redelivery"
    #: reconsume_times > 0: the broker re-delivered it because the consumer asked for a retry
    RETRY = "retry"
    #: a new position in the topic: the producer (or a topic-wide resend) stored a second copy
    PRODUCER_DOUBLE_SEND = "producer_double_send"
    #: a new position in the group's ``%RETRY%{group}`` topic: the sweeper re-sent it to this group alone
    TARGETED_RESEND = "targeted_resend"


class Anomaly(enum.StrEnum):
    """The kinds of finding with a detail table and a threshold."""

    LOST = "lost"
    STUCK = "stuck"
    DEAD = "dead"
    UNSENT = "unsent"
    DUPLICATES = "duplicates"
    ORPHANS = "orphans"
    GAPS = "gaps"
    NEVER_CONSUMED = "never_consumed"


@dataclass(frozen=True)
class ReconcileConfig:
    """What the report looks at and how old is "too old".

    ``as_of`` is the instant the ages are measured from (default: now); tests pin it so a planted anomaly is
    one for certain. ``since``/``until`` select *messages* by the stub's ``created_at`` (with every group's
    inbox row of them); every delivery of a selected message is counted whenever it happened (so a window
    never cuts a message's deliveries in half), while orphan logs and offset gaps look at the deliveries
    received inside the window.
    """

    as_of: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    grace_s: float = DEFAULT_GRACE_S
    stuck_after_s: float = C.DEFAULT_STUCK_AFTER_S
    attention_limit: int = DEFAULT_ATTENTION_LIMIT
    #: the sweeper's log retention: offset gaps are looked for only among deliveries received since
    #: ``as_of`` minus this (``None``: all). Older rows are what the log purge kept — the evidence of owed
    #: rows — and the holes around them are the purge's, not losses: a DEAD row's three kept deliveries made
    #: every purged offset around them a "gap" until the row was resolved (until 2026-11-28)
    log_retention_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("as_of", "since", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise OptionError(f"{name} must be timezone-aware (UTC), got naive {value.isoformat()}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise OptionError(
                f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})"
            )
        if self.grace_s < 0 or self.stuck_after_s < 0:
            raise OptionError("grace and stuck-after must not be negative")
        if self.log_retention_s is not None and self.log_retention_s <= 0:
            raise OptionError("log retention must be positive (None: look for gaps in the whole log)")
        if self.attention_limit < 0:
            raise OptionError("attention limit must not be negative")

    @property
    def windowed(self) -> bool:
        return self.since is not None or self.until is not None

    @property
    def complete_log_since(self) -> dt.datetime | None:
        """From when on the journal is whole (nothing purged): ``as_of`` minus the log retention."""
        if self.log_retention_s is None:
            return None
        return self.as_of - dt.timedelta(seconds=self.log_retention_s)


@dataclass(frozen=True)
class Thresholds:
    """Upper limits; a count above its limit makes the run exit with code 2 (``None`` = not checked)."""

    max_lost: int | None = None
    max_stuck: int | None = None
    max_dead: int | None = None
    max_unsent: int | None = None
    max_duplicates: int | None = None
    max_orphans: int | None = None
    max_gaps: int | None = None
    max_lag: int | None = None
    max_never_consumed: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value < 0:
                raise OptionError(f"{f.name.replace('_', '-')} must not be negative, got {value}")

    def as_dict(self) -> dict[str, int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
