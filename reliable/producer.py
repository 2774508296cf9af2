"""The stub-first producer: the intent to send commits with the business write, the send happens after.

Why stub first: if a service writes an order and then sends "order created", a crash between the two loses
the message, and sending first risks announcing an order that was rolled back. Writing a ``PENDING`` row to
``message_stub`` *inside the caller's transaction* makes the write and the intent atomic; the broker send runs
only after that transaction commits, and if it fails (or the process dies before it runs) the resend sweeper
finds the stub by ``status='PENDING' AND resend_at <= now AND queue_offset IS NULL`` and sends it again.

Life of a stub written here::

    stage()          PENDING  send_count=0  queue_offset=NULL  resend_at=now+first_resend_delay
      | caller commits                         (rollback: the row never existed, nothing is sent)
    send ok          PENDING  send_count=1  queue_id/offset=receipt  last_sent_at=now
                              resend_at=now+first_resend_delay  last_error=NULL
    send failed      PENDING  send_count=1  queue_offset unchanged  last_error=reason  resend_at=now
      | consumer commits its work
    CONFIRMED        (the guard's conditional UPDATE)

``send_count`` counts hand-overs *attempted*: a send that raised may still have reached the broker (a lost
send ACK), so it is counted against ``max_sends`` like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import Counter
from sqlalchemy import CursorResult, Table, bindparam, event, select, update
from sqlalchemy.orm import Session, SessionTransaction

from reliable import constants as C
from reliable import otel
from reliable.errors import (
    DuplicateMessageIdError,
    InvalidMessageError,
    InvalidStubStateError,
    StubNotFoundError,
)
from reliable.facade import Reliability
from reliable.models import MessageStub, utcnow
from reliable.sender import OutgoingMessage, Sender, SendReceipt
from reliable.types import StubStatus

log = logging.getLogger("reliable.producer")

#: RocketMQ's topic/group character set (``Validators.PATTERN``): what every adapter can carry unchanged.
_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_STAGED_KEY = "reliable.staged"
_LAST_ERROR_MAX = 2000

SENDS = Counter("reliable_producer_sends", "Staged messages the producer tried to send", ["outcome"])
HOOK_ERRORS = Counter("reliable_producer_hook_errors", "After-commit send batches that raised")


class SendOutcome(enum.StrEnum):
    """What became of one staged message when the producer tried to send it."""

    SENT = "SENT"  # the broker accepted it; the receipt is recorded on the stub
    FAILED = "FAILED"  # the sender raised; the stub stays PENDING with last_error, due for the sweeper
    SKIPPED = "SKIPPED"  # no PENDING stub any more (voided, already confirmed, or never committed)


@dataclass(frozen=True, slots=True)
class StagedMessage:
    """A stub written in the caller's transaction and not yet sent."""

    message_id: str
    topic: str
    body: bytes
    consumer_group: str
    tags: str | None
    payload_hash: str
    #: travels with every send (the trace context when telemetry is on)
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def outgoing(self, send_count: int = 0) -> OutgoingMessage:
        return OutgoingMessage(
            message_id=self.message_id,
            topic=self.topic,
            body=self.body,
            consumer_group=self.consumer_group,
            tags=self.tags,
            send_count=send_count,
            properties=self.properties,
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    """The outcome of one send attempt, as recorded on the stub."""

    message_id: str
    outcome: SendOutcome
    receipt: SendReceipt | None = None
    error: str | None = None


def payload_hash(body: bytes) -> str:
    """SHA-256 hex of a body: what the guard compares to refuse a different body under the same id."""
    return hashlib.sha256(body).hexdigest()


def validate_message(message_id: str, topic: str, group: str, tags: str | None) -> None:
    """Raise :class:`InvalidMessageError` for input no broker adapter or table column can carry."""
    if not isinstance(message_id, str) or not message_id.strip():
        raise InvalidMessageError("message id must be a non-empty string")
    if len(message_id) > C.MESSAGE_ID_MAX:
        raise InvalidMessageError(
            f"message id longer than {C.MESSAGE_ID_MAX} characters: {message_id[:80]!r}"
        )
    _check_name("topic", topic, C.TOPIC_MAX)
    _check_name("consumer group", group, C.GROUP_MAX)
    if tags is not None and (len(tags) > C.TAGS_MAX or "||" in tags):
        raise InvalidMessageError(f"tags must be at most {C.TAGS_MAX} characters without '||': {tags[:80]!r}")


def _check_name(what: str, value: str, limit: int) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise InvalidMessageError(f"{what} longer than {limit} characters: {value[:80]!r}")
    if not _NAME_RE.match(value):
        raise InvalidMessageError(f"{what} {value!r} may only contain letters, digits, '_', '-', '%' and '|'")


class StubProducer:
    """Stages stubs in the caller's transaction and sends them through a :class:`Sender` after commit.

    Three ways to use it, from most to least control::

        staged = producer.stage(session, "order-1", "orders", body)   # sent by an after-commit hook
        with producer.transaction() as tx:                            # own session; results in tx.results
            tx.session.add(order); tx.stage("order-1", "orders", body)
        producer.publish("order-1", "orders", body)                   # a stub and a send, nothing else

    The after-commit hook never raises into the caller (their commit has already happened): a failed send is
    logged and left to the sweeper.
    """

    def __init__(
        self,
        rel: Reliability,
        sender: Sender,
        *,
        default_group: str | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.rel = rel
        self.sender = otel.traced_sender(rel, sender)
        self.default_group = default_group
        self.clock = clock

    # --- staging ---------------------------------------------------------------------------------------

    def stage(
        self,
        session: Session,
        message_id: str,
        topic: str,
        body: bytes,
        group: str | None = None,
        tags: str | None = None,
        *,
        send_on_commit: bool = True,
    ) -> StagedMessage:
        """Write a PENDING stub through ``session`` (the caller's transaction) and return what was staged.

        With ``send_on_commit`` (the default) the message is sent when ``session`` commits; a rollback drops
        it. Without, the caller passes the result to :meth:`send_staged` after its own commit.
        """
        group = group if group is not None else self.default_group
        if group is None:
            raise InvalidMessageError("no consumer group: pass group= or set default_group on the producer")
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidMessageError(f"body must be bytes, got {type(body).__name__}")
        body = bytes(body)
        validate_message(message_id, topic, group, tags)
        if session.get(MessageStub, message_id) is not None:
            raise DuplicateMessageIdError(f"a stub with message id {message_id!r} already exists")
        now = self.clock()
        properties, trace_context = otel.stage_context(self.rel, message_id, topic, body)
        staged = StagedMessage(message_id, topic, body, group, tags, payload_hash(body), properties)
        session.add(
            MessageStub(
                message_id=message_id,
                topic=topic,
                tags=tags,
                consumer_group=group,
                content=body,
                payload_hash=staged.payload_hash,
                status=StubStatus.PENDING,
                send_count=0,
                # the grace the after-commit send has before the sweeper may step in (crash after commit)
                resend_at=now + dt.timedelta(seconds=self.rel.settings.first_resend_delay_s),
                created_at=now,
                updated_at=now,
                trace_context=trace_context,
            )
        )
        if send_on_commit:
            self._hook(session).append(staged)
        return staged

    def _hook(self, session: Session) -> list[StagedMessage]:
        """The per-session list the after-commit hook sends, registering the hook on first use."""
        key = (_STAGED_KEY, id(self))  # one list per producer: each sends through its own sender
        pending: _Pending | None = session.info.get(key)
        if pending is None:
            pending = _Pending()
            session.info[key] = pending
            hook = pending

            def after_commit(sess: Session) -> None:  # only the root transaction's commit fires this
                batch, verify = list(hook.items), hook.verify
                hook.items.clear()
                hook.verify = False
                if batch:
                    self._send_from_hook(batch, verify)

            def after_soft_rollback(sess: Session, previous: SessionTransaction) -> None:
                # a root rollback: the stubs are gone, sending them would be a lie. A SAVEPOINT rollback
                # keeps the list but makes the send re-read the stubs and skip the ones it took with it.
                if previous.nested:
                    hook.verify = True
                else:
                    hook.items.clear()
                    hook.verify = False

            event.listen(session, "after_commit", after_commit)
            event.listen(session, "after_soft_rollback", after_soft_rollback)
        return pending.items

    def _send_from_hook(self, batch: list[StagedMessage], verify: bool) -> None:
        try:
            self.send_staged(batch, verify=verify)
        except Exception:  # the caller's commit already happened; the sweeper owns what is left
            HOOK_ERRORS.inc()
            log.exception("after-commit send of %d message(s) failed; left for the sweeper", len(batch))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[ProducerTransaction]:
        """A session and transaction of the producer's own: commit on clean exit, then send what was staged.

        An exception inside the block rolls back and sends nothing.
        """
        tx = ProducerTransaction(self)
        savepoint_rolled_back = False

        def after_soft_rollback(sess: Session, previous: SessionTransaction) -> None:
            nonlocal savepoint_rolled_back
            savepoint_rolled_back = savepoint_rolled_back or previous.nested

        with self.rel.session() as session:
            event.listen(session, "after_soft_rollback", after_soft_rollback)
            tx.session = session
            yield tx
        # committed just now by us: only a SAVEPOINT rollback inside the block can have removed a stub
        tx.results = self.send_staged(tx.staged, verify=savepoint_rolled_back)

    def publish(
        self, message_id: str, topic: str, body: bytes, group: str | None = None, tags: str | None = None
    ) -> SendResult:
        """Stage and send one message with no business write of the caller's (its own transaction)."""
        with self.transaction() as tx:
            tx.stage(message_id, topic, body, group, tags)
        return tx.results[0]

    # --- sending ---------------------------------------------------------------------------------------

    def send_staged(
        self, staged: StagedMessage | Sequence[StagedMessage], *, verify: bool = True
    ) -> list[SendResult]:
        """Send committed stubs and record each result; call only after the staging transaction committed.

        A stub that is no longer PENDING (or was never committed) is skipped, so a caller that mixes up
        commit and rollback cannot announce a message whose business write does not exist. ``verify=False``
        skips that re-read (one transaction less) for stubs the caller knows it has just committed.
        """
        batch = [staged] if isinstance(staged, StagedMessage) else list(staged)
        batch = list({m.message_id: m for m in batch}.values())  # one send per id, however often staged
        if not batch:
            return []
        if verify:
            with self.rel.session() as s:
                rows = s.execute(
                    select(MessageStub.message_id, MessageStub.send_count).where(
                        MessageStub.message_id.in_([m.message_id for m in batch]),
                        MessageStub.status == StubStatus.PENDING,
                    )
                ).all()
            send_counts = {r.message_id: r.send_count for r in rows}
        else:
            send_counts = {m.message_id: 0 for m in batch}
        results: list[SendResult] = []
        for msg in batch:
            if msg.message_id not in send_counts:
                log.info("message %s: no PENDING stub any more; not sent", msg.message_id)
                results.append(SendResult(msg.message_id, SendOutcome.SKIPPED))
                continue
            results.append(self._send_one(msg, send_counts[msg.message_id]))
        self._record(results)
        for r in results:
            SENDS.labels(r.outcome.value).inc()
        return results

    def _send_one(self, msg: StagedMessage, send_count: int) -> SendResult:
        try:
            receipt = self.sender.send(msg.outgoing(send_count))
        except Exception as exc:  # any failure means "not accepted": recorded on the stub, not swallowed
            reason = f"{type(exc).__name__}: {exc}"[:_LAST_ERROR_MAX]
            log.warning("message %s: send failed (%s); left PENDING for the sweeper", msg.message_id, reason)
            return SendResult(msg.message_id, SendOutcome.FAILED, error=reason)
        return SendResult(msg.message_id, SendOutcome.SENT, receipt=receipt)

    def _record(self, results: Iterable[SendResult]) -> None:
        """Write send results in one transaction (a crash before it only makes the sweeper resend early).

        One executemany per kind of result. No status filter: a consumer may already have confirmed the stub;
        the receipt still belongs to the row (the report's send→confirm latency and offset lag read it).
        """
        now = self.clock()
        t = cast(Table, MessageStub.__table__)
        sent = [
            {"mid": r.message_id, "qid": r.receipt.queue_id, "qoff": r.receipt.queue_offset}
            for r in results
            if r.receipt is not None and r.outcome is SendOutcome.SENT
        ]
        failed = [{"mid": r.message_id, "err": r.error} for r in results if r.outcome is SendOutcome.FAILED]
        if not sent and not failed:
            return
        common = {"send_count": t.c.send_count + 1, "last_sent_at": now, "updated_at": now}
        with self.rel.session() as s:
            conn = s.connection()
            if sent:
                resend_at = now + dt.timedelta(seconds=self.rel.settings.first_resend_delay_s)
                conn.execute(
                    update(t)
                    .where(t.c.message_id == bindparam("mid"))
                    .values(
                        queue_id=bindparam("qid"),
                        queue_offset=bindparam("qoff"),
                        resend_at=resend_at,
                        last_error=None,
                        **common,
                    ),
                    sent,
                )
            if failed:
                stmt = update(t).where(t.c.message_id == bindparam("mid"))
                conn.execute(stmt.values(resend_at=now, last_error=bindparam("err"), **common), failed)

    # --- cancelling ------------------------------------------------------------------------------------

    def void(self, message_id: str, session: Session | None = None) -> None:
        """Cancel a PENDING stub (consumers skip it, the sweeper never resends it).

        Raises :class:`StubNotFoundError` or :class:`InvalidStubStateError` (a CONFIRMED stub cannot be
        un-done; a DEAD one is already out of the sweeper's hands, but voiding it is allowed so a person can
        close it).
        """
        if session is None:
            with self.rel.session() as own:
                self._void(own, message_id)
        else:
            self._void(session, message_id)

    def _void(self, s: Session, message_id: str) -> None:
        now = self.clock()
        result: CursorResult[Any] = s.execute(  # type: ignore[assignment]
            update(MessageStub)
            .where(
                MessageStub.message_id == message_id,
                MessageStub.status.in_([StubStatus.PENDING, StubStatus.DEAD]),
            )
            .values(status=StubStatus.VOIDED, updated_at=now, resend_at=None)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            return
        status = s.execute(select(MessageStub.status).where(MessageStub.message_id == message_id)).scalar()
        if status is None:
            raise StubNotFoundError(f"no stub with message id {message_id!r}")
        if status is not StubStatus.VOIDED:
            raise InvalidStubStateError(
                f"stub {message_id!r} is {status.value}; only PENDING or DEAD can be voided"
            )


@dataclasses.dataclass
class _Pending:
    """What a session's after-commit hook will send, and whether it must re-read the stubs first."""

    items: list[StagedMessage] = dataclasses.field(default_factory=list)
    verify: bool = False


@dataclasses.dataclass
class ProducerTransaction:
    """What :meth:`StubProducer.transaction` yields: the session to write through and what was staged."""

    producer: StubProducer
    session: Session = dataclasses.field(init=False)
    staged: list[StagedMessage] = dataclasses.field(default_factory=list)
    results: list[SendResult] = dataclasses.field(default_factory=list)

    def stage(
        self, message_id: str, topic: str, body: bytes, group: str | None = None, tags: str | None = None
    ) -> StagedMessage:
        staged = self.producer.stage(self.session, message_id, topic, body, group, tags, send_on_commit=False)
        self.staged.append(staged)
        return staged
