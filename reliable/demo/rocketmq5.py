"""``reliable demo --broker rocketmq5``: the pipeline through broker_sim's RocketMQ 5.x gRPC front end.

A smaller sibling of the main demo, for teams on the official 5.x client: ``broker-sim serve --grpc-port``
as a child process, the stub-first producer over :class:`~reliable.adapters.rocketmq5.RocketMQ5Sender`, K
SimpleConsumer loops (threads) through the guard applying ledger transfers, then the ledger check. It runs
in a venv that has ``rocketmq-python-client`` (``reliable[rocketmq5]``, which cannot sit beside the 4.x
client); there broker_sim imports the generated protocol modules directly. No chaos schedule, no Spark
report (the main demo has both); the guard is database-only unless ``--redis`` is given.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from broker_sim.common.net import listen_port
from reliable.demo import ledger
from reliable.demo.errors import DemoError
from reliable.demo.services import BrokerServer, wait_port
from reliable.facade import Reliability

TOPIC = "demo_transfers5"
GROUP = "demo_ledger5"
ACCOUNTS = 20


@dataclass(frozen=True)
class Result5:
    messages: int
    check: ledger.LedgerCheck
    seconds: float

    @property
    def ok(self) -> bool:
        return self.check.ok and self.check.applied == self.messages

    def to_json(self) -> str:
        c = self.check
        return json.dumps(
            {"broker": "rocketmq5", "ok": self.ok, "messages": self.messages, "applied": c.applied,
             "lost": c.lost, "double_applied": c.double_applied, "seconds": round(self.seconds, 1)}
        )  # fmt: skip


def _client() -> object:
    try:
        import rocketmq
    except ImportError:
        rocketmq = None
    if rocketmq is None or not hasattr(rocketmq, "SimpleConsumer"):
        raise DemoError(
            "--broker rocketmq5 needs rocketmq-python-client in this venv (pip install 'reliable[rocketmq5]'"
            " in a venv without the 4.x 'rocketmq' client)"
        )
    return rocketmq


def run5(messages: int, consumers: int, workdir: Path, db: str | None, redis: str | None, seed: int,
         timeout_s: float) -> Result5:  # fmt: skip
    _client()
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    from reliable.adapters.rocketmq5 import RocketMQ5Sender, run_simple_consumer
    from reliable.decorator import idempotent_consumer
    from reliable.producer import StubProducer

    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    grpc_port = listen_port()
    broker = BrokerServer(
        workdir / "rmq5-store", workdir / "logs",
        ["--grpc-port", str(grpc_port), "--set", f"topics={json.dumps({TOPIC: 4})}",
         "--log-level", "WARNING"],
    )  # fmt: skip
    broker.start()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    clients: list[SimpleConsumer] = []
    rel = Reliability(
        db or f"sqlite:///{workdir / 'rmq5-demo.db'}", None if redis in (None, "none") else redis
    )
    try:
        assert broker.process is not None
        wait_port(grpc_port, broker.process.proc, "broker-sim serve (gRPC)")
        endpoint = f"127.0.0.1:{grpc_port}"
        rel.create_schema()
        ledger.reset(rel.engine, ACCOUNTS)
        orders = ledger.make_orders(uuid.uuid4().hex[:8], messages, ACCOUNTS, seed)
        config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
        for i in range(consumers):
            handle = idempotent_consumer(rel, group=GROUP)(ledger.make_business_handler(f"rmq5-{i}"))
            consumer = SimpleConsumer(config, GROUP, {TOPIC: FilterExpression()}, await_duration=1)
            consumer.startup()
            clients.append(consumer)
            t = threading.Thread(target=run_simple_consumer, args=(consumer, handle, stop), daemon=True)
            t.start()
            threads.append(t)
        sender = RocketMQ5Sender.connect(endpoint, (TOPIC,))
        producer = StubProducer(rel, sender, default_group=GROUP)
        for o in orders:
            producer.publish(o.order_id, TOPIC, o.to_body())
        sender.close()
        deadline = time.monotonic() + timeout_s
        while ledger.applied_count(rel.engine) < messages and time.monotonic() < deadline:
            stop.wait(0.2)
        return Result5(messages, ledger.check(rel.engine, [o.order_id for o in orders], ACCOUNTS),
                       time.monotonic() - started)  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for c in clients:
            c.shutdown()
        rel.close()
        broker.stop()
