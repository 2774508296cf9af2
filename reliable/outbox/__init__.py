"""The one owner of every ``message_stub`` / ``message_inbox`` write outside the guard's hot path.

Why one owner: the producer's first send and the sweeper's resends record the same facts (a send count, where
the copy landed, when the row is due again), and reviving, voiding and giving up each touch a stub *and* its
inbox rows. Written once here, the two tables cannot drift apart. The package's modules split the work by
moment: :mod:`.staging` (before the first send), :mod:`.sends` (every send's record), :mod:`.status` (the
stub's status and the transitions a group's row goes through); :mod:`.tables` names the tables. The guard's
own confirm/claim statements stay in :mod:`reliable.stores.sql` (the hot path, hand-rendered per dialect).

API (every function runs inside the caller's transaction; none commits)::

    stage(session, message_id, topic, body, groups=..., tags=None, now=..., resend_at=...) -> payload hash
        the stub PENDING + one PENDING inbox row per group (DuplicateMessageIdError if the id exists)
    attempt_send(sender, message) -> SendAttempt          any exception = not accepted (logged, never raised)
    record_sends(conn, [(attempt, resend_at), ...], now)  a topic send → the stub (and the due time of its
        PENDING inbox rows); a targeted send (message.target_group) → that group's inbox row, whose
        ``attempts`` a landed copy resets
    derive_status(conn, message_ids, now)                 the stub's status from its inbox rows
    settle(conn, now) -> int                              PENDING stubs whose groups all confirmed → CONFIRMED
    settle_slice(conn, now, after, limit) -> cursor       the same for the next `limit` PENDING stubs
    mark_dead(conn, message_id, group, now, error)        one group gave up → inbox DEAD, stub derived
    mark_dead_rows(conn, [(message_id, group, error), ...], now) -> set of (message_id, group) set DEAD
        the same for a batch (the sweeper's give-ups), in three statements
    revive(conn, message_id, now, group=None) -> int      DEAD inbox rows → PENDING, attempts and resends 0
    revive_rows(conn, message_ids, group, now) -> int     one group's DEAD rows → PENDING, stubs derived
    lock_messages(conn, message_ids) -> Locked            every group's inbox rows, then the stubs, locked
        in the guard's order before a person's revive or void reads and derives them
    void(conn, message_id, now) -> int                    stub and open inbox rows → VOIDED
    void_rows(conn, message_ids, group, now) -> int       one group's open rows → VOIDED, stubs derived
    prune_settled(engine, before) -> int                  messages every group settled before ``before``:
        stub, inbox rows and notices deleted (:mod:`.prune`; its own transactions)

Stub status (DESIGN.md §1): ``VOIDED`` stays; any inbox row ``DEAD`` → ``DEAD``; every row ``CONFIRMED`` (or
voided) → ``CONFIRMED``; otherwise ``PENDING``. The guard keeps it current in the transaction that confirms
the last group (exactly, also when two groups confirm at once: see ``SqlStore.settle_exact``). :func:`settle`
repairs stubs left behind by other writers (a person's SQL, an older version); the sweeper runs it a slice
per round (:func:`settle_slice`), so a round's cost does not grow with the number of PENDING stubs.

Lock order: every function here that writes both tables writes the inbox rows first, then the stub, and
several rows of one table in message id order — the order the guard takes them in (inbox rows locked by
``SELECT … FOR UPDATE … ORDER BY message_id``, then the stubs it settles) — so a producer recording a send
while a consumer confirms cannot deadlock (tests/core/test_producer_concurrency.py lines the two up).
"""

from __future__ import annotations

from reliable.outbox.sends import SendAttempt, attempt_send, record_sends
from reliable.outbox.staging import payload_hash, stage
from reliable.outbox.status import (
    Locked,
    SettleCursor,
    derive_status,
    lock_messages,
    mark_dead,
    mark_dead_rows,
    read_committed,
    revive,
    revive_rows,
    settle,
    settle_slice,
    stub_status,
    void,
    void_rows,
)
from reliable.outbox.tables import inbox, stub

__all__ = [
    "Locked",
    "SendAttempt",
    "SettleCursor",
    "attempt_send",
    "derive_status",
    "inbox",
    "lock_messages",
    "mark_dead",
    "mark_dead_rows",
    "payload_hash",
    "read_committed",
    "record_sends",
    "revive",
    "revive_rows",
    "settle",
    "settle_slice",
    "stage",
    "stub",
    "stub_status",
    "void",
    "void_rows",
]
