"""Sending what a session staged once its commit is a database commit — and never otherwise.

The producer's ``stage`` writes the stub in the caller's session and leaves the send to this hook, one per
(session, producer). What it must get right, each learned the hard way:

* a root rollback drops the list (the stubs are gone; sending them would announce what never existed), and a
  SAVEPOINT rollback keeps it but makes the send re-read the stubs and skip the ones it took with it;
* the send runs at ``after_transaction_end``, once the session has returned its connection: sending (and
  recording) from ``after_commit`` took a second connection while the first was held, so as many concurrent
  committers as pool slots hung;
* a session bound to a connection inside that connection's own ``begin()`` (``Session(bind=connection)``:
  test suites, frameworks owning the transaction) only *joined* it: its commit commits nothing, and the outer
  transaction may still roll back. Nothing is sent then — until 2026-11-28 it was, and a consumer applied a
  message whose transaction rolled back; on MariaDB and SQLite the send's record waited on the caller's own
  uncommitted row. The sweeper sends those stubs once they are committed (``first_resend_delay_s``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from sqlalchemy import Connection, event
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session, SessionTransaction

from reliable.models import MessageStub
from reliable.staged import StagedMessage

log = logging.getLogger("reliable.producer")

#: sends a committed batch; ``verify``: re-read the stubs first (a SAVEPOINT rollback may have removed some)
SendBatch = Callable[[list[StagedMessage], bool], None]


@dataclasses.dataclass
class PendingSends:
    """What a session's hook will send, and whether it must re-read the stubs first."""

    items: list[StagedMessage] = dataclasses.field(default_factory=list)
    verify: bool = False
    #: committed, to be sent once the transaction has released its connection
    ready: list[StagedMessage] = dataclasses.field(default_factory=list)
    ready_verify: bool = False

    def take(self) -> None:
        self.ready, self.ready_verify = list(self.items), self.verify
        self.drop()

    def drop(self) -> None:
        self.items.clear()
        self.verify = False


def staged_list(session: Session, key: object, send: SendBatch) -> list[StagedMessage]:
    """The list ``key``'s hook sends after ``session`` commits, registering the hook on first use."""
    pending: PendingSends | None = session.info.get(key)
    if pending is not None:
        return pending.items
    hook = session.info[key] = PendingSends()

    def after_commit(sess: Session) -> None:  # only the root transaction's commit fires this
        if outer_transaction_open(sess):
            log.info(
                "%d staged message(s) left for the sweeper: the session's commit did not commit its "
                "connection's outer transaction",
                len(hook.items),
            )
            hook.drop()
        else:
            hook.take()

    def after_transaction_end(sess: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is not None or not hook.ready:
            return
        batch, verify = hook.ready, hook.ready_verify
        hook.ready, hook.ready_verify = [], False
        send(batch, verify)

    def after_soft_rollback(sess: Session, previous: SessionTransaction) -> None:
        if previous.nested:
            hook.verify = True
        else:
            hook.drop()

    event.listen(session, "after_commit", after_commit)
    event.listen(session, "after_transaction_end", after_transaction_end)
    event.listen(session, "after_soft_rollback", after_soft_rollback)
    return hook.items


def outer_transaction_open(session: Session) -> bool:
    """Whether the stubs were written through a connection whose own transaction is still open after the
    session committed: ``Session(bind=connection)`` — or ``binds={table: connection}`` — inside
    ``connection.begin()``, where the session only joined it."""
    try:
        bind = session.get_bind(mapper=MessageStub)
    except UnboundExecutionError:
        return False
    return isinstance(bind, Connection) and bind.in_transaction()
