"""Client processes for the multi-process tests: ``python mp_worker.py MODE NAMESRV LOG ARGS_JSON``.

``consume`` runs broker_sim's PushConsumer over TCP and appends one JSON line per delivery to LOG (flushed
per line, so a SIGKILL loses nothing already written); it also logs its queue assignment whenever it
changes. Once the file ``block_file`` exists, its listener stops inside the message it just logged (a
"blocked" line) and waits there to be killed.

``produce`` sends ``count`` messages and logs each *acknowledged* send; a send that fails (the broker is
restarting) is retried until it is acknowledged or ``deadline_s`` passes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, TextIO

from broker_sim import ConsumeStatus, Message, Producer, PushConsumer
from broker_sim.common.message import MessageExt
from broker_sim.common.requests import ConsumeFromWhere


def _writer(path: str) -> tuple[TextIO, threading.Lock]:
    return open(path, "a", buffering=1), threading.Lock()


def consume(namesrv: str, log_path: str, args: dict[str, Any]) -> int:
    out, lock = _writer(log_path)
    pause = float(args.get("pause_s", 0.0))
    block_file = args.get("block_file")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            with lock:
                out.write(
                    json.dumps(
                        {
                            "event": "delivery",
                            "pid": os.getpid(),
                            "body": m.body.decode(),
                            "queue_id": m.queue_id,
                            "offset": m.queue_offset,
                        }
                    )
                    + "\n"
                )
            if block_file is not None and os.path.exists(block_file):
                # the test wants this process killed mid-batch: hold this message unfinished (its offset
                # can then never be committed) and say so; the test kills the process
                with lock:
                    out.write(
                        json.dumps({"event": "blocked", "pid": os.getpid(), "body": m.body.decode()}) + "\n"
                    )
                threading.Event().wait()
            if pause:
                time.sleep(pause)  # simulated work
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        namesrv,
        args["group"],
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval_ms=1000,
        consume_threads=2,
    )
    c.subscribe(args["topic"], "*", listener)
    c.start()
    last: list[int] = []
    while not stop.wait(0.05):
        queues = [mq.queue_id for mq in c.assigned_queues() if mq.topic == args["topic"]]
        if queues != last:
            last = queues
            with lock:
                out.write(
                    json.dumps(
                        {"event": "assigned", "pid": os.getpid(), "client_id": c.client_id, "queues": queues}
                    )
                    + "\n"
                )
    c.shutdown()
    with lock:
        out.write(json.dumps({"event": "stopped", "pid": os.getpid()}) + "\n")
    return 0


def produce(namesrv: str, log_path: str, args: dict[str, Any]) -> int:
    out, _ = _writer(log_path)
    p = Producer(namesrv, args.get("group", "MpPG"), send_msg_timeout_ms=2000)
    deadline = time.monotonic() + float(args.get("deadline_s", 60))
    failures = 0
    for i in range(int(args["count"])):
        while True:
            try:
                r = p.send(Message(args["topic"], f"{args.get('prefix', 'm')}{i}".encode(), keys=f"k{i}"))
                out.write(
                    json.dumps(
                        {
                            "event": "acked",
                            "i": i,
                            "queue_id": r.queue_id,
                            "offset": r.queue_offset,
                            "status": r.status.value,
                        }
                    )
                    + "\n"
                )
                break
            except Exception as exc:  # the broker is down or restarting: retry until the deadline
                failures += 1
                out.write(json.dumps({"event": "failed", "i": i, "error": type(exc).__name__}) + "\n")
                if time.monotonic() > deadline:
                    return 3
                time.sleep(0.05)
        if args.get("pause_s"):
            time.sleep(float(args["pause_s"]))  # pace the stream so a restart lands mid-way
    out.write(json.dumps({"event": "done", "failures": failures}) + "\n")
    p.shutdown()
    return 0


if __name__ == "__main__":
    modes = {"consume": consume, "produce": produce}
    sys.exit(modes[sys.argv[1]](sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
