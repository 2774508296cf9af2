"""A small fan-out dataset with one planted anomaly of every kind, and the report it must produce.

Topic ``orders`` has three consumer groups (billing, audit, search) and topic ``payments`` two (billing,
audit), as the producer stages them (one stub per message, one inbox row per group). Planted per group: audit
*loses* one message and *lags* on queue 0, and its handler keeps failing two payments (one overdue for the
broker's redelivery: stuck; one still waiting for it: not); search *never consumed* queue 3; billing has a
stuck, a dead, a redelivered, a retried message; search receives a *targeted resend*; every group sees a
producer double-send; the broker loses a message and reuses its offset. Each planted row sits next to a
decoy that must *not* be reported.

Everything is relative to ``AS_OF``; with the default grace (5 min) and stuck_after (15 min) each planted
row is an anomaly for certain and each decoy certainly not one. ``EXPECTED`` is what the report must find,
and nothing else; it is written out by hand, not computed from the rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

AS_OF = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
A, B, C = "billing", "audit", "search"
LATE = "late-joiner"
T1, T2 = "orders", "payments"
ALL = (A, B, C)
#: a window that contains W-SPLIT's creation and first delivery but not its second delivery
WINDOW = (AS_OF - dt.timedelta(minutes=110), AS_OF - dt.timedelta(minutes=90))


def ago(minutes: float) -> dt.datetime:
    return AS_OF - dt.timedelta(minutes=minutes)


def retry(group: str) -> str:
    return f"%RETRY%{group}"


@dataclass
class Dataset:
    stubs: list[dict[str, Any]] = field(default_factory=list)
    inbox: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)
    _next_log_id: int = 1

    def stub(
        self,
        mid: str,
        queue: int | None,
        offset: int | None,
        *,
        status: str = "CONFIRMED",
        created: dt.datetime | None = None,
        send_count: int = 1,
        topic: str = T1,
    ) -> dt.datetime:
        created = created or ago(120)
        self.stubs.append(
            {
                "message_id": mid,
                "topic": topic,
                "tags": None,
                "content": b"{}",
                "payload_hash": None,
                "status": status,
                "send_count": send_count,
                "queue_id": queue,
                "queue_offset": offset,
                "resend_at": None,
                "created_at": created,
                "updated_at": created,
                "last_sent_at": created,
                "confirmed_at": created + dt.timedelta(milliseconds=250) if status == "CONFIRMED" else None,
                "last_error": None,
            }
        )
        return created

    def row(
        self,
        group: str,
        mid: str,
        status: str,
        created: dt.datetime,
        *,
        resend_count: int = 0,
        resend_at: tuple[int, int] | None = None,
        resend_topic: str | None = None,
    ) -> None:
        """One group's inbox row (confirmed 250 ms after the message was created); ``resend_at``: where its
        last targeted resend landed (queue, offset), ``resend_topic``: on which topic (None: unrecorded)."""
        self.inbox.append(
            {
                "consumer_group": group,
                "message_id": mid,
                "status": status,
                "attempts": 0,
                "payload_hash": None,
                "first_received_at": None,
                "confirmed_at": created + dt.timedelta(milliseconds=250) if status == "CONFIRMED" else None,
                "resend_count": resend_count,
                "resend_at": None,
                "queue_id": None if resend_at is None else resend_at[0],
                "queue_offset": None if resend_at is None else resend_at[1],
                "resend_topic": resend_topic,
                "last_error": None,
                "created_at": created,
                "updated_at": created,
            }
        )

    def log(
        self,
        group: str,
        mid: str,
        queue: int,
        offset: int,
        received: dt.datetime,
        *,
        reconsume: int = 0,
        topic: str = T1,
        original: str | None = None,
        outcome: str = "SUCCESS",
    ) -> None:
        """One delivery; ``topic`` is the delivered topic (``%RETRY%…`` for retries and targeted resends),
        ``outcome`` what the guard answered (``RETRY``: RECONSUME_LATER, the broker redelivers it)."""
        self.logs.append(
            {
                "id": self._next_log_id,
                "message_id": mid,
                "consumer_group": group,
                "topic": topic,
                "original_topic": original or topic,
                "queue_id": queue,
                "queue_offset": offset,
                "reconsume_times": reconsume,
                "received_at": received,
                "outcome": outcome,
                "worker": "w1",
                "reason": None,
            }
        )
        self._next_log_id += 1

    def finish_progress(self) -> None:
        """consume_progress = highest offset logged per (group, delivered topic, broker group, queue), as
        the guard keeps it."""
        best: dict[tuple[str, str, str, int], dict[str, Any]] = {}
        for row in self.logs:
            key = (row["consumer_group"], row["topic"], row.get("broker_name", ""), row["queue_id"])
            cur = best.get(key)
            if cur is None:
                best[key] = {
                    "consumer_group": key[0],
                    "topic": key[1],
                    "broker_name": key[2],
                    "queue_id": key[3],
                    "max_offset": row["queue_offset"],
                    "min_offset": row["queue_offset"],
                    "created_at": row["received_at"],
                    "updated_at": row["received_at"],
                    "received_count": 1,
                }
            else:
                cur["max_offset"] = max(cur["max_offset"], row["queue_offset"])
                cur["min_offset"] = min(cur["min_offset"], row["queue_offset"])
                cur["received_count"] += 1
        self.progress = list(best.values())


def normal(
    ds: Dataset,
    mid: str,
    queue: int,
    offset: int,
    *,
    groups: Sequence[str] = ALL,
    topic: str = T1,
    pending: Sequence[str] = (),
) -> dt.datetime:
    """A message that went right for ``groups``: each delivered once 50 ms after creation and confirmed;
    the groups in ``pending`` expect it too but never received it."""
    created = ds.stub(mid, queue, offset, topic=topic, status="PENDING" if pending else "CONFIRMED")
    for g in groups:
        ds.row(g, mid, "CONFIRMED", created)
        ds.log(g, mid, queue, offset, created + dt.timedelta(milliseconds=50), topic=topic)
    for g in pending:
        ds.row(g, mid, "PENDING", created)
    return created


def build() -> Dataset:
    ds = Dataset()
    # --- orders, queue 0: offsets 0..9 fine for everyone; 10..13 not yet reached by audit (its lag: 4)
    for off in range(10):
        normal(ds, f"ok-0-{off}", 0, off)
    for off in range(10, 14):
        normal(ds, f"LAG-{off}", 0, off, groups=(A, C), pending=(B,))
    ds.log(A, "ORPHAN-1", 0, 14, ago(119))  # a delivery nobody wrote a stub for

    # --- orders, queue 1: audit loses one message; a stuck one, and their decoys
    for off in (0, 1, 2, 4, 6, 8, 9):
        normal(ds, f"ok-1-{off}", 1, off)
    # below audit's watermark 9, old, never delivered to audit (billing and search got it) → lost for audit
    created = ds.stub("LOST-1", 1, 3, status="PENDING", created=ago(60))
    for g in (A, C):
        ds.row(g, "LOST-1", "CONFIRMED", created)
        ds.log(g, "LOST-1", 1, 3, ago(59))
    ds.row(B, "LOST-1", "PENDING", created)
    # below every watermark but within grace → not lost
    created = ds.stub("FRESH-1", 1, 5, status="PENDING", created=ago(1))
    for g in ALL:
        ds.row(g, "FRESH-1", "PENDING", created)
    # billing took it 30 min ago and never confirmed → stuck for billing; the others confirmed it
    created = ds.stub("STUCK-1", 1, 7, status="PENDING", created=ago(60))
    ds.row(A, "STUCK-1", "PENDING", created)
    ds.log(A, "STUCK-1", 1, 7, ago(30))
    for g in (B, C):
        ds.row(g, "STUCK-1", "CONFIRMED", created)
        ds.log(g, "STUCK-1", 1, 7, ago(59))
    # billing took it 1 min ago → not stuck (yet); above audit's and search's watermark → lag, not lost
    created = ds.stub("BUSY-1", 1, 10, status="PENDING", created=ago(2))
    for g in ALL:
        ds.row(g, "BUSY-1", "PENDING", created)
    ds.log(A, "BUSY-1", 1, 10, ago(1))
    # above every watermark: lag, not lost
    created = ds.stub("BACKLOG-1", 1, 12, status="PENDING", created=ago(60))
    for g in ALL:
        ds.row(g, "BACKLOG-1", "PENDING", created)

    # --- orders, queue 2: duplicates of every cause, a gap, a dead pair
    for off in (0, 1, 2, 5, 6, 13):
        normal(ds, f"ok-2-{off}", 2, off)
    # offsets 3 and 4 were never journaled by anyone: the planted gap (3..4) in each group's log
    created = normal(ds, "REDELIVER-1", 2, 7, groups=(B, C))
    ds.row(A, "REDELIVER-1", "CONFIRMED", created)
    ds.log(A, "REDELIVER-1", 2, 7, ago(119))
    ds.log(A, "REDELIVER-1", 2, 7, ago(118))  # same position again, reconsume 0: rebalance
    created = normal(ds, "RETRY-1", 2, 8, groups=(B, C))
    ds.row(A, "RETRY-1", "CONFIRMED", created)
    ds.log(A, "RETRY-1", 2, 8, ago(119))  # the handler failed: RECONSUME_LATER
    ds.log(A, "RETRY-1", 0, 0, ago(117), reconsume=1, topic=retry(A), original=T1)  # the broker's retry
    ds.log(A, "RETRY-1", 0, 1, ago(115), reconsume=2, topic=retry(A), original=T1)  # and once more
    created = ds.stub("DOUBLE-1", 2, 10, send_count=2)  # the stub remembers the second send's offset
    for g in ALL:
        ds.row(g, "DOUBLE-1", "CONFIRMED", created)
        ds.log(g, "DOUBLE-1", 2, 9, ago(119))
        ds.log(g, "DOUBLE-1", 2, 10, ago(118))  # other offset: producer double-send, seen by every group
    # search's worker died after taking it (stuck); the sweeper re-sent it to search alone
    created = normal(ds, "TARGETED-1", 2, 11, groups=(A,))
    ds.row(C, "TARGETED-1", "CONFIRMED", created, resend_count=1, resend_at=(0, 0))
    ds.log(C, "TARGETED-1", 2, 11, ago(119))
    ds.log(C, "TARGETED-1", 0, 0, ago(100), topic=retry(C), original=T1)
    # audit's copy was late, not lost: the sweeper's targeted copy overtook it, and the original came after —
    # a duplicate the resend made (counted as a producer double send until 2026-11-29)
    ds.row(B, "TARGETED-1", "CONFIRMED", created, resend_count=1, resend_at=(0, 0))
    ds.log(B, "TARGETED-1", 0, 0, ago(110), topic=retry(B), original=T1)
    ds.log(B, "TARGETED-1", 2, 11, ago(105))
    # billing's resends exhausted: DEAD for billing (a gap at 12 in billing's log), fine for the others
    created = normal(ds, "DEAD-1", 2, 12, groups=(B, C))
    ds.row(A, "DEAD-1", "DEAD", created, resend_count=7, resend_at=(0, 2))
    ds.stubs[-1]["status"] = "DEAD"

    # --- orders, queue 3: search never consumed it (no position at all); the others did
    for off in (0, 1):
        normal(ds, f"NC-{off}", 3, off, groups=(A, B), pending=(C,))

    # --- never sent successfully (no queue, no offset), for billing and audit only (explicit groups)
    created = ds.stub("UNSENT-1", None, None, status="PENDING", created=ago(60))
    for g in (A, B):
        ds.row(g, "UNSENT-1", "PENDING", created)

    # --- payments: two groups
    for off in range(5):
        normal(ds, f"pay-{off}", 0, off, groups=(A, B), topic=T2)
    # the broker lost REUSED-1 (power cut before flush) and stored pay-6 at the same offset after its restart:
    # both groups received offset 6, never REUSED-1 → lost for both (the watermark is *at* its offset)
    created = ds.stub("REUSED-1", 0, 6, status="PENDING", created=ago(60), topic=T2)
    for g in (A, B):
        ds.row(g, "REUSED-1", "PENDING", created)
    normal(ds, "pay-6", 0, 6, groups=(A, B), topic=T2)
    created = ds.stub("VOID-1", 0, 5, status="VOIDED", topic=T2)
    for g in (A, B):
        ds.row(g, "VOID-1", "VOIDED", created)
        ds.log(g, "VOID-1", 0, 5, ago(119), topic=T2)
    # a group the producer did not list: the guard gave it its own inbox row (not an orphan)
    # audit's handler keeps failing: each delivery answered RECONSUME_LATER. RETRY-WAIT's second delivery
    # (reconsume_times 1) came 15¼ min ago: the broker's next try is due 30 s after it (RocketMQ's delay
    # level 4) and the sweeper gives it stuck_after to be taken, so it holds the pair (BROKER_RETRY) — not
    # stuck (until 2026-11-29 the report called it stuck from stuck_after on). RETRY-DUE's came 16 min ago:
    # that redelivery is overdue → stuck for audit. Billing confirmed both.
    for mid, offset, newest in (("RETRY-WAIT", 7, 15.25), ("RETRY-DUE", 8, 16)):
        created = ds.stub(mid, 0, offset, status="PENDING", created=ago(30), topic=T2)
        ds.row(A, mid, "CONFIRMED", created)
        ds.log(A, mid, 0, offset, created + dt.timedelta(milliseconds=50), topic=T2)
        ds.row(B, mid, "PENDING", created)
        ds.log(B, mid, 0, offset, ago(25), topic=T2, outcome="RETRY")
        ds.log(B, mid, 0, offset - 6, ago(newest), reconsume=1, topic=retry(B), original=T2, outcome="RETRY")
    ds.row(LATE, "pay-0", "CONFIRMED", ago(120))
    ds.log(LATE, "pay-0", 0, 0, ago(119), topic=T2)
    # the window case: created and first delivered inside WINDOW, delivered again after it (billing)
    created = ds.stub("W-SPLIT", 1, 0, created=ago(100), topic=T2)
    for g in (A, B):
        ds.row(g, "W-SPLIT", "CONFIRMED", created)
        ds.log(g, "W-SPLIT", 1, 0, ago(95), topic=T2)
    ds.log(A, "W-SPLIT", 1, 0, ago(60), topic=T2)  # after the window's end: still billing's 2nd delivery
    # created before the window, delivered inside it: not in the windowed report, and not an orphan
    created = ds.stub("EARLY-1", 1, 1, created=ago(240), topic=T2)
    for g in (A, B):
        ds.row(g, "EARLY-1", "CONFIRMED", created)
        ds.log(g, "EARLY-1", 1, 1, ago(100), topic=T2)
    ds.finish_progress()
    return ds


#: what the unwindowed report must find: (group, message_id) pairs, by hand
EXPECTED: dict[str, Any] = {
    "lost": {(B, "LOST-1"), (A, "REUSED-1"), (B, "REUSED-1")},
    "stuck": {(A, "STUCK-1"), (B, "RETRY-DUE")},
    "dead": {(A, "DEAD-1")},
    "unsent": {(A, "UNSENT-1"), (B, "UNSENT-1")},
    "orphans": {(A, "ORPHAN-1")},
    # (group, message_id, cause) per extra delivery
    "duplicates": sorted(
        [
            (A, "DOUBLE-1", "producer_double_send"),
            (B, "DOUBLE-1", "producer_double_send"),
            (C, "DOUBLE-1", "producer_double_send"),
            (A, "REDELIVER-1", "redelivery"),
            (A, "RETRY-1", "retry"),
            (A, "RETRY-1", "retry"),
            (B, "RETRY-WAIT", "retry"),
            (B, "RETRY-DUE", "retry"),
            (B, "TARGETED-1", "targeted_resend"),
            (C, "TARGETED-1", "targeted_resend"),
            (A, "W-SPLIT", "redelivery"),
        ]
    ),
    # (group, topic, queue, start, end): the planted hole, and the holes the lost/fresh/dead pairs leave
    "gaps": sorted(
        [
            (A, T1, 1, 5, 5),
            (B, T1, 1, 3, 3),
            (B, T1, 1, 5, 5),
            (C, T1, 1, 5, 5),
            (A, T1, 2, 3, 4),
            (B, T1, 2, 3, 4),
            (C, T1, 2, 3, 4),
            (A, T1, 2, 12, 12),
        ]
    ),
    "never_consumed": [(C, T1, 3, 2, 2)],  # (group, topic, queue, inbox rows, pending)
    # lag per (group, topic, queue) where not 0: max stub offset − watermark (−1 when none)
    "lag": {
        (A, T1, 1): 2,  # BACKLOG-1 at 12, billing's watermark 10 (BUSY-1)
        (B, T1, 0): 4,  # LAG-10..13, audit's watermark 9
        (B, T1, 1): 3,  # BACKLOG-1 at 12, audit's watermark 9
        (C, T1, 1): 3,
        (C, T1, 3): 2,  # never consumed: offsets 0 and 1
    },
}
