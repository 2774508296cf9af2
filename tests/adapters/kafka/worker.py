"""A consumer process for the multi-process Kafka test: ``python -m tests.adapters.kafka.worker …``.

It consumes ``topic`` for ``group`` through the guard and keeps ``status`` (a JSON file) current with the
partitions it holds and how many records it has processed. ``--die-after N`` kills the process with SIGKILL
right after the guard committed its N-th record, before the batch's offsets are committed to Kafka: the
crash a rebalance must recover from without applying anything twice. ``--fail-first ID`` makes the handler
fail the first time this process runs that message; ``--db-offsets 1`` keeps the positions in the database
(``offsets_in_db``); ``--dead-forwarder 1`` points the producer of retry copies at a port nothing listens on,
so no copy lands before the process dies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

from sqlalchemy.orm import Session

from reliable import Envelope, Reliability, idempotent_consumer
from reliable.adapters.kafka import KafkaGuardedConsumer, RetryPolicy, offsets_in_db
from reliable.demo.tansu import FAST_GROUP
from reliable.guard import Decision, GuardHooks
from tests.adapters.kafka.helpers import apply_effect

#: where ``--dead-forwarder`` sends the retry copies: a port of this project's test range nothing listens on
DEAD_FORWARDER = {"bootstrap.servers": "127.0.0.1:16449", "message.timeout.ms": 3000}


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
    ap.add_argument("--fail-first", default="")
    ap.add_argument("--db-offsets", type=int, default=0)
    ap.add_argument("--dead-forwarder", type=int, default=0)
    args = ap.parse_args()
    rel = Reliability(args.db, args.redis, key_prefix=args.prefix, lease_ms=5000)
    hook = DieAfter(args.die_after)
    effect = apply_effect(args.group)
    failed: set[str] = set()

    def handler(env: Envelope, session: Session) -> None:
        if env.message_id == args.fail_first and args.fail_first not in failed:
            failed.add(args.fail_first)
            raise RuntimeError(f"{args.fail_first} fails its first run in this process")
        effect(env, session)

    work = offsets_in_db(args.group)(handler) if args.db_offsets else handler
    handle = idempotent_consumer(rel, group=args.group, hooks=[hook])(work)
    status = Path(args.status)
    consumer = KafkaGuardedConsumer(
        args.bootstrap,
        args.topic,
        args.group,
        handle,
        retry=RetryPolicy(delays_s=(0.3,)),
        batch_size=20,
        batch=bool(args.batch),
        rel=rel,
        db_offsets=bool(args.db_offsets),
        config=FAST_GROUP,
        producer=DEAD_FORWARDER if args.dead_forwarder else None,
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
