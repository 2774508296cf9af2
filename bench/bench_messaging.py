"""End-to-end in-process messaging throughput: one producer + one push consumer, 1 KiB bodies, ASYNC_FLUSH.

Baseline, measured in the same run: the bare storage engine doing the same work without the messaging layer
(``MessageStore.put_message`` for every message, then ``get_message`` batches of 32 until all are read).
The ratio (ours ÷ baseline throughput) is the share of raw store speed left after routing, sync send with
reply, long-polling pulls, process queues, the consume thread pool and offset bookkeeping.

    python -m bench messaging            # defaults: 20000 messages
    python -m bench.bench_messaging --messages 50000
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from broker_sim import Broker, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from broker_sim.store.config import StoreConfig
from broker_sim.store.message_record import MessageInner
from broker_sim.store.message_store import MessageStore
from broker_sim.store.results import GetMessageStatus

BODY = b"x" * 1024
STORE = {"commit_log_file_size": 256 * 1024 * 1024, "flush_disk_type": "ASYNC_FLUSH"}


def bench_end_to_end(root: Path, n: int) -> float:
    """Messages per second from the first send to the last listener call."""
    broker = Broker(root / "e2e", topics={"BENCH": 4}, **STORE).start()
    done = threading.Event()
    count = 0
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal count
        with lock:
            count += len(msgs)
            if count >= n:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(broker, "BENCH_G").subscribe("BENCH", "*", listener).start()
    producer = Producer(broker, "BENCH_P")
    start = time.perf_counter()
    for i in range(n):
        producer.send(Message("BENCH", BODY, keys=f"k{i}"))
    if not done.wait(600):
        raise RuntimeError(f"only {count} of {n} messages consumed")
    elapsed = time.perf_counter() - start
    producer.shutdown()
    consumer.shutdown()
    broker.shutdown()
    return n / elapsed


def bench_store_baseline(root: Path, n: int) -> float:
    """Messages per second for put-all then get-all on the bare store (same body, same flush mode)."""
    store = MessageStore(root / "base", StoreConfig(commit_log_file_size=STORE["commit_log_file_size"]))  # type: ignore[arg-type]
    store.start()
    start = time.perf_counter()
    for i in range(n):
        store.put_message(MessageInner("BENCH", BODY, queue_id=i % 4, properties={"KEYS": f"k{i}"}))
    store.wait_dispatched(60)
    read = 0
    for q in range(4):
        offset = 0
        while True:
            r = store.get_message("G", "BENCH", q, offset, 32)
            if r.status is not GetMessageStatus.FOUND:
                break
            read += len(r.messages)
            offset = r.next_begin_offset
    elapsed = time.perf_counter() - start
    store.shutdown()
    if read != n:
        raise RuntimeError(f"baseline read {read} of {n}")
    return n / elapsed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_messaging", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-messaging-"))
    try:
        base = bench_store_baseline(root, args.messages)
        ours = bench_end_to_end(root, args.messages)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"messages: {args.messages} x 1 KiB, ASYNC_FLUSH, 4 queues, in-process")
    print(f"baseline (bare store put + get):              {base:10,.0f} msg/s  {1e6 / base:7.1f} µs/msg")
    print(f"ours (producer -> broker -> push consumer):    {ours:10,.0f} msg/s  {1e6 / ours:7.1f} µs/msg")
    cost = 1e6 / ours - 1e6 / base
    print(f"ratio ours / baseline: {ours / base:.2f}  (messaging machinery costs {cost:.1f} µs/msg)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
