"""A consumer process for the multi-process Kafka test: ``python -m tests.adapters.kafka.worker …``.

It consumes ``topic`` for ``group`` through the guard and keeps ``status`` (a JSON file) current with the
partitions it holds and how many records it has processed. ``--die-after N`` kills the process with SIGKILL
right after the guard committed its N-th record, before the batch's offsets are committed to Kafka: the
crash a rebalance must recover from without applying anything twice.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.kafka import KafkaGuardedConsumer, RetryPolicy
from reliable.demo.tansu import FAST_GROUP
from reliable.guard import Decision, GuardHooks
from tests.adapters.kafka.helpers import apply_effect


class DieAfter(GuardHooks):
    def __init__(self, n: int) -> None:
        self.n = n
        self.processed = 0

    def after_decision(self, env: Envelope, decision: Decision) -> None:
        if not decision.duplicate and decision.result.value == "SUCCESS":
            self.processed += 1
            if self.n and self.processed >= self.n:
                os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "group", "db", "redis", "prefix", "status"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--die-after", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    rel = Reliability(args.db, args.redis, key_prefix=args.prefix, lease_ms=5000)
    hook = DieAfter(args.die_after)
    handle = idempotent_consumer(rel, group=args.group, hooks=[hook])(apply_effect(args.group))
    status = Path(args.status)
    consumer = KafkaGuardedConsumer(
        args.bootstrap,
        args.topic,
        args.group,
        handle,
        retry=RetryPolicy(delays_s=(0.3,)),
        batch_size=20,
        batch=bool(args.batch),
        config=FAST_GROUP,
    )
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())

    def report() -> bool:
        tmp = status.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "assigned": sorted(p for t, p in consumer.assigned if t == args.topic),
                    "processed": hook.processed,
                }
            )
        )
        tmp.replace(status)
        return False

    consumer.run(until=report)
    consumer.close()
    handle.close()  # writes the journal rows the guard buffered (duplicates answered by Redis)


if __name__ == "__main__":
    main()
