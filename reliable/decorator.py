"""``@idempotent_consumer``: the thin public face of :class:`reliable.guard.Guard`.

::

    @idempotent_consumer(rel, group="billing")
    def handle(env: Envelope, session: Session) -> None:
        session.add(Payment(order_id=json.loads(env.body)["order"]))

    handle(env)              # -> ConsumeResult (what a broker adapter needs)
    handle.decide(env)       # -> Decision: result + journal outcome + reason + duplicate flag + log id
    handle.batch(envs)       # -> list[ConsumeResult], one journal transaction for the whole list
    handle.decide_batch(envs)
    handle.close()           # flush the write-behind journal, if enabled (settings.journal_write_behind)

Everything the handler writes through ``session`` commits in the same transaction as the stub confirmation,
so it happens exactly once; anything else it does (HTTP, e-mail) happens at least once. The handler must not
commit the session's transaction itself (``session.commit()`` only flushes here) and should let database
errors propagate rather than swallow them.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

from prometheus_client import CollectorRegistry

from reliable import constants as C
from reliable import otel
from reliable.errors import ConfigurationError
from reliable.guard import Guard, Handler
from reliable.guard.decision import Decision, GuardHooks
from reliable.types import ConsumeResult, Envelope

if TYPE_CHECKING:
    from reliable.guard.aio import AsyncGuardedHandler, AsyncHandler


class GuardedHandler:
    """A handler wrapped by the guard: called with an :class:`Envelope`, returns a :class:`ConsumeResult`."""

    __name__: str  # the handler's, copied by functools.update_wrapper (as are __doc__ and __module__)

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        functools.update_wrapper(self, guard.handler)

    @property
    def group(self) -> str:
        return self.guard.group

    def __call__(self, env: Envelope) -> ConsumeResult:
        return self.guard(env).result

    def decide(self, env: Envelope) -> Decision:
        """The full decision for one delivery (outcome, reason, duplicate flag, journal row id)."""
        return self.guard(env)

    def batch(self, envs: Sequence[Envelope]) -> list[ConsumeResult]:
        """Guard a list of deliveries with one lease pipeline, one journal and one work transaction."""
        return [d.result for d in self.guard.process(envs)]

    def decide_batch(self, envs: Sequence[Envelope]) -> list[Decision]:
        return self.guard.process(envs)

    def flush_journal(self) -> int:
        """Write buffered duplicate rows now (only with ``journal_write_behind``); returns the row count."""
        return self.guard.flush_journal()

    def flush_markers(self) -> None:
        """Send the queued Redis ``done`` markers now (after each commit they are queued, not waited for)."""
        self.guard.lease.flush()

    def close(self) -> None:
        """Flush and stop the write-behind journal and the done-marker timer (also happens at exit)."""
        self.guard.close()


class ConsumerDecorator(Protocol):
    """What ``idempotent_consumer(rel, group=…)`` returns: sync handler in, sync out; ``async def`` alike."""

    @overload
    def __call__(self, handler: AsyncHandler) -> AsyncGuardedHandler: ...
    @overload
    def __call__(self, handler: Handler) -> GuardedHandler: ...


def idempotent_consumer(
    rel: Any,
    group: str,
    *,
    registry: CollectorRegistry | None = None,
    hooks: Sequence[GuardHooks] = (),
    redis_retry_after_s: float = C.DEFAULT_REDIS_RETRY_AFTER_S,
    durable_journal: bool = False,
) -> ConsumerDecorator:
    """Guard ``handler(env, session)`` for consumer ``group`` with the stores and settings of ``rel``.

    ``registry``: the Prometheus registry for the guard's counters (default: the process registry).
    ``hooks``: :class:`reliable.guard.GuardHooks` instances called around each step.
    ``redis_retry_after_s``: after a Redis failure, how long to stay on the database alone.
    ``durable_journal``: PostgreSQL only — make the write-behind flush of ``done`` duplicates wait for its WAL
    flush (every other journal row commits with the work transaction and is durable; see
    :meth:`reliable.stores.sql_journal.JournalSql.journal_bulk`).
    """

    _check_options(redis_retry_after_s, durable_journal)
    options: dict[str, Any] = {
        "registry": registry,
        "hooks": (*hooks, *otel.guard_hooks(rel, group)),
        "redis_retry_after_s": redis_retry_after_s,
        "durable_journal": durable_journal,
    }

    def wrap(handler: Any) -> Any:
        if inspect.iscoroutinefunction(handler):  # the same guard, its I/O awaited (reliable.guard.aio)
            from reliable.guard.aio import AsyncGuard, AsyncGuardedHandler

            return AsyncGuardedHandler(AsyncGuard(rel, group, handler, **options))
        guard = Guard(rel, group, handler, **options)
        rel.track(guard)  # rel.close() closes it first, so its buffered rows land before the pools go
        return GuardedHandler(guard)

    return wrap


def _check_options(retry_after_s: object, durable_journal: object) -> None:
    """Bad options were accepted: ``redis_retry_after_s="x"`` raised ``TypeError`` on every delivery once
    Redis went down, ``-1`` retried Redis on every message, ``durable_journal="no"`` meant yes."""
    if (
        isinstance(retry_after_s, bool)
        or not isinstance(retry_after_s, int | float)
        or not math.isfinite(retry_after_s)
        or retry_after_s < 0
    ):
        raise ConfigurationError(
            f"redis_retry_after_s must be a number of seconds >= 0, got {retry_after_s!r}"
        )
    if not isinstance(durable_journal, bool):  # (True on another database: its rows are durable already)
        raise ConfigurationError(f"durable_journal must be True or False, got {durable_journal!r}")
