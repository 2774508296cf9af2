"""A small dataset with one planted anomaly of every kind, and the report it must produce.

Everything is relative to ``AS_OF``; with the default grace (5 min) and stuck_after (15 min) each planted
row is an anomaly for certain and each decoy (the row next to it that must *not* be reported) is certainly
not one. ``EXPECTED`` is what the report must find, and nothing else.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

AS_OF = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
G1, T1 = "g-orders", "orders"
G2, T2 = "g-audit", "orders-audit"
#: a window that contains W-SPLIT's creation and first delivery but not its second delivery
WINDOW = (AS_OF - dt.timedelta(minutes=110), AS_OF - dt.timedelta(minutes=90))


def ago(minutes: float) -> dt.datetime:
    return AS_OF - dt.timedelta(minutes=minutes)


@dataclass
class Dataset:
    stubs: list[dict[str, Any]] = field(default_factory=list)
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
        group: str = G1,
        topic: str = T1,
    ) -> None:
        created = created or ago(120)
        self.stubs.append(
            {
                "message_id": mid,
                "topic": topic,
                "tags": None,
                "consumer_group": group,
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

    def log(
        self,
        mid: str,
        queue: int,
        offset: int,
        received: dt.datetime,
        *,
        reconsume: int = 0,
        group: str = G1,
        topic: str = T1,
    ) -> None:
        self.logs.append(
            {
                "id": self._next_log_id,
                "message_id": mid,
                "consumer_group": group,
                "topic": topic,
                "queue_id": queue,
                "queue_offset": offset,
                "reconsume_times": reconsume,
                "received_at": received,
                "outcome": "SUCCESS",
                "worker": "w1",
                "reason": None,
            }
        )
        self._next_log_id += 1

    def finish_progress(self) -> None:
        """consume_progress = highest offset logged per (group, topic, queue), as the consumer keeps it."""
        best: dict[tuple[str, str, int], dict[str, Any]] = {}
        for row in self.logs:
            key = (row["consumer_group"], row["topic"], row["queue_id"])
            cur = best.get(key)
            if cur is None:
                best[key] = {
                    "consumer_group": key[0],
                    "topic": key[1],
                    "queue_id": key[2],
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


def normal(ds: Dataset, mid: str, queue: int, offset: int, *, group: str = G1, topic: str = T1) -> None:
    """A message that went right: stub confirmed, delivered once 50 ms after creation."""
    ds.stub(mid, queue, offset, group=group, topic=topic)
    ds.log(mid, queue, offset, ago(120) + dt.timedelta(milliseconds=50), group=group, topic=topic)


def build() -> Dataset:
    ds = Dataset()
    # queue 0: offsets 0..9 all fine
    for off in range(10):
        normal(ds, f"ok-0-{off}", 0, off)
    # queue 1: offsets 0..9 fine except the planted ones
    for off in (0, 1, 2, 4, 6, 8, 9):
        normal(ds, f"ok-1-{off}", 1, off)
    ds.stub("LOST-1", 1, 3, status="PENDING", created=ago(60))  # below watermark 9, old, never logged → lost
    ds.stub("FRESH-1", 1, 5, status="PENDING", created=ago(1))  # below watermark but within grace → not lost
    ds.stub("STUCK-1", 1, 7, status="PENDING", created=ago(60))  # logged 30 min ago, never confirmed → stuck
    ds.log("STUCK-1", 1, 7, ago(30))
    ds.stub("BUSY-1", 1, 10, status="PENDING", created=ago(2))  # logged 1 min ago → not stuck (yet)
    ds.log("BUSY-1", 1, 10, ago(1))
    ds.stub("BACKLOG-1", 1, 12, status="PENDING", created=ago(60))  # above the watermark: lag, not lost
    # queue 2: duplicates of every cause, a gap, a dead message
    for off in (0, 1, 2, 5, 6):
        normal(ds, f"ok-2-{off}", 2, off)
    # offsets 3 and 4 never journaled: the planted gap (3..4)
    ds.stub("REDELIVER-1", 2, 7)
    ds.log("REDELIVER-1", 2, 7, ago(119))
    ds.log("REDELIVER-1", 2, 7, ago(118))  # same offset again, reconsume 0: rebalance
    ds.stub("RETRY-1", 2, 8)
    ds.log("RETRY-1", 2, 8, ago(119))
    ds.log("RETRY-1", 2, 8, ago(117), reconsume=1)  # same offset, reconsume 1: retry
    ds.log("RETRY-1", 2, 8, ago(115), reconsume=2)  # and once more
    ds.stub("DOUBLE-1", 2, 10, send_count=2)  # the stub remembers the second send's offset
    ds.log("DOUBLE-1", 2, 9, ago(119))
    ds.log("DOUBLE-1", 2, 10, ago(118))  # other offset: producer double-send
    ds.stub("DEAD-1", 2, 11, status="DEAD", send_count=8)  # resends exhausted
    ds.log("ok-2-12", 2, 12, ago(119))
    ds.stub("ok-2-12", 2, 12)
    # never sent successfully: no queue, no offset
    ds.stub("UNSENT-1", None, None, status="PENDING", created=ago(60))
    ds.stub("VOID-1", 0, 10, status="VOIDED")
    ds.log("VOID-1", 0, 10, ago(119))
    # a delivery nobody wrote a stub for
    ds.log("ORPHAN-1", 0, 11, ago(119))
    # the window case: created and first delivered inside WINDOW, delivered again after it
    ds.stub("W-SPLIT", 3, 0, created=ago(100))
    ds.log("W-SPLIT", 3, 0, ago(95))
    ds.log("W-SPLIT", 3, 0, ago(60))  # after the window's end: still this message's second delivery
    # created before the window, delivered inside it: not in the windowed report, and not an orphan
    ds.stub("EARLY-1", 3, 1, created=ago(240))
    ds.log("EARLY-1", 3, 1, ago(100))
    # a second group reading the same topic: its delivery of a g-orders message is not an orphan
    normal(ds, "ok-audit-0", 0, 0, group=G2, topic=T2)
    ds.log("ok-0-1", 0, 1, ago(119), group=G2, topic=T2)
    ds.finish_progress()
    return ds


#: what the unwindowed report must find
EXPECTED = {
    "lost": {"LOST-1"},
    "stuck": {"STUCK-1"},
    "dead": {"DEAD-1"},
    "unsent": {"UNSENT-1"},
    "orphans": {"ORPHAN-1"},
    # (message_id, cause) per extra delivery
    "duplicates": sorted(
        [
            ("DOUBLE-1", "producer_double_send"),
            ("REDELIVER-1", "redelivery"),
            ("RETRY-1", "retry"),
            ("RETRY-1", "retry"),
            ("W-SPLIT", "redelivery"),
        ]
    ),
    # (group, topic, queue, start, end): the planted hole, and the holes the lost/fresh stubs leave
    "gaps": sorted(
        [
            (G1, T1, 1, 3, 3),
            (G1, T1, 1, 5, 5),
            (G1, T1, 2, 3, 4),
            (G1, T1, 2, 11, 11),
        ]
    ),
}
