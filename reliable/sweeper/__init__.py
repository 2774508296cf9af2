"""The resend sweeper (DESIGN.md §3): re-sends, per consumer group, what the group never received (proving
the loss with the broker's own offsets where the adapter can ask), recovers stuck rows, gives up on what
cannot be delivered and tells a person.

    from reliable.sweeper import Sweeper
    summary = Sweeper(rel, sender).run_once()

See docs/sweeper.md for the selection rules, the claim protocol, backoff and the deployment examples.
"""

from __future__ import annotations

from reliable.sweeper.backoff import (
    BacklogEstimator,
    BackoffPolicy,
    ExponentialBackoff,
    FixedBackoff,
    parse_backoff,
    parse_duration,
)
from reliable.sweeper.channels import Channel, EmailChannel, SmtpConfig, WebhookChannel
from reliable.sweeper.errors import NotifyError, SenderLoadError, SweeperConfigError, SweeperError
from reliable.sweeper.notices import DeadNotice, Notice, NoticeKind
from reliable.sweeper.resolve import GroupRevival, retire_group, revive, revive_group, void
from reliable.sweeper.retention import purge_logs
from reliable.sweeper.summary import RoundSummary
from reliable.sweeper.sweeper import Sweeper
from reliable.sweeper.verdict import RetrySchedule, RocketMQRetrySchedule, Verdict

__all__ = [
    "BacklogEstimator",
    "BackoffPolicy",
    "Channel",
    "DeadNotice",
    "EmailChannel",
    "ExponentialBackoff",
    "FixedBackoff",
    "GroupRevival",
    "Notice",
    "NoticeKind",
    "NotifyError",
    "RetrySchedule",
    "RocketMQRetrySchedule",
    "RoundSummary",
    "SenderLoadError",
    "SmtpConfig",
    "Sweeper",
    "SweeperConfigError",
    "SweeperError",
    "Verdict",
    "WebhookChannel",
    "parse_backoff",
    "parse_duration",
    "purge_logs",
    "retire_group",
    "revive",
    "revive_group",
    "void",
]
