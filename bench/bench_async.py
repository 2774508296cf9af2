"""b6: the guard for ``async def`` handlers, 64 tasks on one event loop ÷ the sync guard with 8 threads.

Same PostgreSQL (a scratch database of this run), same Redis, same business insert, fresh message ids
without producer rows (the inbox pattern), single-message calls. The async side runs ``TASKS`` workers on one
loop pulling from a shared queue; the sync side runs ``THREADS`` threads over the same number of messages.
Both use the engine pools' defaults. Two variants: the handler does only its insert (``--io-ms 0``, the
issue's b6, CPU-bound on this machine), and the handler also waits 20 ms on a downstream call
(``time.sleep`` in the thread, ``asyncio.sleep`` on the loop), the case asyncio exists for. Rounds are
interleaved (async, sync, sync, async, …) and the reported figure is the median of the per-round ratios, so
background load on a shared machine hits both sides alike. Target ≥ 1.5 (issue 14).

``python -m bench.bench_async [--n 2000] [--rounds 3] [--io-ms 0,20]``; ``python -m bench async``: defaults
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from bench.harness import clean_redis, database, envelopes, fresh, ledger_sql, make_rel
from reliable import Envelope, Reliability, idempotent_consumer

TASKS = 64
THREADS = 8
TARGET = 1.5


def handlers(rel: Reliability, io_ms: float) -> tuple[object, object]:
    """The sync and the async guarded handler: one ledger row, then ``io_ms`` of waiting on "the network"."""
    sql = ledger_sql(rel)
    wait_s = io_ms / 1000

    def handler(env: Envelope, session: Session) -> None:
        session.connection().exec_driver_sql(sql, (env.message_id,))
        if wait_s:
            time.sleep(wait_s)  # a downstream call the thread blocks on

    handle = idempotent_consumer(rel, group=f"b6-{io_ms:g}", registry=CollectorRegistry())(handler)

    async def ahandler(env: Envelope, session: AsyncSession) -> None:  # the same statement, same path
        await (await session.connection()).exec_driver_sql(sql, (env.message_id,))
        if wait_s:
            await asyncio.sleep(wait_s)  # the same downstream call, awaited

    return handle, idempotent_consumer(rel, group=f"b6a-{io_ms:g}", registry=CollectorRegistry())(ahandler)


def run_sync(handle: object, envs: Sequence[Envelope]) -> float:
    """Seconds for ``THREADS`` threads to guard ``envs`` one message per call."""
    shares = [envs[i::THREADS] for i in range(THREADS)]

    def worker(part: Sequence[Envelope]) -> None:
        for e in part:
            handle(e)  # type: ignore[operator]

    t = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(worker, shares))
    return time.perf_counter() - t


def run_async(loop: asyncio.AbstractEventLoop, handle: object, envs: Sequence[Envelope]) -> float:
    """Seconds for ``TASKS`` tasks on one loop to guard ``envs`` one message per call."""

    async def all_tasks() -> None:
        queue: asyncio.Queue[Envelope] = asyncio.Queue()
        for e in envs:
            queue.put_nowait(e)

        async def worker() -> None:
            while not queue.empty():
                await handle(queue.get_nowait())  # type: ignore[operator]

        await asyncio.gather(*(worker() for _ in range(TASKS)))

    t = time.perf_counter()
    loop.run_until_complete(all_tasks())
    return time.perf_counter() - t


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench async", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="messages per side per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--io-ms", default="0,20", help="handler I/O wait variants in ms (0: database only)")
    args = ap.parse_args(argv)
    prefix = f"bench{os.getpid()}"
    with database("postgres") as url:
        rel = make_rel(url, prefix)
        loop = asyncio.new_event_loop()
        try:
            for io_ms in (float(x) for x in args.io_ms.split(",")):
                measure(rel, loop, io_ms, args.n, args.rounds)
            loop.run_until_complete(rel.aclose())
        finally:
            loop.close()
            clean_redis(rel.redis, prefix)
            rel.close()
    return 0


def measure(rel: Reliability, loop: asyncio.AbstractEventLoop, io_ms: float, n: int, rounds: int) -> float:
    """Median of the per-round ratios async msg/s ÷ sync msg/s, rounds interleaved (A B, B A, …)."""
    sync_handle, async_handle = handlers(rel, io_ms)
    run_async(loop, async_handle, envelopes(fresh("warm-a", 200)))  # connections, caches
    run_sync(sync_handle, envelopes(fresh("warm-s", 200)))
    ratios, rates = [], []
    for r in range(rounds):
        a_env, s_env = envelopes(fresh("a", n)), envelopes(fresh("s", n))
        if r % 2 == 0:
            ta = run_async(loop, async_handle, a_env)
            ts = run_sync(sync_handle, s_env)
        else:
            ts = run_sync(sync_handle, s_env)
            ta = run_async(loop, async_handle, a_env)
        rates.append((n / ta, n / ts))
        ratios.append(ts / ta)
    med = statistics.median(ratios)
    a_rate = statistics.median(x for x, _ in rates)
    s_rate = statistics.median(y for _, y in rates)
    verdict = "ok" if med >= TARGET else f"MISSED by {100 * (1 - med / TARGET):.0f}%"
    print(
        f"b6 handler I/O {io_ms:3g} ms: async ({TASKS} tasks, 1 loop) {a_rate:6.0f} msg/s   "
        f"sync ({THREADS} threads) {s_rate:6.0f} msg/s   ratio {med:4.2f} "
        f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})  target ≥ {TARGET}  {verdict}"
    )
    return med


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
