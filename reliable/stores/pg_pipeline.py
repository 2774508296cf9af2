"""PostgreSQL: a guard statement and ``BEGIN``/``COMMIT`` in one round trip, straight through libpq.

Why not psycopg's ``Connection.pipeline()``: it is the right tool for a batch of many statements, but the
guard sends two statements per transaction edge, and psycopg's pipeline machinery (generators, result
queues, adapters per call, its own prepared-statement bookkeeping) cost ~190 µs of client CPU per delivery —
more than the two round trips it saves. libpq's pipeline mode does the same on the wire with a handful of
calls, so the opener and the closer are sent here with the ``PGconn`` psycopg wraps::

    enter pipeline mode
    BEGIN                              (opener only)
    Close + Parse  rel_…  (once per connection, or again after a rollback: see below)
    Bind/Execute   rel_…  ($1 … $n as text)
    COMMIT                             (closer only)
    Sync  ── one flush, one wait ──▶  results read to the Sync; exit pipeline mode

The server plans each statement once per connection (named prepared statement ``rel_<hash of its
text>``), as before.

Prepared statements and psycopg: psycopg discards *every* prepared statement of a session (``DEALLOCATE
ALL``) when it rolls back a transaction while holding prepared statements of its own (a handler's query that
ran five times is one), so a rollback seen on the connection makes the next opener re-parse: ``Close`` (not an
error when the statement is gone) then ``Parse``, in the same round trip. Statements lost any other way —
psycopg does the same when it sees a ``DROP`` or ``ALTER`` committed on the connection, a pooler may
``DISCARD ALL`` — make the opener fail with SQLSTATE 26000 before anything of its transaction ran: it is
rolled back and sent again with ``Parse`` (two round trips more, once). Lost between the opener and the closer
(a ``DEALLOCATE ALL`` sent behind psycopg's back while the handler runs), the closer fails and the delivery
with it: answered ``database_unavailable``, redelivered, re-parsed.

Parameters go as text (the server parses them with the types it inferred at ``Parse``): ``str``, ``int``,
``bool``, ``float``, aware ``datetime`` and ``None`` — what the guard binds; anything else raises
``TypeError`` (a bug, not bad input). Values come back as text (``str``); callers convert (``int(…)``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import re
import select
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import errors, pq

from reliable.stores.sql_text import last_one

# enum members looked up once: these are compared several times per round trip
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_FATAL = pq.ExecStatus.FATAL_ERROR
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_PIPELINE_OFF = pq.PipelineStatus.OFF
_CONN_OK = pq.ConnStatus.OK
_PLACEHOLDER = re.compile(r"%s|%%")

#: key in a pooled connection's ``info``: (the PGconn the names were prepared on, names prepared there)
PREPARED_KEY = "reliable_pq_prepared"


class Statements:
    """The guard's statements as libpq wants them: ``$n`` placeholders, and a server-side name derived from
    the text (``rel_<hash>``), so every guard and runner of the process agrees on what a name means."""

    def __init__(self) -> None:
        self._names: dict[str, tuple[bytes, bytes]] = {}

    def get(self, sql: str) -> tuple[bytes, bytes]:
        """(statement name, text with ``$1 … $n``) for ``sql`` written with psycopg's ``%s``."""
        found = self._names.get(sql)
        if found is None:  # two threads may both build it: same result, last write wins
            n = itertools.count(1)
            text = _PLACEHOLDER.sub(lambda m: "%" if m.group() == "%%" else f"${next(n)}", sql)
            digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
            found = self._names[sql] = (f"rel_{digest}".encode(), text.encode())
        return found


def _to_text(value: dt.datetime) -> bytes:
    if value.tzinfo is None:
        raise TypeError("naive datetime bound for PostgreSQL: the guard binds UTC-aware timestamps")
    return value.isoformat().encode()


#: a delivery binds one ``now`` up to seven times: converted once
_aware = last_one(_to_text)


#: exact type → text input format (a dict lookup per value: this runs ~30 times per delivery)
_TEXT: dict[type, Callable[[Any], bytes]] = {
    str: str.encode,
    int: lambda v: b"%d" % v,
    bool: lambda v: b"t" if v else b"f",
    float: lambda v: repr(v).encode(),
    dt.datetime: _aware,
}


def as_text(value: Any) -> bytes | None:
    """One parameter in PostgreSQL's text input format."""
    if value is None:
        return None
    conv = _TEXT.get(type(value))
    if conv is None:  # a subclass (a str enum, a pendulum datetime): the nearest base that has one
        conv = next((_TEXT[t] for t in type(value).__mro__ if t in _TEXT), None)
    if conv is None:
        raise TypeError(f"cannot bind {type(value).__name__} as a PostgreSQL text parameter")
    return conv(value)


#: SQLSTATE invalid_sql_statement_name: a prepared statement the session no longer has
LOST_STATEMENT = "26000"


def roll_back(pgconn: Any) -> None:
    """End the session's failed transaction (outside pipeline mode); ``OperationalError`` if that fails."""
    res = pgconn.exec_(b"ROLLBACK")
    if res.status != _COMMAND_OK:
        message = res.error_message.decode("utf-8", "replace").strip()
        raise errors.OperationalError(f"ROLLBACK failed: {message}")


def prepared_on(info: dict[str, Any], pgconn: Any) -> set[bytes]:
    """The names already prepared on ``pgconn`` (kept in its pool record's ``info``; reset per PGconn)."""
    entry = info.get(PREPARED_KEY)
    if entry is None or entry[0] is not pgconn:
        entry = info[PREPARED_KEY] = (pgconn, set())
    names: set[bytes] = entry[1]
    return names


class Outcome:
    """What one pipelined round trip returned: the statement's rows (text) and row count, or the error."""

    __slots__ = ("error", "rowcount", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple[str | None, ...]] = []
        self.rowcount = -1
        self.error: errors.Error | None = None


def run(
    pgconn: Any,
    prepared: set[bytes],
    statement: tuple[bytes, bytes],
    params: Sequence[Any],
    *,
    before: bytes | None,
    after: bytes | None,
    encoding: str = "utf-8",
) -> Outcome:
    """``before`` (e.g. ``BEGIN``), the prepared ``statement``, ``after`` (e.g. ``COMMIT``): one round trip.

    Raises psycopg's ``OperationalError`` when the connection fails (the caller invalidates it); a statement
    error comes back in :attr:`Outcome.error` after every result was read, so the connection is idle again.
    """
    name, text = statement
    text_of = _TEXT.get  # the exact-type lookup inline; as_text for None and the rest
    values = [conv(v) if (conv := text_of(type(v))) is not None else as_text(v) for v in params]
    pgconn.enter_pipeline_mode()
    try:
        if before is not None:
            pgconn.send_query_params(before, None)
        if name not in prepared:
            pgconn.send_close_prepared(name)
            pgconn.send_prepare(name, text, None)
        pgconn.send_query_prepared(name, values)
        if after is not None:
            pgconn.send_query_params(after, None)
        pgconn.pipeline_sync()
        _flush(pgconn)
        out = _read(pgconn, encoding)
    finally:
        if pgconn.pipeline_status != _PIPELINE_OFF and pgconn.status == _CONN_OK:
            pgconn.exit_pipeline_mode()
    if out.error is None:
        prepared.add(name)
    else:
        prepared.clear()  # the transaction is rolled back now: psycopg may deallocate everything
    return out


def _flush(pgconn: Any) -> None:
    poller: Any = None
    while pgconn.flush():  # 1: the socket buffer is full, wait until it drains (poll: any fd number)
        if poller is None:
            poller = select.poll()
            poller.register(pgconn.socket, select.POLLOUT)
        poller.poll()


def _read(pgconn: Any, encoding: str) -> Outcome:
    """Every result up to the Sync; the statement's is the one with rows or a row count."""
    out = Outcome()
    poller: Any = None
    while True:
        while pgconn.is_busy():
            if poller is None:
                poller = select.poll()
                poller.register(pgconn.socket, select.POLLIN)
            poller.poll()  # the GIL is released while waiting: other threads keep working
            pgconn.consume_input()
        res = pgconn.get_result()
        if res is None:  # end of one command's results — or, on a connection libpq gave up, of all of them
            if pgconn.status != _CONN_OK:
                message = pgconn.error_message.decode(encoding, "replace").strip()
                raise errors.OperationalError(f"connection lost mid-pipeline: {message or 'no message'}")
            continue
        status = res.status
        if status == _SYNC:
            return out
        if status == _FATAL:
            if out.error is None:
                out.error = errors.error_from_result(res, encoding=encoding)
        elif status == _TUPLES_OK:
            ntuples, nfields = res.ntuples, res.nfields
            out.rows = [
                tuple(_decode(res.get_value(r, c), encoding) for c in range(nfields)) for r in range(ntuples)
            ]
            out.rowcount = ntuples
        elif status == _COMMAND_OK and res.command_tuples is not None:
            out.rowcount = res.command_tuples
        # anything else (PIPELINE_ABORTED: skipped after an error; Parse/Close/BEGIN without a count) is
        # part of the same round trip and carries nothing the caller needs


def _decode(value: bytes | None, encoding: str) -> str | None:
    return None if value is None else value.decode(encoding)


def forget_after_rollback(info: dict[str, Any], pgconn: Any) -> None:
    """Called before a rollback reaches psycopg: if the session is in a transaction, psycopg will roll it back
    and may deallocate every prepared statement, so the next opener parses its statement again."""
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        info.pop(PREPARED_KEY, None)
