"""Issue 18's remoting targets, measured in one run, interleaved (``python -m bench remoting --targets``).

* **r1** — synchronous sends/s to ``broker-sim serve`` ÷ sends/s to the minimal asyncio server of
  :mod:`bench.remoting_baseline` (canned SEND_MESSAGE_V2 reply, stores nothing), both in their own process,
  both driven by the same lean client (:class:`~bench.remoting_baseline.FrameClient`: one SEND_MESSAGE_V2
  frame, 1 KiB body, then its reply, then the next). Target ≥ 0.5.
* **r2** — one ``Producer("host:port")`` keeping 64 ``send_async`` in flight on one connection to
  ``broker-sim serve`` ÷ in-process puts: ``Producer(broker).send`` of the same messages, one after another,
  on a Broker in the bench process (the existing baseline of ``bench_remoting``). Target ≥ 0.3.

Every round starts fresh servers and stores (ASYNC_FLUSH, one topic of 4 queues) and measures all four
configurations, alternating their order, after a warm-up of 200 sends each; each round's ratio pairs figures
taken a few seconds apart. Reported: every round, then the median rates and the median of the per-round
ratios.

Two rules keep one measurement from differing from the next for reasons that are not the code's:

* **The same time, not the same count.** Each measurement sends at least ``n`` messages *and* keeps going
  for at least ``seconds`` (default 2). With a fixed count, the in-process baseline (50,000–70,000 puts/s
  on an idle machine) was timed over 60–80 ms — less than one interval of the store's commit-log flush
  (500 ms) and consume-queue/index flush (1 s), so whether a flush fell inside it decided a good part of
  its rate, while the TCP run, four times longer, always paid for some. Over two seconds every
  configuration pays for the same periodic work.
* **A fresh process each.** Every measurement runs in its own interpreter (``multiprocessing``
  "spawn"), so none inherits the heap, the garbage-collector generations or the leftover threads of the
  ones before it; in one process the in-process rate moved by a fifth depending on what ran first.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.remoting_baseline import BaselineProcess, FrameClient
from broker_sim.remoting.serve_process import ServeProcess

BODY = b"x" * 1024
TOPIC = "BenchT"
WARM_UP = 200
WINDOW = 64
#: sends between two looks at the clock
CHUNK = 100


def _topics() -> tuple[str, str]:
    return "--set", "topics=" + json.dumps({TOPIC: 4})


def _timed(send: Callable[[], object], n: int, seconds: float) -> float:
    """Sends/s of ``send`` called at least ``n`` times and for at least ``seconds``, after the warm-up."""
    for _ in range(WARM_UP):
        send()
    done = 0
    t0 = time.perf_counter()
    while done < n or time.perf_counter() - t0 < seconds:
        for _ in range(CHUNK):
            send()
        done += CHUNK
    return done / (time.perf_counter() - t0)


def _frames(address: str, n: int, seconds: float) -> float:
    client = FrameClient(address, TOPIC, BODY)
    try:
        return _timed(client.send, n, seconds)
    finally:
        client.close()


def r1_baseline(n: int, seconds: float, store: Path) -> float:
    with BaselineProcess() as server:
        return _frames(server.address, n, seconds)


def r1_serve(n: int, seconds: float, store: Path) -> float:
    with ServeProcess(store, *_topics()) as server:
        return _frames(server.broker, n, seconds)


def r2_in_process(n: int, seconds: float, store: Path) -> float:
    from broker_sim import Broker, Message, Producer

    broker = Broker(store, topics={TOPIC: 4})
    broker.start()
    try:
        producer = Producer(broker, "InProcP")
        rate = _timed(lambda: producer.send(Message(TOPIC, BODY)), n, seconds)
        producer.shutdown()
        return rate
    finally:
        broker.shutdown()


def r2_async_tcp(n: int, seconds: float, store: Path) -> float:
    """The window stays full: sends are handed over a chunk at a time (``send_async`` waits for a free
    slot), and the clock stops when the last reply is in. Like an application, the loop lets go of a
    send's Future once its result is checked: keeping every Future of a two-second run alive would make
    the interpreter's garbage collector walk tens of thousands of them, which is not the producer's cost."""
    from collections import deque
    from concurrent.futures import Future

    from broker_sim import Message, Producer
    from broker_sim.common.message import SendResult

    with ServeProcess(store, *_topics()) as server:
        try:
            producer = Producer(server.namesrv, "AsyncP", async_send_window=WINDOW)
        except TypeError:  # broker_sim before issue 18 (the "before" figure): send_async on 4 threads
            producer = Producer(server.namesrv, "AsyncP")
        try:
            for f in [producer.send_async(Message(TOPIC, BODY)) for _ in range(WARM_UP)]:
                f.result(30)
            pending: deque[Future[SendResult]] = deque()
            sent = 0
            t0 = time.perf_counter()
            while sent < n or time.perf_counter() - t0 < seconds:
                pending.extend(producer.send_async(Message(TOPIC, BODY)) for _ in range(CHUNK))
                sent += CHUNK
                while len(pending) > WINDOW + CHUNK:  # older than the window: answered already
                    pending.popleft().result(30)
            for f in pending:
                f.result(30)
            return sent / (time.perf_counter() - t0)
        finally:
            producer.shutdown()


MEASURES: dict[str, Callable[[int, float, Path], float]] = {
    "r1 baseline (asyncio, canned reply)": r1_baseline,
    "r1 broker-sim serve": r1_serve,
    "r2 in-process Producer.send": r2_in_process,
    f"r2 TCP send_async, {WINDOW} in flight": r2_async_tcp,
}


SHORT = ("r1-base", "r1-serve", "r2-inproc", "r2-async")


def _measure(name: str, n: int, seconds: float, store: Path) -> float:
    return MEASURES[name](n, seconds, store)


def _in_fresh_process(name: str, n: int, seconds: float, store: Path) -> float:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_measure, name, n, seconds, store).result()


def targets(n: int, rounds: int, seconds: float = 2.0) -> dict[str, float]:
    """Run the rounds, print the table, return the median ratios ``{"r1": …, "r2": …}``."""
    names = list(MEASURES)
    rates: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for i, name in enumerate(order):
                rates[name].append(_in_fresh_process(name, n, seconds, Path(d) / f"round{r}-{i}"))
            row = "  ".join(
                f"{short} {rates[name][-1]:,.0f}" for short, name in zip(SHORT, names, strict=True)
            )
            print(f"round {r + 1}: {row} msg/s", flush=True)
    r1 = [s / b for b, s in zip(rates[names[0]], rates[names[1]], strict=True)]
    r2 = [a / p for p, a in zip(rates[names[2]], rates[names[3]], strict=True)]
    print(
        f"1 KiB bodies, at least {n} sends and {seconds:g} s per measurement (each in a fresh process), "
        f"{rounds} interleaved rounds, ASYNC_FLUSH, 4 queues"
    )
    for name in names:
        print(f"  {name:40} median {statistics.median(rates[name]):9,.0f} msg/s")
    for label, ratios in (("r1 serve ÷ asyncio baseline", r1), ("r2 async TCP ÷ in-process", r2)):
        per_round = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"{label:28}: per round [{per_round}], median {statistics.median(ratios):.2f}")
    return {"r1": statistics.median(r1), "r2": statistics.median(r2)}
