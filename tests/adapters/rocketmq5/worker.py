"""Runs in the 5.x venv: a ``reliable`` consumer (or stub producer) over the official 5.x client.

``worker.py '<json spec>'``. Modes: ``simple`` (``run_simple_consumer``), ``push`` (``GuardedListener``)
until SIGTERM; ``produce`` stages messages through ``StubProducer`` + ``RocketMQ5Sender`` and exits
(``bodies`` and ``properties``: per message id, optional); ``send`` uses the Sender and the probe alone
and prints their answers as JSON. The business handler records each application in ``applied5`` (one
row per group and message, in the guard's transaction) and leaves a ``started-<id>-<pid>`` file in the
control directory before its work; a message whose body is ``slow`` waits until the control file
``release`` exists (a handler that runs for a while); the first attempt at a message whose body is
``flaky`` raises, every attempt at one whose body is ``poison``; one whose body is ``slow-poison`` waits
for ``release`` and then raises. ``guard_max_attempts`` sets the guard's ``max_attempts``. ``sweep`` runs
sweeper rounds over ``RocketMQ5Sender`` (its clock ``ahead_s`` ahead) and prints their summaries as JSON.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
from sqlalchemy import text

from reliable import Reliability
from reliable.adapters.rocketmq5 import (
    RocketMQ5Sender,
    guarded_push_consumer,
    run_simple_consumer,
)
from reliable.decorator import idempotent_consumer
from reliable.models import utcnow
from reliable.producer import StubProducer
from reliable.sender import BrokerProbe, OutgoingMessage, RetentionProbe
from reliable.sweeper.sweeper import Sweeper
from reliable.types import Envelope


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    if spec["mode"] == "send":  # the Sender and the probe alone, no database
        sender = RocketMQ5Sender.connect(spec["endpoint"], (spec["topic"],))
        receipts = []
        for mid in spec["ids"]:
            props = spec.get("properties", {})
            target = spec.get("target_group")  # a sweeper's resend for that group
            out = OutgoingMessage(mid, spec["topic"], mid.encode(), properties=props, target_group=target)
            r = sender.send(out)
            receipts.append([r.queue_id, r.queue_offset, r.broker_message_id])
        assert isinstance(sender, BrokerProbe)  # the sweeper gets sender and probe in one object
        assert isinstance(sender, RetentionProbe)  # and the other end of each queue
        offsets = [sender.max_offset(spec["topic"], q) for q in (-1, 0, 1, 2, 3)]
        bottoms = [sender.min_offset(spec["topic"], q) for q in (-1, 0, 1, 2, 3)]
        sender.close()
        print(json.dumps({"receipts": receipts, "max_offsets": offsets, "min_offsets": bottoms}), flush=True)
        return
    guard = {"max_attempts": spec["guard_max_attempts"]} if "guard_max_attempts" in spec else {}
    rel = Reliability(spec["db_url"], None, lease_ms=2000, **guard)
    if spec["mode"] == "produce":
        sender = RocketMQ5Sender.connect(spec["endpoint"], (spec["topic"],))
        producer = StubProducer(rel, sender)
        bodies, props = spec.get("bodies", {}), spec.get("properties", {})
        for mid in spec["ids"]:
            body = bodies.get(mid, f"body-{mid}").encode()
            producer.publish(mid, spec["topic"], body, groups=spec["groups"], properties=props.get(mid))
        sender.close()
        print("done", flush=True)
        return
    if spec["mode"] == "sweep":  # sweeper rounds over the 5.x sender, its clock ``ahead_s`` ahead of now
        sender = RocketMQ5Sender.connect(spec["endpoint"], (spec["topic"],))
        ahead = dt.timedelta(seconds=spec["ahead_s"])
        sweeper = Sweeper(rel, sender, clock=lambda: utcnow() + ahead,
                          max_unconfirmed_age_s=spec["max_unconfirmed_age_s"])  # fmt: skip
        rounds = [dataclasses.asdict(sweeper.run_once()) for _ in range(spec.get("rounds", 1))]
        sender.close()
        print(json.dumps(rounds), flush=True)
        return
    control = Path(spec["control"])
    group = spec["group"]

    def business(env: Envelope, session: Any) -> None:
        (control / f"started-{env.message_id}-{os.getpid()}").touch()
        failed = control / f"failed-{env.message_id}"
        if env.body == b"flaky" and not failed.exists():
            failed.touch()
            raise RuntimeError("the first attempt of a flaky message fails")
        if env.body == b"poison":
            raise RuntimeError("a poison message fails every time")
        if env.body in (b"slow", b"slow-poison"):
            while not (control / "release").exists():
                time.sleep(0.05)  # the work itself: this handler runs until the test releases it
        if env.body == b"slow-poison":
            raise RuntimeError("a slow poison message fails every time, once released")
        session.execute(
            text("INSERT INTO applied5 (group_name, message_id, worker) VALUES (:g, :m, :w)"),
            {"g": group, "m": env.message_id, "w": os.getpid()},
        )

    handle = idempotent_consumer(rel, group=group)(business)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=5)
    timing = {"invisible_s": spec["invisible_s"], "extend_every_s": spec["extend_every_s"]}
    if "max_attempts" in spec:
        timing["max_attempts"] = spec["max_attempts"]
    if spec["mode"] == "simple":
        consumer = SimpleConsumer(config, group, {spec["topic"]: FilterExpression()}, await_duration=1)
        consumer.startup()
        print("ready", flush=True)
        run_simple_consumer(consumer, handle, stop, **timing)
    else:
        consumer = guarded_push_consumer(config, group, spec["topic"], handle, **timing)
        print("ready", flush=True)
        stop.wait()
    consumer.shutdown()


if __name__ == "__main__":
    main()
