"""Runs in the 5.x venv: drives the official RocketMQ 5.x client from JSON lines on stdin.

One command per line (``{"op": ..., ...}``), one JSON reply per line on stdout, so a test in the project
venv steps the official Producer / SimpleConsumer / PushConsumer exactly when it wants (between steps it
moves the broker's manual clock). Push-consumer deliveries and transaction checks are queued as events and
fetched with ``{"op": "events"}``; a push delivery whose body is ``hold`` blocks until ``{"op": "release"}``.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)


def describe(m: Any) -> dict[str, Any]:
    return {
        "id": m.message_id, "body": m.body.decode(), "keys": sorted(m.keys), "tag": m.tag,
        "attempt": m.delivery_attempt, "handle": m.receipt_handle, "group": m.message_group,
        "topic": m.topic, "properties": dict(m.properties),
    }  # fmt: skip


class Driver(TransactionChecker, MessageListener):
    def __init__(self, endpoint: str) -> None:
        self.config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
        self.producer: Producer | None = None
        self.simple: SimpleConsumer | None = None
        self.push: PushConsumer | None = None
        self.held: dict[str, Any] = {}  # receipt handle -> Message (for ack / change invisible)
        self.events: list[dict[str, Any]] = []
        self.answers: dict[str, str] = {}  # transaction message keys -> COMMIT / ROLLBACK
        self.fail_bodies: set[str] = set()
        self.release = threading.Event()  # a push delivery with body "hold" waits for it
        self.lock = threading.Lock()

    # official client callbacks
    def check(self, message: Any) -> Any:
        key = sorted(message.keys)[0] if message.keys else ""
        answer = self.answers.get(key, "UNKNOWN")
        with self.lock:
            self.events.append({"event": "check", "keys": sorted(message.keys), "answer": answer})
        return getattr(TransactionResolution, answer)

    def consume(self, message: Any) -> Any:
        info = describe(message)
        failed = info["body"] in self.fail_bodies
        with self.lock:
            self.events.append({"event": "push", "result": "FAILURE" if failed else "SUCCESS", **info})
        if info["body"] == "hold":
            self.release.wait(300)
        return ConsumeResult.FAILURE if failed else ConsumeResult.SUCCESS

    # commands
    def op_producer(self, topics: list[str]) -> dict[str, Any]:
        self.producer = Producer(self.config, tuple(topics), checker=self)
        self.producer.startup()
        return {}

    def _message(self, topic: str, body: str, keys: str | None = None, tag: str | None = None,
                 group: str | None = None, deliver_at_s: int | None = None) -> Any:  # fmt: skip
        m = Message()
        m.topic, m.body = topic, body.encode()
        if keys:
            m.keys = keys
        if tag:
            m.tag = tag
        if group:
            m.message_group = group
        if deliver_at_s:
            m.delivery_timestamp = deliver_at_s
        return m

    def op_send(self, **kw: Any) -> dict[str, Any]:
        assert self.producer is not None
        receipt = self.producer.send(self._message(**kw))
        return {"id": receipt.message_id, "offset": receipt.offset}

    def op_send_tx(self, resolve: str | None, **kw: Any) -> dict[str, Any]:
        assert self.producer is not None
        tx = self.producer.begin_transaction()
        receipt = self.producer.send(self._message(**kw), tx)
        if resolve == "commit":
            tx.commit()
        elif resolve == "rollback":
            tx.rollback()
        return {"id": receipt.message_id}

    def op_answer(self, keys: str, resolution: str) -> dict[str, Any]:
        self.answers[keys] = resolution
        return {}

    def op_simple(self, group: str, topic: str, await_s: int = 2, tag: str = "*") -> dict[str, Any]:
        subscription = {topic: FilterExpression(tag)}
        self.simple = SimpleConsumer(self.config, group, subscription, await_duration=await_s)
        self.simple.startup()
        return {}

    def op_receive(self, max: int = 16, invisible_s: int = 30) -> dict[str, Any]:
        assert self.simple is not None
        messages = self.simple.receive(max, invisible_s)
        for m in messages:
            self.held[m.receipt_handle] = m
        return {"messages": [describe(m) for m in messages]}

    def op_ack(self, handle: str) -> dict[str, Any]:
        assert self.simple is not None
        self.simple.ack(self.held.pop(handle))
        return {}

    def op_change_invisible(self, handle: str, seconds: int) -> dict[str, Any]:
        assert self.simple is not None
        m = self.held.pop(handle)
        self.simple.change_invisible_duration(m, seconds)
        self.held[m.receipt_handle] = m
        return {"handle": m.receipt_handle}

    def op_push(self, group: str, topic: str, fail_bodies: tuple[str, ...] = ()) -> dict[str, Any]:
        self.fail_bodies = set(fail_bodies)
        subscription = {topic: FilterExpression()}
        self.push = PushConsumer(self.config, group, self, subscription, consumption_thread_count=4)
        self.push.startup()
        return {"fifo": self.push.fifo}

    def op_release(self) -> dict[str, Any]:
        self.release.set()
        return {}

    def op_events(self) -> dict[str, Any]:
        with self.lock:
            events, self.events = self.events, []
        return {"events": events}

    def op_shutdown(self) -> dict[str, Any]:
        for client in (self.push, self.simple, self.producer):
            if client is not None:
                client.shutdown()
        return {}


def main() -> None:
    driver = Driver(sys.argv[1])
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            reply = {"ok": True, **getattr(driver, f"op_{op}")(**cmd)}
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
        if op == "shutdown":
            return


if __name__ == "__main__":
    main()
