"""Prometheus metrics of the sweeper (process-wide: one set however many Sweeper objects a process has).

Exposed with ``--metrics-port`` (``prometheus_client.start_http_server`` on 127.0.0.1) or by whatever
exporter the host process already runs on the default registry; a ``--once`` sweeper run by cron is gone
before any scrape, so ``--metrics-textfile PATH`` writes them for node_exporter's textfile collector.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, start_http_server, write_to_textfile

ROUNDS = Counter("reliable_sweeper_rounds", "Sweep rounds completed")
ROUND_ERRORS = Counter("reliable_sweeper_round_errors", "Sweep rounds that ended with an error")
SELECTED = Counter("reliable_sweeper_selected", "Inbox rows selected as due (resend, hold and give-up)")
RESENT = Counter("reliable_sweeper_resent", "Inbox rows re-sent and accepted by the broker")
#: why rows were re-sent or held: never_sent, overtaken, lost, too_old, stuck, queued, broker_retry, …
VERDICTS = Counter("reliable_sweeper_verdicts", "Selected rows by verdict", ["verdict"])
#: the never-consumed alarm: a group has stubs on a queue it has never consumed (the broker has them)
NEVER_CONSUMED = Counter(
    "reliable_sweeper_never_consumed",
    "Rows found on a queue their group never consumed (alarm, no resend)",
    ["group", "topic", "broker_name", "queue_id"],
)
#: the stalled-group alarm: seconds a group's watermark has been still on a queue it owes messages on
#: (0 once the stall cleared); one notice per stall episode
STALLED_SECONDS = Gauge(
    "reliable_sweeper_stalled_seconds",
    "Seconds a group's watermark has not moved on a queue where the broker holds messages it owes (0: not)",
    ["group", "topic", "broker_name", "queue_id"],
)
STALL_ALARMS = Counter("reliable_sweeper_stall_alarms", "Stalled-group alarms raised (one per episode)")
#: the broker probe (max offset of a queue, the loss proof) did not answer: by broker group ("" when the
#: question named none); the rows it concerned are held, not proved lost
PROBE_FAILURES = Counter(
    "reliable_sweeper_probe_failures", "Broker probes that failed (no loss proof)", ["broker_name"]
)
SEND_FAILURES = Counter("reliable_sweeper_send_failures", "Resends the broker did not accept")
SEND_PAUSES = Counter(
    "reliable_sweeper_send_pauses", "Rounds whose resends stopped early: the broker looked down"
)
STUCK_RECOVERED = Counter(
    "reliable_sweeper_stuck_recovered", "Stuck stubs (received, never confirmed) re-sent"
)
LEASE_HELD = Counter("reliable_sweeper_lease_held", "Stuck stubs left alone because a worker holds the lease")
LEASE_UNKNOWN = Counter(
    "reliable_sweeper_lease_unknown", "Stuck stubs postponed because Redis did not answer"
)
#: how long the sweeper's Redis lease reads have been failing (0: the last one answered); past stuck_after
#: every round logs an ERROR and one notice goes out an outage (reliable/sweeper/redis_outage.py: kept in the
#: database, so a sweeper run once by cron counts it too)
REDIS_UNREADABLE_SECONDS = Gauge(
    "reliable_sweeper_redis_unreadable_seconds",
    "Seconds the sweeper's Redis lease reads have been failing (0: the last one answered)",
)
#: every (message, group) row gone DEAD: given up by the sweeper, or dead-lettered by the guard (its handler
#: failed max_attempts times) and told by the sweeper — the page of docs/operations.md
DEAD = Counter("reliable_sweeper_dead", "Rows gone DEAD (given up, or dead-lettered by the guard) and told")
#: the guard's share of DEAD: rows its handler dead-lettered
DEAD_LETTERED = Counter(
    "reliable_sweeper_dead_lettered", "Rows the guard dead-lettered (handler failed max_attempts), told"
)
CLAIM_RELEASED = Counter(
    "reliable_sweeper_claim_released", "Claimed rows left unsent because the claim window ran out first"
)
PURGED = Counter("reliable_sweeper_log_purged", "message_log rows deleted by retention")
NOTIFIED = Counter("reliable_sweeper_notified", "Dead-stub notices accepted by a channel", ["channel"])
NOTIFY_FAILURES = Counter("reliable_sweeper_notify_failures", "Channel deliveries that failed", ["channel"])
#: notices owed per channel (every channel with owed rows, one no sweeper has any more included), and how
#: long the oldest has waited: a channel down, or dropped from the configuration, shows here
NOTICES_OWED = Gauge("reliable_sweeper_notices_owed", "Notices a channel still owes a person", ["channel"])
NOTICES_OWED_OLDEST_SECONDS = Gauge(
    "reliable_sweeper_notices_owed_oldest_seconds",
    "Seconds since the oldest notice a channel still owes was raised (0: none owed)",
    ["channel"],
)
LAST_ROUND_SECONDS = Gauge("reliable_sweeper_last_round_seconds", "Duration of the last round")
LAST_ROUND_TIMESTAMP = Gauge("reliable_sweeper_last_round_timestamp", "Unix time the last round ended")


def serve(port: int) -> None:
    """Serve /metrics on 127.0.0.1:``port`` from a daemon thread."""
    start_http_server(port, addr="127.0.0.1")


def write_textfile(path: str) -> None:
    """Write every metric to ``path`` in the text format (atomically: a temporary file renamed)."""
    write_to_textfile(path, REGISTRY)
