"""Runs the real RocketMQ C++ client (PyPI ``rocketmq`` 0.4.4) in its own process for the tests.

The C++ client starts native threads that cannot be stopped cleanly inside pytest's process, so every test
drives it through this script: ``python realclient_worker.py MODE NAMESRV ARGS_JSON``. It prints one JSON
object per line (``{"event": ...}``) and exits 0 when it reached its goal, 3 on timeout.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _with_route_retry(send: Any, *a: Any) -> Any:
    """The 1.2.x C++ client guards transport creation with a mutex it waits for only a few milliseconds
    (``m_tcpTransportTryLockTimeout``); when its heartbeat thread and a send open the first connection at
    the same moment, the loser fails at once with "No route info of this topic" — nothing was sent. On a
    loaded machine that race is real (see docs/broker_sim-wire.md; the client's log shows "GetTransport …
    get timed_mutex timeout"), so that one error is retried."""
    for attempt in range(5):
        try:
            return send(*a)
        except Exception as exc:
            # the batch path reports the same failure with an empty message
            if ("No route info" not in str(exc) and str(exc).strip()) or attempt == 4:
                raise
            emit(event="retried_no_route", error=str(exc)[:120])
            time.sleep(0.2)
    raise AssertionError("unreachable")


def produce(namesrv: str, args: dict[str, Any]) -> int:
    from rocketmq.client import Message, Producer

    p = Producer(args.get("group", "RealPG"), timeout=args.get("timeout_ms", 3000))
    p.set_namesrv_addr(namesrv)
    p.start()
    try:
        if args.get("batch"):
            msgs = []
            for i in range(args["count"]):
                m = Message(args["topic"])
                m.set_keys(f"{args.get('key_prefix', 'k')}{i}")
                m.set_body(f"{args.get('body_prefix', 'm')}{i}".encode())
                msgs.append(m)
            r = _with_route_retry(p.send_batch, msgs)
            emit(event="sent_batch", status=int(r.status), msg_id=r.msg_id, offset=r.offset)
            return 0
        for i in range(args["count"]):
            m = Message(args["topic"])
            m.set_keys(f"{args.get('key_prefix', 'k')}{i}")
            m.set_tags(args.get("tags", "TagA"))
            m.set_body(f"{args.get('body_prefix', 'm')}{i}".encode() + b"x" * args.get("pad", 0))
            if "sharding" in args:
                key = args["sharding"][i % len(args["sharding"])]
                r = _with_route_retry(p.send_orderly, m, key)
                emit(event="sent", i=i, status=int(r.status), msg_id=r.msg_id, offset=r.offset, shard=key)
            else:
                r = _with_route_retry(p.send_sync, m)
                emit(event="sent", i=i, status=int(r.status), msg_id=r.msg_id, offset=r.offset)
    finally:
        p.shutdown()
    return 0


def push_consume(namesrv: str, args: dict[str, Any]) -> int:
    """Consume until ``expect`` distinct bodies were seen successfully (or ``timeout_s``).

    ``fail_times``: a message is answered RECONSUME_LATER until it has been delivered that many times
    (``-1`` = always). The wrapper's own exception path is not used for failures: in 0.4.4 a raising
    callback makes ctypes return 0 = CONSUME_SUCCESS (see docs/broker_sim-wire.md), so we register a raw
    callback that returns the status code itself.
    """
    from rocketmq.client import PushConsumer, RecvMessage
    from rocketmq.ffi import MSG_CALLBACK_FUNC, dll

    fail_times = int(args.get("fail_times", 0))
    expect = int(args["expect"])
    seen_ok: set[str] = set()
    deliveries: dict[str, int] = {}
    done = threading.Event()
    lock = threading.Lock()

    def on_message(_consumer: Any, raw: Any) -> int:
        msg = RecvMessage(raw)
        body = _text(msg.body)
        with lock:
            deliveries[body] = deliveries.get(body, 0) + 1
            n = deliveries[body]
            fail = fail_times < 0 or n <= fail_times
            emit(
                event="delivery", body=body, topic=msg.topic, keys=_text(msg.keys), id=msg.id,
                queue_id=msg.queue_id, offset=msg.queue_offset, reconsume=msg.reconsume_times,
                retry_topic=_text(msg.get_property("RETRY_TOPIC")), outcome="LATER" if fail else "OK",
            )  # fmt: skip
            if not fail:
                seen_ok.add(body)
                if len(seen_ok) >= expect:
                    done.set()
        return 1 if fail else 0

    orderly = bool(args.get("orderly"))
    c = PushConsumer(args.get("group", "RealCG"), orderly=orderly)
    c.set_namesrv_addr(namesrv)
    if "thread_count" in args:
        c.set_thread_count(int(args["thread_count"]))
    dll.Subscribe(c._handle, args["topic"].encode(), args.get("expression", "*").encode())
    func = MSG_CALLBACK_FUNC(on_message)
    c._callback_refs.append(func)
    (dll.RegisterMessageCallbackOrderly if orderly else dll.RegisterMessageCallback)(c._handle, func)
    c.start()
    ok = done.wait(float(args.get("timeout_s", 60)))
    if args.get("linger_s"):
        time.sleep(float(args["linger_s"]))  # only to observe redeliveries, never as synchronisation
    emit(event="done", ok=ok, distinct=len(seen_ok))
    c.shutdown()
    return 0 if ok else 3


def pull(namesrv: str, args: dict[str, Any]) -> int:
    from rocketmq.client import PullConsumer

    c = PullConsumer(args.get("group", "RealPullG"))
    c.set_namesrv_addr(namesrv)
    c.start()
    n = 0
    for msg in c.pull(args["topic"]):
        emit(event="pulled", body=_text(msg.body), queue_id=msg.queue_id, offset=msg.queue_offset, id=msg.id)
        n += 1
    emit(event="done", count=n)
    c.shutdown()
    return 0


MODES = {"produce": produce, "push": push_consume, "pull": pull}

if __name__ == "__main__":
    sys.exit(MODES[sys.argv[1]](sys.argv[2], json.loads(sys.argv[3])))
