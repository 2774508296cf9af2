"""Migrations that move data: what 0003 (one row per group), 0006 (broker names), 0010 and 0011 carry forward
and back.

Each test seeds a database at the revision before, upgrades, checks every row, downgrades and checks again
(``tests.migration_support`` gives each test databases of its own).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text

from reliable.migrate import downgrade, upgrade
from tests.migration_support import KINDS, TABLES, engine_for, fresh_databases, snapshot


@pytest.fixture
def fresh(tmp_path: Path) -> Callable[[str], AbstractContextManager[str]]:
    """``fresh(kind)``: a context manager giving the URL of an empty database nobody else uses."""
    return fresh_databases(tmp_path)


# --- 0003: data moved forward and back -------------------------------------------------------------------

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _rows(engine: Engine, table: str, *, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every row of ``table``, key-sorted, timestamps as UTC-aware values (backend-neutral)."""
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {table}"))]
    out = []
    for r in rows:
        for k, v in list(r.items()):
            if k in skip:
                del r[k]
            elif isinstance(v, dt.datetime):
                r[k] = v if v.tzinfo else v.replace(tzinfo=dt.UTC)
            elif isinstance(v, str) and k.endswith("_at") and v:
                r[k] = dt.datetime.fromisoformat(v).replace(tzinfo=dt.UTC)
            elif isinstance(v, memoryview):
                r[k] = bytes(v)
        out.append(r)
    return sorted(out, key=lambda r: sorted((k, str(v)) for k, v in r.items()))


def _unordered(schema: dict[str, Any]) -> dict[str, Any]:
    """A snapshot with columns sorted: a downgrade re-adds a dropped column last (no backend can place it)."""
    return {t: {**v, "columns": sorted(v["columns"])} for t, v in schema.items()}


def _seed_0002(engine: Engine) -> None:
    """A 0002 database as the one-group code left it: producer stubs, a guard-made stub, failures, notices."""
    stub = (
        "INSERT INTO message_stub (message_id, topic, tags, consumer_group, content, payload_hash, status,"
        " send_count, queue_id, queue_offset, resend_at, created_at, updated_at, last_sent_at, confirmed_at,"
        " last_error) VALUES (:m, 'orders', NULL, :g, :c, :h, :s, :n, :q, :o, :r, :t0, :t1, :ls, :ca, :e)"
    )
    later = T0 + dt.timedelta(seconds=5)
    cols = ("m", "g", "c", "h", "s", "n", "q", "o", "r", "t0", "t1", "ls", "ca", "e")
    rows = [
        dict(zip(cols, values, strict=True))
        for values in (
            # producer stub, resent twice, handler failed twice in g1
            ("a", "g1", b"A", "ha", "PENDING", 3, 1, 7, later, T0, later, later, None, "timeout"),
            # producer stub, sent once, confirmed later
            ("b", "g2", b"B", "hb", "CONFIRMED", 1, 0, 3, later, T0, later, T0, later, None),
            # the old guard's own row (inbox pattern): confirmed when created, never sent
            ("c", "g1", b"C", "hc", "CONFIRMED", 0, None, None, None, T0, T0, None, T0, None),
            # resends exhausted
            ("d", "g1", b"D", "hd", "DEAD", 8, 2, 9, None, T0, later, later, None, "gave up"),
        )
    ]
    log = (
        "INSERT INTO message_log (message_id, consumer_group, topic, queue_id, queue_offset, reconsume_times,"
        " received_at, outcome, reason) VALUES (:m, :g, 'orders', 1, :o, 0, :t, :out, :why)"
    )
    logs = [
        dict(m="a", g="g1", o=7, t=T0 + dt.timedelta(seconds=1), out="RETRY", why="handler_failed: boom"),
        dict(m="a", g="g1", o=7, t=T0 + dt.timedelta(seconds=2), out="RETRY", why="handler_failed: boom"),
        dict(m="a", g="g1", o=7, t=T0 + dt.timedelta(seconds=3), out="RETRY", why="lease_conflict"),
        dict(m="c", g="g1", o=4, t=T0, out="SUCCESS", why="processed"),
    ]
    notice = (
        "INSERT INTO stub_notification (message_id, channel, reason, created_at, attempts)"
        " VALUES ('d', :ch, 'resends exhausted', :t, 0)"
    )
    with engine.begin() as conn:
        conn.execute(text(stub), rows)
        conn.execute(text(log), logs)
        conn.execute(text(notice), [dict(ch="log", t=T0), dict(ch="email", t=T0)])


@pytest.mark.parametrize("kind", KINDS)
def test_0003_moves_data_forward_and_back(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0002")
        schema_0002 = _unordered(snapshot(engine))
        _seed_0002(engine)
        before = {
            t: _rows(engine, t, skip=("id",)) for t in ("message_stub", "message_log", "stub_notification")
        }

        upgrade(engine, "0003")
        inbox = {(r["consumer_group"], r["message_id"]): r for r in _rows(engine, "message_inbox")}
        assert set(inbox) == {("g1", "a"), ("g2", "b"), ("g1", "c"), ("g1", "d")}
        a = inbox["g1", "a"]
        # attempts: journaled handler failures only (not the lease conflict); resends: send_count - 1
        assert (a["status"], a["attempts"], a["resend_count"], a["last_error"]) == (
            "PENDING",
            2,
            2,
            "timeout",
        )
        assert a["resend_at"] == T0 + dt.timedelta(seconds=5) and a["payload_hash"] == "ha"
        assert a["first_received_at"] == T0 + dt.timedelta(seconds=1)
        assert inbox["g2", "b"]["status"] == "CONFIRMED" and inbox["g2", "b"]["confirmed_at"] is not None
        assert inbox["g1", "d"]["status"] == "DEAD"
        # the guard-made row is an inbox row now, not a producer stub; the rest keep their send history
        stubs = {r["message_id"]: r for r in _rows(engine, "message_stub")}
        assert set(stubs) == {"a", "b", "d"}
        assert (stubs["a"]["send_count"], stubs["a"]["queue_id"], stubs["a"]["queue_offset"]) == (3, 1, 7)
        assert {r["original_topic"] for r in _rows(engine, "message_log")} == {"orders"}
        notices = _rows(engine, "stub_notification")
        assert {(n["message_id"], n["consumer_group"], n["channel"]) for n in notices} == {
            ("d", "g1", "log"),
            ("d", "g1", "email"),
        }
        at_0003 = TABLES & set(inspect(engine).get_table_names())  # later revisions add more tables
        after_up = {t: _rows(engine, t, skip=("id",)) for t in at_0003}

        downgrade(engine, "0002")
        assert _unordered(snapshot(engine)) == schema_0002
        back = {t: _rows(engine, t, skip=("id",)) for t in before}
        # the guard-made row comes back as the old guard's stub, with an empty body (0003 keeps no body)
        expected_stubs = [
            {**r, "content": b"", "tags": None} if r["message_id"] == "c" else r
            for r in before["message_stub"]
        ]
        assert back["message_stub"] == expected_stubs
        assert back["message_log"] == before["message_log"]
        assert back["stub_notification"] == before["stub_notification"]

        upgrade(engine, "0003")
        assert {t: _rows(engine, t, skip=("id",)) for t in at_0003} == after_up


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0003_downgrade_keeps_one_group_of_a_fan_out(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """The 0002 schema holds one group per message: the group that still owes work is the one kept."""
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0003")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO message_stub (message_id, topic, content, payload_hash, status, send_count,"
                    " created_at, updated_at) VALUES ('f', 'orders', :c, 'hf', 'PENDING', 1, :t, :t)"
                ),
                dict(c=b"F", t=T0),
            )
            conn.execute(
                text(
                    "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, resend_count,"
                    " created_at, updated_at) VALUES (:g, 'f', :s, 0, :n, :t, :t)"
                ),
                [
                    dict(g="audit", s="CONFIRMED", n=0, t=T0),
                    dict(g="billing", s="PENDING", n=4, t=T0),
                    dict(g="search", s="PENDING", n=0, t=T0),
                ],
            )
        downgrade(engine, "0002")
        (stub,) = _rows(engine, "message_stub")
        # billing: the first group still owing work; its 4 targeted resends count against the old budget
        assert (stub["consumer_group"], stub["status"], stub["send_count"]) == ("billing", "PENDING", 5)


@pytest.mark.parametrize("kind", KINDS)
def test_0006_broker_name_moves_data_forward_and_back(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """0006 adds the broker group to every position ('' for existing rows) and to the watermark's key; the
    downgrade folds the watermarks of one queue id on several groups into the one row the old key holds."""
    progress = (
        "INSERT INTO consume_progress (consumer_group, topic, {b}queue_id, max_offset, min_offset,"
        " created_at, updated_at, received_count) VALUES (:g, 'orders', {bv}:q, :hi, :lo, :c, :u, :n)"
    )
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0005")
        schema_0005 = _unordered(snapshot(engine))
        t1, t2 = T0 + dt.timedelta(seconds=1), T0 + dt.timedelta(seconds=2)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO message_stub (message_id, topic, content, status, send_count, queue_id,"
                    " queue_offset, created_at, updated_at)"
                    " VALUES ('a', 'orders', :c, 'PENDING', 1, 0, 7, :t, :t)"
                ),
                dict(c=b"A", t=T0),
            )
            conn.execute(
                text(
                    "INSERT INTO message_log (message_id, consumer_group, topic, queue_id, queue_offset,"
                    " reconsume_times, received_at) VALUES ('a', 'g', 'orders', 0, 7, 0, :t)"
                ),
                dict(t=T0),
            )
            conn.execute(text(progress.format(b="", bv="")), dict(g="g", q=0, hi=7, lo=0, c=T0, u=T0, n=8))
        before = {t: _rows(engine, t) for t in ("message_stub", "message_log", "consume_progress")}

        upgrade(engine, "0006")
        for table, rows in before.items():  # every old row kept, with broker_name ''
            assert _rows(engine, table) == [{**r, "broker_name": ""} for r in rows]
        with engine.begin() as conn:  # two groups' queue 0 now have a watermark each, beside the old row
            conn.execute(
                text(progress.format(b="broker_name, ", bv=":b, ")),
                [
                    dict(g="g", b="broker-a", q=0, hi=90, lo=3, c=t1, u=t1, n=5),
                    dict(g="g", b="broker-b", q=0, hi=2, lo=1, c=t2, u=t2, n=2),
                ],
            )
        assert len(_rows(engine, "consume_progress")) == 3

        downgrade(engine, "0005")
        assert _unordered(snapshot(engine)) == schema_0005
        (folded,) = _rows(engine, "consume_progress")
        assert (folded["max_offset"], folded["min_offset"], folded["received_count"]) == (90, 0, 15)
        assert (folded["created_at"], folded["updated_at"]) == (T0, t2)
        assert _rows(engine, "message_stub") == before["message_stub"]
        assert _rows(engine, "message_log") == before["message_log"]

        upgrade(engine, "0006")
        assert [r["broker_name"] for r in _rows(engine, "consume_progress")] == [""]


@pytest.mark.parametrize("kind", KINDS)
def test_0010_moves_never_consumed_alarms_onto_their_queue_key(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """Before 0010 a never-consumed alarm was owed on an example message's key, and that message's give-up
    deleted it (never told, never raised again): its rows move onto the marker's ``~never:`` key; a DEAD
    notice of another message, and an alarm without a marker (raised before markers existed), stay."""
    notice = (
        "INSERT INTO stub_notification (message_id, consumer_group, channel, reason, created_at, notified_at,"
        " attempts) VALUES (:m, :g, :ch, :r, :t, :n, :a)"
    )
    alarm, old = "NEVER_CONSUMED topic=orders queue=3: subscribe it", "NEVER_CONSUMED topic=orders queue=9: x"
    rows = [
        dict(m="~never:abc", g="billing", ch="log", r=alarm, t=T0, n=T0, a=0),  # the marker
        dict(m="w1", g="billing", ch="log", r=alarm, t=T0, n=T0, a=0),  # the alarm on its example message
        dict(m="w1", g="billing", ch="webhook", r=alarm, t=T0, n=None, a=2),  # … still owed there
        dict(m="w1", g="billing", ch="email", r=alarm, t=T0, n=T0, a=1),  # … delivered there
        dict(m="d1", g="billing", ch="webhook", r="DEAD: gone", t=T0, n=None, a=0),
        dict(m="w9", g="billing", ch="webhook", r=old, t=T0, n=None, a=0),
    ]
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0009")
        with engine.begin() as conn:
            conn.execute(text(notice), rows)
        upgrade(engine, "0010")
        got = {
            (r["message_id"], r["channel"]): (r["notified_at"] is not None, r["attempts"])
            for r in _rows(engine, "stub_notification")
        }
        assert got == {
            ("~never:abc", "log"): (True, 0),
            ("~never:abc", "webhook"): (False, 2),
            ("~never:abc", "email"): (True, 1),
            ("d1", "webhook"): (False, 0),
            ("w9", "webhook"): (False, 0),
        }
        downgrade(engine, "0009")
        assert len(_rows(engine, "stub_notification")) == 5


@pytest.mark.parametrize("kind", KINDS)
def test_0011_resend_topic_is_added_empty_and_dropped_with_the_rows_kept(
    kind: str, fresh: Callable[[str], AbstractContextManager[str]]
) -> None:
    """0011 records where a targeted resend landed: existing rows get no topic (which sender wrote them is
    not known — readers keep their old assumption), a topic written after survives until the downgrade, which
    drops only the column."""
    inbox = (
        "INSERT INTO message_inbox (consumer_group, message_id, status, attempts, resend_count, queue_id,"
        " queue_offset, broker_name, created_at, updated_at)"
        " VALUES (:g, :m, 'PENDING', 0, :n, :q, :o, :b, :t, :t)"
    )
    with fresh(kind) as url, engine_for(url) as engine:
        upgrade(engine, "0010")
        schema_0010 = _unordered(snapshot(engine))
        with engine.begin() as conn:
            conn.execute(
                text(inbox),
                [
                    dict(g="billing", m="a", n=2, q=0, o=17, b="broker-a", t=T0),  # resent, position kept
                    dict(g="audit", m="a", n=0, q=None, o=None, b="", t=T0),  # the producer's copy only
                ],
            )
        before = _rows(engine, "message_inbox")

        upgrade(engine, "0011")
        assert _rows(engine, "message_inbox") == [{**r, "resend_topic": None} for r in before]
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE message_inbox SET resend_topic = :t WHERE consumer_group = 'billing'"),
                dict(t="%RETRY%billing"),
            )
        assert {r["consumer_group"]: r["resend_topic"] for r in _rows(engine, "message_inbox")} == {
            "billing": "%RETRY%billing",
            "audit": None,
        }

        downgrade(engine, "0010")
        assert _unordered(snapshot(engine)) == schema_0010
        assert _rows(engine, "message_inbox") == before
