"""What a database error raised around the handler means to the guard.

Three questions the work transaction (:mod:`reliable.guard.work`) and the settle step ask of an exception,
in one place so both read the same codes: did the database break a deadlock by rolling this transaction
back (run it again: nothing of it was committed); did the connection die under the handler (an outage,
answered with a retry, no attempt counted); or was it the handler's own cancel (its ``asyncio.timeout`` ran
out inside a statement — the handler's failure, counted like any other, though the cancel invalidated the
connection too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the exceptions it was raised from or while handling, each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def disconnect_in(err: BaseException) -> bool:
    """The connection was lost: ``err`` is, or came from, a disconnect the driver reported."""
    return any(isinstance(e, DBAPIError) and e.connection_invalidated for e in _chain(err))


def own_cancel_in(err: BaseException) -> bool:
    """A cancel inside the handler that the handler turned into its own error (``asyncio.timeout``)."""
    return any(isinstance(e, asyncio.CancelledError) for e in _chain(err))


#: InnoDB's deadlock: the victim's whole transaction is rolled back, not only the statement
_ER_LOCK_DEADLOCK = 1213
_PG_DEADLOCK_DETECTED = "40P01"


def is_deadlock(exc: DBAPIError) -> bool:
    """Whether the database rolled the transaction back to break a deadlock (PostgreSQL, MariaDB/MySQL)."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == _PG_DEADLOCK_DETECTED:
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] == _ER_LOCK_DEADLOCK


#: ``Connection.info`` key: a deadlock was raised on this connection since the handler started
DEADLOCK_MARK = "reliable.deadlock"


def note_deadlock(ctx: ExceptionContext) -> None:
    """Marks a deadlock raised while the handler runs (MariaDB/MySQL). A handler that catches it and retries
    its statement goes on in a new implicit transaction: without the mark the guard would commit the
    handler's retried write alone and answer the message processed, its journal row and inbox confirmation
    rolled back with the old transaction — and the message's next copy would apply it again."""
    args = getattr(ctx.original_exception, "args", ())
    if args and args[0] == _ER_LOCK_DEADLOCK and ctx.connection is not None:
        ctx.connection.info[DEADLOCK_MARK] = True
