"""The stub-first producer for asyncio: stage in an ``AsyncSession``, send after commit with ``AsyncSender``.

Why a thin shell: the rows a producer writes (:func:`reliable.outbox.stage`), the after-commit send, the
verification that a stub is still ``PENDING``, and the recording of send results
(:func:`reliable.outbox.record_sends`) are the synchronous :class:`~reliable.producer.StubProducer`'s, and the
sweeper reads those rows. So this class runs that producer through SQLAlchemy's greenlet bridge, as the async
guard runs the sync guard (:mod:`reliable.guard.aio`): its database work goes through the running loop's
async engine, its sends ``await`` the :class:`~reliable.sender.AsyncSender`, and its wait between tries of
recording a send result is an ``asyncio.sleep`` (:func:`pause_on_loop`). Nothing blocks the loop.

::

    producer = AsyncStubProducer(rel, AioRabbitMQSender(url))
    async with rel.async_session() as session:
        session.add(order)
        await producer.stage(session, "order-1", "orders", body, groups=["billing", "audit"])
    # committed: sent by the after-commit hook (a failed send is left to the sweeper, never raised)

    await producer.publish("order-2", "orders", body)   # a stub and a send, in a transaction of its own

The after-commit send runs inside ``await session.commit()`` (the commit returns once the sends are recorded).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.util import await_only, greenlet_spawn

from reliable.aio_backends import PerLoop, forget_engine, make_async_engine
from reliable.facade import Reliability
from reliable.models import utcnow
from reliable.producer import SendResult, StagedMessage, StubProducer
from reliable.sender import AsyncSender, OutgoingMessage, SendReceipt


class StraySendCancel(Exception):
    """The sender raised ``CancelledError`` while nobody cancelled the sending task (a client library that
    cancelled a future of its own): a send that was not accepted, recorded on the row like any other
    failure. Let through, it passed every ``except Exception`` after the commit (after-commit hook, the
    guard's staged sends) and reached the caller, whose transaction had committed: ``stage`` + commit and
    ``publish`` raised ``CancelledError``, and a guarded handler that staged a message made
    ``await handle.decide(env)`` raise it for a processed message — adapters neither acked nor requeued
    (until 2026-11-28). A cancel of the task itself still passes through."""


class GreenletSender:
    """The synchronous :class:`~reliable.sender.Sender` face of an ``AsyncSender`` (inside greenlet_spawn)."""

    def __init__(self, sender: AsyncSender) -> None:
        self.sender = sender

    def __getattr__(self, name: str) -> object:
        """The wrapped sender's broker limits (``name_pattern``, ``max_body_bytes``, …) for staging."""
        return getattr(self.sender, name)

    def send(self, message: OutgoingMessage) -> SendReceipt:
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        try:
            return await_only(self.sender.send(message))
        except asyncio.CancelledError as exc:
            if task is not None and task.cancelling() > cancels:
                raise  # the task itself is being cancelled: asyncio needs it to unwind
            raise StraySendCancel(f"{exc!r} while the sending task was not cancelled") from exc


def pause_on_loop(seconds: float) -> None:
    """:attr:`StubProducer.pause` inside ``greenlet_spawn``: the loop runs its other tasks meanwhile.

    The sync producer's ``time.sleep`` ran on the loop's thread (the after-commit send runs inside ``await
    session.commit()``): a failed record — a deadlock, a lock timeout, a blip — stalled every consumer and
    heartbeat on the loop for the whole backoff (until 2026-11-29).
    """
    await_only(asyncio.sleep(seconds))


class AsyncStubProducer:
    """:class:`~reliable.producer.StubProducer` with ``async`` methods: the same rows, hooks and metrics."""

    def __init__(
        self,
        rel: Reliability,
        sender: AsyncSender,
        *,
        default_group: str | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.rel = rel
        self.sender = sender
        self.default_group = default_group
        self.clock = clock
        self._producers = PerLoop(
            self._loop_producer,
            lambda p, closed: forget_engine(p.rel.engine, closed),
            lambda p: greenlet_spawn(p.rel.engine.dispose),
        )

    def _producer(self) -> StubProducer:
        return self._producers.get()

    def _loop_producer(self) -> StubProducer:
        """The sync producer for the running loop, on a ``Reliability`` over an async engine of its own.

        Its own pool, not the one of the caller's sessions: the after-commit send checks out a connection
        while the committing session still holds one, so with one shared pool many concurrent commits can
        hold every connection and wait for one more — a deadlock until the pool timeout.
        """
        view = Reliability(engine=make_async_engine(self.rel.aio.url).sync_engine, redis_url="")
        view.settings = self.rel.settings  # the one settings object
        producer = StubProducer(
            view, GreenletSender(self.sender), default_group=self.default_group, clock=self.clock
        )
        producer.pause = pause_on_loop
        return producer

    async def aclose(self) -> None:
        """Close the running loop's connections of this producer (not the sender: it is the caller's)."""
        producer = self._producers.pop_current()
        if producer is not None:
            await greenlet_spawn(producer.rel.engine.dispose)

    async def stage(
        self,
        session: AsyncSession,
        message_id: str,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        groups: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        send_on_commit: bool = True,
    ) -> StagedMessage:
        """The PENDING stub and inbox rows in ``session``, sent when it commits (see the sync ``stage``)."""
        producer = self._producer()
        return await session.run_sync(
            lambda s: producer.stage(
                s,
                message_id,
                topic,
                body,
                tags=tags,
                groups=groups,
                properties=properties,
                send_on_commit=send_on_commit,
            )
        )

    async def send_staged(
        self, staged: StagedMessage | Sequence[StagedMessage], *, verify: bool = True
    ) -> list[SendResult]:
        """Send committed stubs and record each result (``stage(..., send_on_commit=False)`` callers)."""
        return await greenlet_spawn(self._producer().send_staged, staged, verify=verify)

    async def publish(
        self,
        message_id: str,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        groups: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> SendResult:
        """Stage and send one message in a transaction of its own."""
        producer = self._producer()
        return await greenlet_spawn(
            lambda: producer.publish(message_id, topic, body, tags=tags, groups=groups, properties=properties)
        )

    async def void(self, message_id: str) -> None:
        """Cancel a PENDING stub (see :meth:`StubProducer.void`)."""
        await greenlet_spawn(self._producer().void, message_id)
