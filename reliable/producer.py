"""The stub-first producer: the intent to send commits with the business write, the send happens after.

Why stub first: if a service writes an order and then sends "order created", a crash between the two loses
the message, and sending first risks announcing an order that was rolled back. Writing a ``PENDING`` row to
``message_stub`` *inside the caller's transaction* makes the write and the intent atomic; the broker send runs
only after that transaction commits, and if it fails (or the process dies before it runs) the resend sweeper
finds the stub by ``status='PENDING' AND resend_at <= now AND queue_offset IS NULL`` and sends it again.

Fan-out: one stub per message, plus one ``message_inbox`` row ``PENDING`` per consumer group that must process
it — the ``groups`` the caller names, else the topic's subscribers from settings ``topic_groups``
(``RELIABLE_TOPIC_GROUPS``), else the default group. The rows are written by :func:`reliable.outbox.stage`,
the send results by :func:`reliable.outbox.record_sends` (the sweeper records its resends there too).

Life of a stub written here::

    stage()          PENDING  send_count=0  queue_offset=NULL  resend_at=now+first_resend_delay
      | caller commits                         (rollback: the rows never existed, nothing is sent)
    send ok          PENDING  send_count=1  broker_name/queue_id/offset=receipt  last_sent_at=now
                              resend_at=now+first_resend_delay  last_error=NULL
    send failed      PENDING  send_count=1  queue_offset unchanged  last_error=reason  resend_at=now
      | each group's consumer commits its work (the guard confirms that group's inbox row)
    CONFIRMED        once every group's inbox row is CONFIRMED

``send_count`` counts hand-overs *attempted*: a send that raised may still have reached the broker (a lost
send ACK), so it is counted against ``max_sends`` like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import event, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, SessionTransaction

from reliable import constants as C
from reliable import otel, outbox
from reliable.commit_hook import staged_list
from reliable.errors import InvalidMessageError, InvalidStubStateError, StubNotFoundError
from reliable.facade import Reliability
from reliable.models import MessageStub, utcnow
from reliable.outbox import payload_hash as payload_hash  # re-exported: part of this module's API
from reliable.producer_metrics import HOOK_ERRORS, RECORD_FAILURES, SENDS
from reliable.send_breaker import Pass, SendBreaker
from reliable.sender import OutgoingMessage, Sender
from reliable.staged import SendOutcome as SendOutcome  # re-exported, as the rest: this module's API
from reliable.staged import SendResult as SendResult
from reliable.staged import StagedMessage as StagedMessage
from reliable.staged import check_broker_limits, checked_properties, held_back_s, properties_json
from reliable.staged import check_broker_names as check_broker_names
from reliable.staged import validate_message as validate_message
from reliable.types import StubStatus

log = logging.getLogger("reliable.producer")

_STAGED_KEY = "reliable.staged"
_LAST_ERROR_MAX = 2000


class StubProducer:
    """Stages stubs in the caller's transaction and sends them through a :class:`Sender` after commit.

    Three ways to use it, from most to least control::

        staged = producer.stage(session, "order-1", "orders", body, groups=["billing", "audit"])
                                                                      # sent by an after-commit hook
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
        #: used for a topic without ``topic_groups`` entry (before ``settings.default_group``)
        self.default_group = default_group
        self.clock = clock
        #: defers the after-commit sends to the sweeper for a while after one hung (reliable.send_breaker)
        self.breaker = SendBreaker()
        #: waits between tries of recording send results; the asyncio producer, which runs this class on the
        #: event loop's thread, swaps in a wait that lets the loop's other tasks run meanwhile
        self.pause: Callable[[float], object] = time.sleep

    def groups_for(self, topic: str) -> tuple[str, ...]:
        """The groups a message of ``topic`` is staged for when the caller names none."""
        settings = self.rel.settings
        if settings.topic_groups.get(topic):
            return tuple(settings.topic_groups[topic])
        if self.default_group:
            return (self.default_group,)
        return settings.groups_for(topic)

    # --- staging ---------------------------------------------------------------------------------------

    def stage(
        self,
        session: Session,
        message_id: str,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        groups: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        send_on_commit: bool = True,
    ) -> StagedMessage:
        """Write a PENDING stub and a PENDING inbox row per group in ``session`` (the caller's transaction).

        ``groups=None``: the topic's subscribers (settings ``topic_groups``), else the default group. With
        ``send_on_commit`` (the default) the message is sent when ``session`` commits; a rollback drops it.
        Without, the caller passes the result to :meth:`send_staged` after its own commit.
        """
        if isinstance(groups, str):
            raise InvalidMessageError("groups must be a list of consumer groups, not one string")
        chosen = tuple(dict.fromkeys(groups)) if groups is not None else self.groups_for(topic)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidMessageError(f"body must be bytes, got {type(body).__name__}")
        body = bytes(body)
        validate_message(message_id, topic, chosen, tags)
        check_broker_names(self.sender, topic, chosen)
        own = checked_properties(properties)
        check_broker_limits(self.sender, message_id, tags, body, own)
        now = self.clock()
        # the grace the after-commit send has before the sweeper may step in (crash after commit), after the
        # broker's delay of a delayed message: nobody can have received it before then
        due = now + dt.timedelta(seconds=self.rel.settings.first_resend_delay_s + held_back_s(own))
        properties, trace_context = otel.stage_context(self.rel, message_id, topic, body, own)
        digest = outbox.stage(
            session,
            message_id,
            topic,
            body,
            groups=chosen,
            tags=tags,
            now=now,
            resend_at=due,
            trace_context=trace_context,
            properties=properties_json(own),
        )
        staged = StagedMessage(message_id, topic, body, chosen, tags, digest, properties)
        if send_on_commit:
            guard_commit = session.info.get(C.SESSION_AFTER_COMMIT)
            if guard_commit is not None:  # a guarded handler's session: sent once the guard has committed
                guard_commit.append(functools.partial(self._send_from_hook, [staged], True))
            else:
                self._hook(session).append(staged)
        return staged

    def _hook(self, session: Session) -> list[StagedMessage]:
        """The per-session list sent after the session's commit (:mod:`reliable.commit_hook`)."""
        # one list per producer: each sends through its own sender
        return staged_list(session, (_STAGED_KEY, id(self)), self._send_from_hook)

    def _send_from_hook(self, batch: list[StagedMessage], verify: bool) -> None:
        try:
            self._send_batch(batch, verify=verify, deferrable=True)
        except Exception:  # the caller's commit already happened; the sweeper owns what is left
            HOOK_ERRORS.inc()
            log.exception("after-commit send of %d message(s) failed; left for the sweeper", len(batch))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[ProducerTransaction]:
        """A session and transaction of the producer's own: commit on clean exit, then send what was staged.

        An exception inside the block rolls back and sends nothing.
        """
        tx = ProducerTransaction(self)
        rolled_back = False

        def after_soft_rollback(sess: Session, previous: SessionTransaction) -> None:
            nonlocal rolled_back
            rolled_back = True

        with self.rel.session() as session:
            event.listen(session, "after_soft_rollback", after_soft_rollback)
            tx.session = session
            yield tx
        # committed just now by us: only a rollback inside the block (a SAVEPOINT's, or the whole
        # transaction's by ``tx.session.rollback()`` — the block then goes on in a new one) can have removed
        # a stub; then the stubs are read again and the missing ones skipped
        tx.results = self.send_staged(tx.staged, verify=rolled_back)

    def publish(
        self,
        message_id: str,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        groups: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Stage and send one message with no business write of the caller's (its own transaction)."""
        with self.transaction() as tx:
            tx.stage(message_id, topic, body, tags=tags, groups=groups, properties=properties)
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
        return self._send_batch(
            [staged] if isinstance(staged, StagedMessage) else list(staged), verify=verify
        )

    def _send_batch(
        self, batch: list[StagedMessage], *, verify: bool, deferrable: bool = False
    ) -> list[SendResult]:
        """:meth:`send_staged`; ``deferrable`` (the after-commit sends) leaves a message to the sweeper while
        :attr:`breaker` is open instead of waiting for a hanging broker."""
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
            admitted = self.breaker.admit() if deferrable else Pass.SEND
            if admitted is Pass.DEFER:
                results.append(SendResult(msg.message_id, SendOutcome.DEFERRED))
                continue
            results.append(self._send_one(msg, send_counts[msg.message_id], trial=admitted is Pass.TRIAL))
        self._record(results, {m.message_id: held_back_s(m.properties) for m in batch})
        for r in results:
            SENDS.labels(r.outcome.value).inc()
        return results

    def _send_one(self, msg: StagedMessage, send_count: int, *, trial: bool = False) -> SendResult:
        started = self.breaker.clock()
        attempt = outbox.attempt_send(self.sender, msg.outgoing(send_count))
        self.breaker.record(started, attempt.ok, trial=trial)
        if attempt.receipt is None:
            log.warning("message %s: left PENDING for the sweeper", msg.message_id)
            return SendResult(msg.message_id, SendOutcome.FAILED, error=attempt.error)
        return SendResult(msg.message_id, SendOutcome.SENT, receipt=attempt.receipt)

    def _record(self, results: Iterable[SendResult], held_back: Mapping[str, float]) -> None:
        """Write send results in one transaction (a crash before it only makes the sweeper resend early).

        Bookkeeping the sweeper can redo, so it never raises into the caller (whose transaction committed):
        a failure (a deadlock, an outage) is retried ``PRODUCER_RECORD_TRIES`` times, then logged and counted
        in ``reliable_producer_record_failures{outcome="given_up"}``; the stub then stays due at its staged
        ``resend_at`` and the sweeper sends it again (a duplicate the guard absorbs).

        A landed send is due again after ``first_resend_delay_s`` plus the broker's delay of a delayed
        message (``held_back``, seconds by id: nobody can have received it before), a failed one at once
        (see :func:`reliable.outbox.record_sends` for exactly what is written).
        """
        now = self.clock()
        first = self.rel.settings.first_resend_delay_s

        def due(r: SendResult) -> dt.datetime:
            return now + dt.timedelta(seconds=first + held_back.get(r.message_id, 0.0)) if r.receipt else now

        attempts = [
            (outbox.SendAttempt(_topic_send(r.message_id), r.receipt, r.error), due(r))
            for r in results
            if r.outcome in (SendOutcome.SENT, SendOutcome.FAILED)  # skipped and deferred: nothing to record
        ]
        if not attempts:
            return
        for attempt in range(1, C.PRODUCER_RECORD_TRIES + 1):
            try:
                with self.rel.session() as s:
                    if self.rel.dialect in ("mysql", "mariadb"):  # no gap locks next to the guard's inserts
                        s.execute(text("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"))
                    outbox.record_sends(s.connection(), attempts, now)
                return
            except SQLAlchemyError as exc:  # bookkeeping after the caller's commit: never raised to them
                if attempt < C.PRODUCER_RECORD_TRIES:
                    RECORD_FAILURES.labels("retried").inc()
                    log.warning("recording %d send(s) failed, retrying: %r", len(attempts), exc)
                    self.pause(C.PRODUCER_RECORD_BACKOFF_S * attempt)
                    continue
                RECORD_FAILURES.labels("given_up").inc()
                log.error(
                    "recording %d send(s) failed %d times; the sweeper re-sends them when due: %r",
                    len(attempts),
                    attempt,
                    exc,
                )

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
        conn = s.connection()
        if outbox.void(conn, message_id, self.clock()) == 1:
            return
        status = outbox.stub_status(conn, message_id)
        if status is None:
            raise StubNotFoundError(f"no stub with message id {message_id!r}")
        if status is not StubStatus.VOIDED:
            raise InvalidStubStateError(
                f"stub {message_id!r} is {status.value}; only PENDING or DEAD can be voided"
            )


def _topic_send(message_id: str) -> OutgoingMessage:
    """What :func:`reliable.outbox.record_sends` needs of a producer send: the id, and no target group."""
    return OutgoingMessage(message_id=message_id, topic="", body=b"")


@dataclasses.dataclass
class ProducerTransaction:
    """What :meth:`StubProducer.transaction` yields: the session to write through and what was staged."""

    producer: StubProducer
    session: Session = dataclasses.field(init=False)
    staged: list[StagedMessage] = dataclasses.field(default_factory=list)
    results: list[SendResult] = dataclasses.field(default_factory=list)

    def stage(
        self,
        message_id: str,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        groups: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> StagedMessage:
        staged = self.producer.stage(
            self.session,
            message_id,
            topic,
            body,
            tags=tags,
            groups=groups,
            properties=properties,
            send_on_commit=False,
        )
        self.staged.append(staged)
        return staged
