"""The seams between the demo and the parts it glues together.

Every part of the pipeline (the guard, the broker_sim clients, the sweeper, the reconciliation) is reached
through one small function here, so the orchestration reads the same whichever version of a part is
installed, and a missing part becomes one clear :class:`PartMissingError` instead of an ``ImportError``
deep inside a consumer process.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from reliable.demo.errors import PartMissingError
from reliable.facade import Reliability
from reliable.sender import Sender
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.demo")


def _import(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PartMissingError(f"{what} is not available ({module}: {exc})") from exc


def guard(
    rel: Reliability, group: str, handler: Callable[[Envelope, Session], None]
) -> Callable[[Envelope], ConsumeResult]:
    """``handler`` behind ``@idempotent_consumer(rel, group=group)``."""
    decorator = _import("reliable.decorator", "the consumer guard (@idempotent_consumer)")
    guarded: Callable[[Envelope], ConsumeResult] = decorator.idempotent_consumer(rel, group=group)(handler)
    return guarded


def push_consumer(transport: Any, group: str, options: dict[str, Any]) -> Any:
    """A broker_sim ``PushConsumer`` of ``group`` over ``transport`` (not started).

    ``options`` come from JSON (the worker's config), so enum-valued options travel by name.
    """
    mod = _import("broker_sim.client.push_consumer", "the broker_sim push consumer")
    from broker_sim.broker.api import ConsumeFromWhere

    opts = dict(options)
    if isinstance(opts.get("consume_from_where"), str):
        opts["consume_from_where"] = ConsumeFromWhere[opts["consume_from_where"]]
    return mod.PushConsumer(transport, group, **opts)


def producer(transport: Any, group: str, **options: Any) -> Any:
    """A started broker_sim ``Producer`` of ``group`` over ``transport`` (``options``: its keywords, e.g.
    ``send_latency_fault_enable`` on a cluster)."""
    mod = _import("broker_sim.client.producer", "the broker_sim producer")
    p = mod.Producer(transport, group, **options)
    p.start()
    return p


#: resend backoff of the demo's sweeper: seconds instead of RocketMQ's minutes-to-hours levels
DEMO_BACKOFF = "fixed:2s,3s,4s,5s,5s,5s,5s,5s,5s,5s"


def sweeper(rel: Reliability, sender: Sender, probe: Any | None = None) -> Any:
    """The resend sweeper of the demo (``run_once()`` is one round), with demo-scale timings.

    ``probe`` is the broker's view of its queues (default: the sender, when it is one): it proves a loss
    on a quiet queue and sizes the backlog estimate.
    """
    mod = _import("reliable.sweeper", "the resend sweeper")
    # the broker's retry delays are the demo's (seconds): with RocketMQ's (10 s … 2 h) the sweeper held a
    # row whose broker retry a power cut took for minutes to hours, past the demo's timeout
    levels = tuple(mod.parse_duration(d) for d in DEMO_DELAY_LEVELS.split())
    return mod.Sweeper(
        rel,
        sender,
        backoff=mod.parse_backoff(DEMO_BACKOFF),
        probe=probe,
        claim_ttl_s=10.0,
        retry_schedule=mod.RocketMQRetrySchedule(levels_s=levels),
    )


def pause(seconds: float) -> None:
    """Let time pass on purpose (a fault's duration); never used to wait for something to happen."""
    threading.Event().wait(max(0.0, seconds))


def close_quietly(obj: Any) -> None:
    """Close a client at shutdown; a failure there is logged, not raised over the run's result."""
    try:
        obj.close()
    except Exception:
        log.warning("closing %r failed", obj, exc_info=True)


def in_process_broker(store_dir: Path, config: dict[str, Any]) -> Any:
    """A started in-process broker_sim ``Broker`` over ``store_dir``."""
    broker_mod = _import("broker_sim.broker.broker", "the broker_sim broker")
    broker = broker_mod.Broker(str(store_dir), **config)
    broker.start()
    return broker


class Admin:
    """The few admin operations the demo needs, over the same transport the clients use."""

    def __init__(self, broker_or_address: Any) -> None:
        from broker_sim.client.transport import transport_for

        self.target = broker_or_address
        self.transport = transport_for(broker_or_address)
        self._queues: dict[str, tuple[int, list[str]]] = {}

    def track(self, topic: str, queues: int, broker_names: list[str] | None = None) -> None:
        """Remember a topic's queue count per broker group (for :meth:`lag`); no names: one broker."""
        self._queues[topic] = (queues, list(broker_names or [""]))

    def lag(self, topic: str, group: str) -> int:
        total = 0
        queues, names = self._queues.get(topic, (0, [""]))
        for name in names:
            for q in range(queues):
                top = self.transport.get_max_offset(topic, q, name)
                committed = self.transport.query_consumer_offset(group, topic, q, name) or 0
                total += max(0, int(top) - int(committed))
        return total

    def close(self) -> None:
        self.transport.close()


def admin(broker_or_address: Any) -> Admin:
    return Admin(broker_or_address)


def lag(admin: Admin, topic: str, group: str) -> int | None:
    """Messages stored but not yet committed by ``group`` (None when the broker does not answer)."""
    try:
        return admin.lag(topic, group)
    except Exception:
        return None


def shutdown_quietly(client: Any) -> None:
    """Shut a broker_sim client down at the end of a run; a failure there is logged, not raised."""
    try:
        client.shutdown()
    except Exception:
        log.warning("shutting down %r failed", client, exc_info=True)


#: retry delays short enough that a message retried after a lease conflict comes back within seconds
DEMO_DELAY_LEVELS = "1s 1s 2s 2s 3s 3s 4s 4s 5s 5s 6s 6s 7s 7s 8s 8s 9s 10s"


def broker_config(topics: dict[str, int]) -> dict[str, Any]:
    """Configuration of the demo broker (in-process keywords, or ``--set`` of ``broker-sim serve``).

    The demo topic is created at start-up; retry delays are seconds; the store files are sized for a demo
    (RocketMQ's defaults pre-allocate a 1 GiB commit log segment and a 400 MB index file).
    """
    return {
        "topics": topics,
        "message_delay_level": DEMO_DELAY_LEVELS,
        "commit_log_file_size": 64 * 1024 * 1024,
        "index_hash_slots": 100_000,
        "index_max_entries": 400_000,
    }


def serve_args(topics: dict[str, int]) -> list[str]:
    """``broker-sim serve`` flags of the demo broker: ASYNC_FLUSH (a crash can lose what was not flushed)
    and :func:`broker_config` as ``--set`` options."""
    args = ["--flush", "ASYNC_FLUSH", "--log-level", "INFO"]
    for key, value in broker_config(topics).items():
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        args += ["--set", f"{key}={text}"]
    return args


def consumer_options(dialect: str) -> dict[str, Any]:
    """Options of the demo's broker_sim PushConsumer.

    From the first offset (a new group must not skip orders produced before its first rebalance); offsets
    persisted every 2 s and rebalances every 5 s so faults show up and heal within a short run.

    SQLite has one writer at a time, so batches of 8 through the guard's batch mode (one journal and one work
    transaction per batch) and few threads. A server database takes row locks instead: one message per
    transaction, because a batch transaction holds the account rows of all its transfers at once and
    concurrent batches then deadlock on each other (PostgreSQL resolves each deadlock after
    ``deadlock_timeout``, 1 s, which would dominate the run).
    """
    sqlite = dialect == "sqlite"
    return {
        "consume_from_where": "CONSUME_FROM_FIRST_OFFSET",
        "consume_message_batch_max_size": 8 if sqlite else 1,
        "consume_threads": 4 if sqlite else 8,
        "persist_consumer_offset_interval_ms": 2000,
        "rebalance_interval_ms": 5000,
        "pull_time_delay_ms_when_exception": 500,
    }
