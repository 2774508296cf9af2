"""broker_sim over TCP: produce and consume throughput, 1 KiB bodies, one producer / one consumer.

Three ways to reach the same kind of broker (ASYNC_FLUSH, 4 queues), measured in one run:

* in-process — ``Producer(broker)`` / ``PushConsumer(broker)`` calling the Broker directly (the baseline);
* TCP, ours — the same client classes with ``"host:port"``, against ``broker-sim serve`` in a subprocess;
* TCP, real client — PyPI ``rocketmq`` 0.4.4 (the C++ client), ``send_sync`` and a ``PushConsumer``,
  each timed inside its own subprocess.

Produce = sequential synchronous sends; consume = a push consumer reading the backlog from offset 0 until
it has seen every message. Ratios printed: TCP ÷ in-process for our client, real ÷ ours over TCP.

``--fuzz N`` instead runs N byte-mutated frames through the decoder and N/10 over a socket against a live
server, and reports outcomes (decoded / FrameError / anything else = crash; must be 0).

``--targets`` instead measures issue 18's r1 (``broker-sim serve`` ÷ a minimal asyncio server, synchronous
sends) and r2 (64 async sends in flight over TCP ÷ in-process puts): :mod:`bench.remoting_targets`.

``python -m bench remoting [--n 2000] [--rounds 3] [--fuzz 0] [--targets [--seconds 2]]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from broker_sim.remoting.serve_process import ServeProcess

BODY = b"x" * 1024
TOPIC = "BenchT"
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@contextlib.contextmanager
def served(store: Path) -> Iterator[str]:
    with ServeProcess(store, "--set", "topics=" + json.dumps({TOPIC: 4})) as server:
        yield server.namesrv


def ours(target: object, n: int, group: str) -> tuple[float, float]:
    """(produce msgs/s, consume msgs/s) with broker_sim's own client against ``target``."""
    from broker_sim import ConsumeStatus, Message, MessageExt, Producer, PushConsumer
    from broker_sim.common.requests import ConsumeFromWhere

    producer = Producer(target, f"{group}P")
    t0 = time.perf_counter()
    for _ in range(n):
        producer.send(Message(TOPIC, BODY))
    produce = n / (time.perf_counter() - t0)
    producer.shutdown()
    got = 0
    lock, done = threading.Lock(), threading.Event()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal got
        with lock:
            got += len(msgs)
            if got >= n:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        target,
        f"{group}C",
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=1,
    )
    consumer.subscribe(TOPIC, "*", listener)
    t0 = time.perf_counter()
    consumer.start()
    if not done.wait(300):
        raise RuntimeError(f"consumer saw {got} of {n}")
    consume = n / (time.perf_counter() - t0)
    consumer.shutdown()
    return produce, consume


REAL_PRODUCE = textwrap.dedent("""
    import sys, time
    from rocketmq.client import Message, Producer
    p = Producer("RealBenchP"); p.set_namesrv_addr(sys.argv[1]); p.start()
    n = int(sys.argv[2]); body = b"x" * 1024
    t0 = time.perf_counter()
    for i in range(n):
        m = Message("BenchT"); m.set_body(body); p.send_sync(m)
    print(n / (time.perf_counter() - t0)); p.shutdown()
""")
REAL_CONSUME = textwrap.dedent("""
    import sys, threading, time
    from rocketmq.client import PushConsumer
    n = int(sys.argv[2]); got = [0]; done = threading.Event(); lock = threading.Lock()
    def cb(msg):
        with lock:
            got[0] += 1
            if got[0] >= n: done.set()
    c = PushConsumer("RealBenchC"); c.set_namesrv_addr(sys.argv[1]); c.subscribe("BenchT", cb)
    t0 = time.perf_counter(); c.start()
    ok = done.wait(300)
    print(n / (time.perf_counter() - t0) if ok else 0.0); c.shutdown()
""")


def real(namesrv: str, n: int, home: Path) -> tuple[float, float]:
    env = {**ENV, "HOME": str(home)}
    rates = []
    for script in (REAL_PRODUCE, REAL_CONSUME):
        out = subprocess.run(
            [sys.executable, "-c", script, namesrv, str(n)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=True,
        )
        rates.append(float(out.stdout.strip().splitlines()[-1]))
    return rates[0], rates[1]


def throughput(n: int, rounds: int) -> None:
    """Each round measures all three configurations on fresh stores, interleaved, so background load on a
    shared machine hits them alike; the best round of each is reported (throughput's least-disturbed run)."""
    from broker_sim import Broker

    best: dict[str, tuple[float, float]] = {}

    def keep(name: str, rates: tuple[float, float]) -> None:
        old = best.get(name, (0.0, 0.0))
        best[name] = (max(old[0], rates[0]), max(old[1], rates[1]))

    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            base = Path(d) / f"round{r}"
            broker = Broker(base / "inproc", topics={TOPIC: 4})
            broker.start()
            try:
                keep("in-process (baseline)", ours(broker, n, "InProc"))
            finally:
                broker.shutdown()
            with served(base / "tcp-ours") as ns:
                keep("TCP, broker_sim client", ours(ns, n, "Tcp"))
            with served(base / "tcp-real") as ns:
                keep("TCP, rocketmq 0.4.4 (C++)", real(ns, n, base))
    print(f"1 KiB, n={n}, one producer / one consumer, ASYNC_FLUSH, 4 queues, best of {rounds} rounds")
    print(f"{'':28}{'produce msg/s':>15}{'consume msg/s':>15}")
    for name, (p, c) in best.items():
        print(f"{name:28}{p:15.0f}{c:15.0f}")
    (in_p, in_c), (tcp_p, tcp_c), (real_p, real_c) = best.values()
    print(f"ratio TCP ours ÷ in-process: produce {tcp_p / in_p:.2f}, consume {tcp_c / in_c:.2f}")
    print(f"ratio real client ÷ ours over TCP: produce {real_p / tcp_p:.2f}, consume {real_c / tcp_c:.2f}")


def fuzz(n: int, seed: int = 7) -> None:
    from broker_sim.remoting.errors import FrameError
    from broker_sim.remoting.frame import FrameDecoder, RemotingCommand, SerializeType, encode
    from broker_sim.remoting.server import RemotingServer

    rng = random.Random(seed)
    bases = [
        encode(
            RemotingCommand.request(
                11, {"consumerGroup": "G", "topic": "T", "queueId": 1, "queueOffset": 0}, b"body" * 8
            )
        ),
        encode(
            RemotingCommand(
                code=34,
                body=b'{"clientID":"x"}',
                serialize_type=SerializeType.ROCKETMQ,
                ext_fields={"a": "b"},
            )
        ),
    ]

    def mutate() -> bytes:
        f = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            if op < 0.6:
                f[rng.randrange(len(f))] = rng.randrange(256)
            elif op < 0.8:
                del f[rng.randrange(len(f)) :]
                if not f:
                    f = bytearray(b"\x00")
            else:
                i = rng.randrange(len(f))
                f[i:i] = rng.randbytes(rng.randint(1, 16))
        return bytes(f)

    outcomes = {"decoded": 0, "incomplete": 0, "FrameError": 0, "crash": 0}
    t0 = time.perf_counter()
    for _ in range(n):
        dec = FrameDecoder()
        try:
            outcomes["decoded" if dec.feed(mutate()) else "incomplete"] += 1
        except FrameError:
            outcomes["FrameError"] += 1
        except Exception:  # counting is the point: any other exception is a decoder bug
            outcomes["crash"] += 1
    print(f"decoder: {n} mutated frames in {time.perf_counter() - t0:.1f}s: {outcomes}")
    logging.getLogger("broker_sim.remoting.server").setLevel(logging.ERROR)  # one warning per bad frame
    srv = RemotingServer({11: lambda c, _: c.reply(19), 34: lambda c, _: c.reply(0)}, name="fuzz")
    srv.start()
    try:
        for _ in range(max(1, n // 10)):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                try:
                    s.sendall(mutate())
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(65536):
                        pass
                except OSError:
                    pass  # the server may close first (a bad length is refused before the rest arrives)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:  # still alive?
            s.sendall(encode(RemotingCommand(code=34, opaque=1)))
            alive = bool(FrameDecoder().feed(s.recv(65536)))
    finally:
        srv.shutdown()
    print(f"server: {max(1, n // 10)} mutated frames over TCP, stats {srv.stats}, alive afterwards: {alive}")
    if outcomes["crash"] or not alive or srv.stats.handler_errors:
        raise SystemExit("fuzz found a crash")


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench remoting", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="messages per measurement (default 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds, best reported (default 3)")
    ap.add_argument("--fuzz", type=int, default=0, help="run N byte mutations instead of the throughput test")
    ap.add_argument(
        "--targets", action="store_true", help="measure r1 and r2 instead (bench.remoting_targets)"
    )
    ap.add_argument(
        "--seconds", type=float, default=2.0, help="with --targets: least time per measurement (default 2)"
    )
    args = ap.parse_args(list(argv))
    if args.targets:
        from bench.remoting_targets import targets

        targets(args.n, args.rounds, args.seconds)
    elif args.fuzz:
        fuzz(args.fuzz)
    else:
        throughput(args.n, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
