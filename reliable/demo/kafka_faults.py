"""The Kafka demo's chaos: a seeded schedule of faults, each fired at its order while the orders are produced.

* **lost offset commits** — one consumer's commits are dropped for a while, then it leaves: its partitions
  replay from the last commit that did arrive (the guard suppresses the duplicates);
* **consumer crash** — one consumer stops after its guard commits and before its offset commit, and leaves
  without committing: the next owner of its partitions gets the batch again;
* **consumers stalled, then broker restart with memory storage** — the consumers stop fetching, the next
  orders are acknowledged and then lost with every committed offset (what a lost produce acknowledgement or
  an unflushed power cut loses): the sweeper must repair them from the stubs.

Each fault returns a one-line description for the result.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from reliable.adapters.kafka import ensure_topics
from reliable.demo.kafka_consumers import (
    PARTITIONS,
    ChaosConsumer,
    ConsumerThread,
    held_partitions,
    live_consumers,
)
from reliable.demo.tansu import Tansu

log = logging.getLogger("reliable.demo.kafka")

Say = Callable[[str], None]
Fault = Callable[[Tansu, list[ConsumerThread], list[str], Say], str]


def schedule(chaos: bool, seed: int, n: int) -> dict[int, Fault]:
    """The faults of a run of ``n`` orders, by the index of the order before which each fires."""
    if not chaos:
        return {}
    rng = random.Random(f"kafka-chaos:{seed}")
    at = [int(n * (share + rng.uniform(-0.05, 0.05))) for share in (0.15, 0.4, 0.7)]
    stalled = max(1, n // 30)  # orders the broker acknowledges and then loses before anyone consumed them
    return {
        at[0]: lose_commits,
        at[1]: crash_consumer,
        at[2]: stall_consumers,
        at[2] + stalled: restart_broker,
    }


def _victim(threads: list[ConsumerThread]) -> ChaosConsumer | None:
    """A consumer no fault has touched yet, as long as another one stays to take over its partitions."""
    live = live_consumers(threads)
    untouched = [c for c in live if not c.touched]
    return untouched[0] if untouched and len(live) > 1 else None


def lose_commits(broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Say) -> str:
    victim = _victim(threads)
    if victim is None:
        return "lost offset commits (skipped: one consumer left)"
    victim.drop_commits = True
    threading.Timer(2.0, victim.stop).start()  # it leaves without one more commit: its partitions replay
    say("chaos: a consumer's offset commits are lost, then it leaves")
    return "lost offset commits"


def _wait_whole(threads: list[ConsumerThread], timeout_s: float = 20.0) -> None:
    """Until the consumers no fault touched hold every partition again (the previous fault's rebalance)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(held_partitions([c for c in live_consumers(threads) if not c.touched])) == PARTITIONS:
            return
        time.sleep(0.1)
    log.warning("the group did not re-form within %.0fs; injecting the next fault anyway", timeout_s)


def crash_consumer(broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Say) -> str:
    _wait_whole(threads)
    victim = _victim(threads)
    if victim is None:
        return "consumer crash (skipped: one consumer left)"
    victim.crash_before_commit = True
    say("chaos: a consumer crashes after its guard commit, before its offset commit")
    return "consumer crash"


def stall_consumers(broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Say) -> str:
    _wait_whole(threads)
    for t in threads:
        if t.consumer is not None:
            t.consumer.stalled = True
    _wait_parked(threads)
    say("chaos: every consumer stalls: the next orders are acknowledged by the broker but not consumed")
    return "consumers stalled"


def _wait_parked(threads: list[ConsumerThread], timeout_s: float = 20.0) -> None:
    """Until every live consumer has left the poll it was in: only then are the next orders unconsumed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(c.parked for c in live_consumers(threads)):
            return
        time.sleep(0.05)
    log.warning("a stalled consumer is still in its poll after %.0fs; restarting the broker", timeout_s)


def restart_broker(broker: Tansu, threads: list[ConsumerThread], topics: list[str], say: Say) -> str:
    broker.restart()
    ensure_topics(broker.bootstrap, topics, partitions=PARTITIONS)
    for t in threads:
        if t.consumer is not None:
            t.consumer.stalled = False
    say("chaos: Tansu restarted with memory storage: every record and committed offset is gone")
    return "broker restart (total loss)"
