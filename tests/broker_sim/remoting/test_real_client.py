"""The real RocketMQ client (PyPI ``rocketmq`` 0.4.4, the C++ client 1.2.x via ctypes) against broker_sim.

Each client runs in a subprocess (``realclient_worker.py``): the C++ client's native threads cannot be shut
down reliably inside the pytest process. The server runs in the test process, so assertions can read the
broker directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.broker_sim.remoting.conftest import FAST_DELAYS, ServerFactory, running_broker
from tests.waiting import wait_until

pytest.importorskip("rocketmq.client")

WORKER = Path(__file__).with_name("realclient_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _env(home: Path) -> dict[str, str]:
    # The C++ client writes its logs under $HOME/logs/rocketmq-cpp: keep them in the test's directory.
    return {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}


def run_worker(
    mode: str, namesrv: str, args: dict[str, Any], home: Path, timeout: float = 60
) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode, namesrv, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(home),
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"{mode} worker exited {proc.returncode}: {proc.stderr[-2000:]}"
    return events


def start_worker(mode: str, namesrv: str, args: dict[str, Any], home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, namesrv, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(home),
    )


def test_send_sync_lands_in_the_store(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"RealT": 4})
    broker = running_broker(srv)
    events = run_worker("produce", srv.namesrv_address, {"topic": "RealT", "count": 12}, tmp_path)
    sent = [e for e in events if e["event"] == "sent"]
    assert len(sent) == 12 and all(e["status"] == 0 for e in sent)

    def stored_now() -> list[Any]:
        return [m for q in range(4) for m in broker.messages("RealT", q)]

    assert wait_until(lambda: len(stored_now()) == 12)  # consume queues are dispatched asynchronously
    stored = stored_now()
    assert sorted(m.body for m in stored) == sorted(f"m{i}".encode() for i in range(12))
    by_body = {m.body: m for m in stored}
    for e in sent:  # the client's msg_id is the UNIQ_KEY; its offset is the queue offset we returned
        m = by_body[f"m{e['i']}".encode()]
        assert m.uniq_key == e["msg_id"] and m.queue_offset == e["offset"]
        assert m.key_list == [f"k{e['i']}"] and m.tags == "TagA"
    assert {m.queue_id for m in stored} == {0, 1, 2, 3}  # round robin over writeQueueNums
    assert [m.body for m in broker.query_message_by_key("RealT", "k5")] == [b"m5"]


def test_send_orderly_keeps_a_sharding_key_on_one_queue(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"OrdT": 4})
    broker = running_broker(srv)
    args = {"topic": "OrdT", "count": 24, "sharding": [1, 2, 3]}
    sent = [e for e in run_worker("produce", srv.namesrv_address, args, tmp_path) if e["event"] == "sent"]
    assert all(e["status"] == 0 for e in sent)
    assert wait_until(lambda: sum(len(broker.messages("OrdT", q)) for q in range(4)) == 24)
    queue_of: dict[int, set[int]] = defaultdict(set)
    order: dict[int, list[bytes]] = defaultdict(list)
    for q in range(4):
        for m in broker.messages("OrdT", q):
            shard = int(m.body[1:]) % 3 + 1
            queue_of[shard].add(q)
            order[shard].append(m.body)
    assert all(len(qs) == 1 for qs in queue_of.values())  # one queue per key (hash selector: key % 4)
    assert queue_of == {1: {1}, 2: {2}, 3: {3}}
    for shard, bodies in order.items():  # and in send order within it
        assert bodies == [f"m{i}".encode() for i in range(24) if i % 3 + 1 == shard]


def test_push_consumer_consumes_every_message(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"PushT": 4})
    broker = running_broker(srv)
    run_worker("produce", srv.namesrv_address, {"topic": "PushT", "count": 30}, tmp_path)
    events = run_worker(
        "push", srv.namesrv_address, {"topic": "PushT", "expect": 30, "timeout_s": 40}, tmp_path
    )
    delivered = [e for e in events if e["event"] == "delivery"]
    assert {e["body"] for e in delivered} == {f"m{i}" for i in range(30)}
    assert all(e["topic"] == "PushT" and e["reconsume"] == 0 for e in delivered)
    # offsets were committed (piggy-backed on pulls or UPDATE_CONSUMER_OFFSET at shutdown)
    assert wait_until(lambda: sum(p.lag for p in broker.consumer_progress("RealCG", "PushT")) == 0)


def test_failed_message_comes_back_through_retry(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"RetT": 3}, message_delay_level=FAST_DELAYS)
    broker = running_broker(srv)
    # one message per queue, so every pull carries a single message (see the batch test below)
    run_worker("produce", srv.namesrv_address, {"topic": "RetT", "count": 3}, tmp_path)
    args = {"topic": "RetT", "expect": 3, "fail_times": 1, "timeout_s": 40, "group": "RetryG"}
    delivered = [
        e for e in run_worker("push", srv.namesrv_address, args, tmp_path) if e["event"] == "delivery"
    ]
    first = {e["body"]: e for e in delivered if e["outcome"] == "LATER"}
    second = {e["body"]: e for e in delivered if e["outcome"] == "OK"}
    assert len(delivered) == 6 and set(first) == set(second) == {"m0", "m1", "m2"}
    for body, e in second.items():
        assert e["reconsume"] == 1 and first[body]["reconsume"] == 0
        assert e["topic"] == "RetT" and e["retry_topic"] == "RetT"  # renamed back from %RETRY%RetryG
        assert e["id"] == first[body]["id"]  # same UNIQ_KEY
    retry = broker.retry_messages("RetryG")
    assert sorted(m.body for m in retry) == [b"m0", b"m1", b"m2"]
    assert all(m.reconsume_times == 1 for m in retry)


def test_one_failure_sends_back_the_whole_pulled_batch(serve: ServerFactory, tmp_path: Path) -> None:
    """Client behaviour worth knowing (docs/broker_sim-wire.md): the 0.4.4 wrapper hands messages to Python
    one by one but reports one status for the pulled batch, so the first RECONSUME_LATER sends back every
    message of that pull, including ones the callback never saw or already processed."""
    srv = serve(topics={"BatchT": 1}, message_delay_level=FAST_DELAYS)
    broker = running_broker(srv)
    run_worker("produce", srv.namesrv_address, {"topic": "BatchT", "count": 3}, tmp_path)
    # all three in the consume queue before the consumer starts, so its first pull returns them together
    assert wait_until(lambda: len(broker.messages("BatchT")) == 3)
    args = {"topic": "BatchT", "expect": 3, "fail_times": 1, "timeout_s": 40, "group": "BatchG"}
    delivered = [
        e for e in run_worker("push", srv.namesrv_address, args, tmp_path) if e["event"] == "delivery"
    ]
    assert (delivered[0]["body"], delivered[0]["outcome"], delivered[0]["reconsume"]) == ("m0", "LATER", 0)
    assert [e for e in delivered if e["reconsume"] == 0] == delivered[:1]  # m1, m2 never shown at 0
    first_round = sorted(m.body for m in broker.retry_messages("BatchG") if m.reconsume_times == 1)
    assert first_round == [b"m0", b"m1", b"m2"]  # ... yet all three were sent back


def test_message_reaches_dlq_after_max_reconsume_times(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"DlqT": 1}, max_reconsume_times=2, message_delay_level=FAST_DELAYS)
    broker = running_broker(srv)
    run_worker("produce", srv.namesrv_address, {"topic": "DlqT", "count": 1}, tmp_path)
    args = {"topic": "DlqT", "expect": 1, "fail_times": -1, "timeout_s": 60, "group": "DlqG"}
    proc = start_worker("push", srv.namesrv_address, args, tmp_path)
    try:
        assert wait_until(lambda: len(broker.dlq_messages("DlqG")) == 1, timeout=40)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
    (dead,) = broker.dlq_messages("DlqG")
    assert dead.body == b"m0" and dead.reconsume_times == 3 and dead.properties["RETRY_TOPIC"] == "DlqT"
    attempts = [json.loads(line)["reconsume"] for line in out.splitlines() if '"delivery"' in line]
    assert attempts == [0, 1, 2]  # the 1.x client sends no maxReconsumeTimes: the group's limit (2) applies


def test_pull_consumer_reads_from_zero(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"PullT": 2})
    broker = running_broker(srv)
    run_worker("produce", srv.namesrv_address, {"topic": "PullT", "count": 10}, tmp_path)
    # the pull loop stops at the first PULL_NOT_FOUND: let the asynchronous dispatch catch up first
    assert wait_until(lambda: sum(len(broker.messages("PullT", q)) for q in (0, 1)) == 10)
    events = run_worker("pull", srv.namesrv_address, {"topic": "PullT"}, tmp_path)
    pulled = [e for e in events if e["event"] == "pulled"]
    assert sorted(e["body"] for e in pulled) == sorted(f"m{i}" for i in range(10))
    for q in (0, 1):
        assert [e["offset"] for e in pulled if e["queue_id"] == q] == list(range(5))


def test_unknown_topic_is_created_through_tbw102_when_auto_create_is_on(
    serve: ServerFactory, tmp_path: Path
) -> None:
    srv = serve(auto_create_topic_enable=True)
    broker = running_broker(srv)
    sent = [
        e
        for e in run_worker("produce", srv.namesrv_address, {"topic": "AutoT", "count": 3}, tmp_path)
        if e["event"] == "sent"
    ]
    assert len(sent) == 3
    route = broker.get_route_info_by_topic("AutoT")
    assert route.queue_datas[0].write_queue_nums == 4  # min(client's defaultTopicQueueNums 4, TBW102's 8)


def test_orderly_push_consumer_locks_queues_and_keeps_order(serve: ServerFactory, tmp_path: Path) -> None:
    srv = serve(topics={"OrdT": 2})
    run_worker("produce", srv.namesrv_address, {"topic": "OrdT", "count": 20, "sharding": [0, 1]}, tmp_path)
    args = {"topic": "OrdT", "expect": 20, "timeout_s": 40, "group": "OrdRealG", "orderly": True}
    delivered = [
        e for e in run_worker("push", srv.namesrv_address, args, tmp_path) if e["event"] == "delivery"
    ]
    for q in (0, 1):  # sharding key k went to queue k; within a queue, delivery follows send order
        assert [e["body"] for e in delivered if e["queue_id"] == q] == [f"m{i}" for i in range(q, 20, 2)]
    assert srv.broker_server.stats.by_code.get(41, 0) >= 1  # LOCK_BATCH_MQ before consuming


def test_send_batch_arrives_as_separate_messages(serve: ServerFactory, tmp_path: Path) -> None:
    """The C++ client sends a batch as SEND_MESSAGE with batch=1 and a §F batch body (not code 320)."""
    srv = serve(topics={"BatchT": 1})
    broker = running_broker(srv)
    events = run_worker(
        "produce", srv.namesrv_address, {"topic": "BatchT", "count": 4, "batch": True}, tmp_path
    )
    (ev,) = [e for e in events if e["event"] == "sent_batch"]
    assert ev["event"] == "sent_batch" and ev["status"] == 0
    expected = [(f"m{i}".encode(), [f"k{i}"], i) for i in range(4)]
    assert wait_until(
        lambda: [(m.body, m.key_list, m.queue_offset) for m in broker.messages("BatchT")] == expected
    )
