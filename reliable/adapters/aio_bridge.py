"""Run an ``async def`` guarded handler from a broker client's consume threads (RocketMQ 4.x, broker_sim).

Why: the RocketMQ 4.x push consumers (PyPI ``rocketmq`` 0.4.4, a C++ client calling back on its own threads,
and broker_sim's ``PushConsumer``) call a *synchronous* listener and wait for its status. What
``@idempotent_consumer`` returns for an ``async def`` handler is awaitable: called from such a listener it
gives a coroutine that nobody runs. Until 2026-11-29 both adapters took it anyway: every delivery was answered
``RECONSUME_LATER`` without the handler or the guard ever running (no journal row, no attempt counted), and
after 16 rounds the broker moved every message of the group to ``%DLQ%`` — the whole stream lost for that
group with nobody told, while the listener logged only "coroutine was never awaited" warnings.

:class:`LoopBridge` hands each delivery (or batch) to one event loop and blocks the consume thread until the
guard's answer is there, so the broker is acknowledged only after the guard's commit. The loop is either one
the caller runs (``loop=``: e.g. the service's main loop) or one the bridge starts on a thread of its own and
stops at :meth:`LoopBridge.close` (the loop's database and Redis connections are closed on it as it ends).
A call that cannot reach a running loop, and one the loop cancels, is ``RECONSUME_LATER``: never an ack.

Closing drains: no new call is taken, the calls already running finish (up to ``grace_s``), and only then
is the loop stopped. A call cancelled at the stop is a handler failure to the guard — one attempt of the
message's budget — so a deploy that closed the bridge while consumers were busy (a client whose shutdown
does not wait for its listeners, or a close before the shutdown) spent every in-flight message an attempt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, cast

from reliable import constants as C
from reliable.errors import ConfigurationError
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.aio_bridge")

T = TypeVar("T")


def is_async_handler(handler: object) -> bool:
    """True for an ``async def`` function and for an object whose ``__call__`` is one (a guarded handler)."""
    if inspect.iscoroutinefunction(handler):
        return True
    return callable(handler) and inspect.iscoroutinefunction(type(handler).__call__)


class LoopBridge:
    """A synchronous handler (``bridge(env) -> ConsumeResult``, ``bridge.batch(envs)``, ``bridge.group``) that
    runs the async guarded ``handler`` (what ``@idempotent_consumer`` returns for an ``async def``) on
    ``loop``, or on a loop thread of its own when ``loop`` is ``None``.

    ``timeout_s`` bounds the wait of a consume thread (``None``: as long as the guard takes; its database and
    Redis calls have their own bounds); at the bound the call is cancelled — a handler failure for the guard,
    counted, the row left retryable — and answered ``RECONSUME_LATER``.
    """

    def __init__(
        self,
        handler: Callable[[Envelope], Any],
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        if not is_async_handler(handler):
            raise ConfigurationError(f"{handler!r} is not an async def handler; use it directly")
        self.handler = handler
        self.timeout_s = timeout_s
        handler_group = getattr(handler, "group", None)
        self.group: str | None = handler_group if isinstance(handler_group, str) else None
        batch = getattr(handler, "batch", None)
        self._batch: Callable[[Sequence[Envelope]], Awaitable[list[ConsumeResult]]] | None = (
            batch if callable(batch) else None
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closing = False
        #: the calls submitted and not yet answered (what a close waits for)
        self._running: set[concurrent.futures.Future[Any]] = set()
        if loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()
            self._thread = threading.Thread(
                target=self._run_own, args=(loop, started), name="reliable-loop-bridge", daemon=True
            )
            self._thread.start()
            started.wait()
        self.loop = loop

    @staticmethod
    def _run_own(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            # as asyncio.run ends a loop: the guard calls still running are cancelled (a handler cancelled is
            # counted and its row left retryable; its consume thread gets CancelledError, never an ack), then
            # the guard's connections, registered with the loop's async generators, are closed on it
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:  # after close() began nothing is submitted: every task is cancelled before the end
            if self._closing or self.loop.is_closed() or not self.loop.is_running():
                coro.close()
                raise RuntimeError("the event loop of the async handler is not running")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._running.add(future)
        future.add_done_callback(self._running.discard)
        try:
            return future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def __call__(self, env: Envelope) -> ConsumeResult:
        async def one() -> ConsumeResult:
            return await cast(Awaitable[ConsumeResult], self.handler(env))

        return self._run(one())

    @property
    def batch(self) -> Callable[[Sequence[Envelope]], list[ConsumeResult]] | None:
        """``batch(envs)`` when the async handler has one (one journal and one work transaction per batch)."""
        handler_batch = self._batch
        if handler_batch is None:
            return None

        def run(envs: Sequence[Envelope]) -> list[ConsumeResult]:
            async def many() -> list[ConsumeResult]:
                return await handler_batch(envs)

            return self._run(many())

        return run

    @property
    def closing(self) -> bool:
        """``True`` once :meth:`close` began: no new call is taken."""
        return self._closing

    def close(self, grace_s: float | None = C.BRIDGE_CLOSE_GRACE_S) -> None:
        """Take no new call, wait up to ``grace_s`` (``None``: as long as they take) for the running ones to
        answer, then stop the bridge's own loop (its connections are closed on it; what still runs is
        cancelled). A caller's loop is left alone, and its calls run on."""
        with self._lock:
            self._closing = True
            running = set(self._running)
        if self._thread is None:
            return
        _, late = concurrent.futures.wait(running, timeout=grace_s)
        if late:
            log.warning(
                "closing the loop bridge: %d guard call(s) still running after %ss are cancelled",
                len(late),
                grace_s,
            )
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self._thread = None
