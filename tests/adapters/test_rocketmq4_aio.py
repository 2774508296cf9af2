"""``async def`` handlers behind RocketMQ 4.x push consumers (CLUSTERING, offsets on the broker), end to end
against ``broker-sim serve`` over the remoting protocol, PostgreSQL or MariaDB and Redis.

What a team running this topology needs (per consumer group): each message's database effect exactly once,
nothing lost, the right inbox statuses, retries through ``%RETRY%{group}`` moving that queue's watermark only,
and a message that can never be handled dead-lettered with its reason. Until 2026-11-29 the adapters took an
``async def`` guarded handler and never ran it (every delivery answered RECONSUME_LATER, every message of the
group in ``%DLQ%`` after 16 rounds): the first test is that, with a rebalance mid-stream on top.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_sim.common.message import MessageExt, Prop
from reliable import Reliability
from reliable.adapters.broker_sim import GuardedListener
from reliable.adapters.rocketmq import consume_status
from reliable.demo.services import BrokerServer
from reliable.types import ConsumeResult, Envelope, LogOutcome, StubStatus
from tests.adapters.rmq4_aio_topology import (
    TOPIC,
    Instances,
    async_handler,
    broker_server,
    deliveries,
    effect_counts,
    inbox_row,
    kill_sessions,
    make_rel,
    stage,
    statuses,
    watermarks,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def rel(server_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(server_url, redis_url, key_prefix, max_attempts=10)
    yield r
    r.close()


@pytest.fixture
def instances() -> Iterator[Instances]:
    started = Instances()
    yield started
    started.stop_all()


def _server(tmp_path: Path, slot: int) -> Iterator[BrokerServer]:
    server = broker_server(tmp_path, slot)
    server.start()
    yield server
    server.stop()


_slots = itertools.count()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BrokerServer]:
    yield from _server(tmp_path, next(_slots) % 50)  # a fresh pair of ports per test of this run


def _msg(mid: str) -> MessageExt:
    return MessageExt(topic=TOPIC, body=b"{}", properties={Prop.KEYS: mid}, queue_id=0, queue_offset=0)


def test_a_listener_runs_an_async_guarded_handler_on_its_own_loop_and_on_a_callers(server_url: str) -> None:
    """The adapters' consume threads are synchronous: an awaitable handler must be awaited, not answered
    RECONSUME_LATER unseen (both the broker_sim listener and the RocketMQ 0.4.4 callback)."""
    rel = make_rel(server_url, None, "aio4")
    try:
        billing = async_handler(rel, "billing")
        own = GuardedListener(billing)
        try:
            assert own([_msg("a-1")]).name == "CONSUME_SUCCESS"
            assert own([_msg("a-2"), _msg("a-3")]).name == "CONSUME_SUCCESS"  # the async batch call
        finally:
            own.close()
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_forever, daemon=True)
        runner.start()
        theirs = GuardedListener(billing, loop=loop)
        try:
            assert theirs([_msg("a-4")]).name == "CONSUME_SUCCESS"
            assert theirs([_msg("a-1")]).name == "CONSUME_SUCCESS"  # a duplicate: suppressed, acknowledged
        finally:
            theirs.close()
            asyncio.run_coroutine_threadsafe(rel.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            runner.join()
            loop.close()
        assert effect_counts(rel, "billing") == {f"a-{i}": 1 for i in range(1, 5)}
        # an awaitable answer handed to the RocketMQ status mapping is refused loudly, never an ack
        assert (
            consume_status(lambda e: asyncio.sleep(0, ConsumeResult.SUCCESS), Envelope("x", TOPIC, 0, 0, b""))
            == 1
        )
    finally:
        rel.close()


@pytest.mark.slow
def _close_while_handling(rel: Reliability, mid: str, grace_s: float | None) -> str:
    """Close a listener while its consume thread waits for the guard on ``mid``; returns what the consume
    thread got (a ConsumeStatus name, or the exception's type: broker_sim reconsumes a raising listener)."""
    go = threading.Event()
    entered: list[str] = []

    async def hold(env: Envelope) -> None:
        entered.append(env.message_id or "")
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 60)

    listener = GuardedListener(async_handler(rel, "billing", before=hold))
    bridge = listener.bridge
    assert bridge is not None
    answers: list[str] = []

    def consume() -> None:
        try:
            answers.append(listener([_msg(mid)]).name)
        except BaseException as exc:  # what broker_sim would reconsume: reported to the test
            answers.append(type(exc).__name__)

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        wait_until(lambda: mid in entered, what=f"{mid} in the handler")
        closer = threading.Thread(target=listener.close, args=(grace_s,))
        closer.start()
        wait_until(lambda: bridge.closing, what="the close begun")
        if grace_s is None:
            assert closer.is_alive()  # it waits for the running call
            with pytest.raises(RuntimeError):  # and takes no new one (reconsumed, never an ack)
                listener([_msg(f"{mid}-late")])
            go.set()
        closer.join(30)
        assert not closer.is_alive()
    finally:
        go.set()
        consumer.join(30)
    assert f"{mid}-late" not in entered
    return answers[0]


def test_closing_a_listener_lets_the_running_handlers_finish_instead_of_spending_attempts(
    server_url: str,
) -> None:
    """A deploy closes the listener while a consume thread waits for the guard: the handler finishes and is
    acknowledged; only past the grace is a call cancelled (an attempt of the message's budget, never an
    ack). Until 2026-11-29 the close cancelled every running call at once."""
    rel = make_rel(server_url, None, "aio4c")
    try:
        assert _close_while_handling(rel, "c-1", None) == "CONSUME_SUCCESS"
        assert effect_counts(rel, "billing").get("c-1") == 1
        assert [d[2] for d in deliveries(rel, "billing", "c-1")] == [LogOutcome.SUCCESS]
        assert _close_while_handling(rel, "c-2", 0.5) != "CONSUME_SUCCESS"
        assert effect_counts(rel, "billing").get("c-2") is None
    finally:
        rel.close()


def test_two_groups_of_async_handlers_apply_each_message_once_through_a_rebalance_and_retries(
    rel: Reliability, server: BrokerServer, instances: Instances
) -> None:
    ids = [f"o-{i:02d}" for i in range(48)]
    failures: dict[str, int] = {}

    async def billing_work(env: Envelope) -> None:
        await asyncio.sleep(0.02)  # the handler's downstream call: keeps messages in flight during rebalance
        if env.message_id == "o-07" and failures.get("o-07", 0) < 2:
            failures["o-07"] = failures.get("o-07", 0) + 1
            raise RuntimeError("downstream refused o-07")
        if env.message_id == "o-13":
            raise ValueError("o-13 can never be handled")

    billing = async_handler(rel, "billing", billing_work)
    audit = async_handler(rel, "audit")
    stage(rel, server.address, ids)
    first = instances.start(server.address, billing, max_reconsume_times=3)
    instances.start(server.address, audit, max_reconsume_times=3)
    wait_until(lambda: len(effect_counts(rel, "billing")) >= 12, what="billing under way on one instance")
    instances.start(server.address, billing, max_reconsume_times=3)  # joins: queues move mid-stream
    wait_until(lambda: len(effect_counts(rel, "billing")) >= 30, what="billing under way on two instances")
    first.stop()  # leaves while messages are in flight
    instances.started.remove(first)
    applied = [m for m in ids if m != "o-13"]
    wait_until(
        lambda: set(effect_counts(rel, "billing")) == set(applied), what="billing applied", timeout=120
    )
    wait_until(lambda: set(effect_counts(rel, "audit")) == set(ids), what="audit applied")
    wait_until(lambda: statuses(rel, "billing").get("o-13") is StubStatus.DEAD, what="o-13 DEAD")

    assert effect_counts(rel, "billing") == dict.fromkeys(applied, 1)  # exactly once, through the rebalance
    assert effect_counts(rel, "audit") == dict.fromkeys(ids, 1)
    assert statuses(rel, "audit") == dict.fromkeys(ids, StubStatus.CONFIRMED)
    assert statuses(rel, "billing") == {
        **dict.fromkeys(applied, StubStatus.CONFIRMED),
        "o-13": StubStatus.DEAD,
    }
    assert statuses(rel, "archive") == dict.fromkeys(ids, StubStatus.PENDING)  # nobody consumed: still owed
    poison = inbox_row(rel, "billing", "o-13")
    assert poison.last_error is not None and "o-13 can never be handled" in poison.last_error
    retry = "%RETRY%billing"
    # a rebalance may hand a message out twice from the topic (its offset not yet committed), each copy
    # starting a chain of its own; every retry comes from %RETRY%billing, reconsume_times rising from 1
    for mid, last in (("o-07", 1), ("o-13", 3)):
        journal = deliveries(rel, "billing", mid)
        assert {t for t, n, _ in journal if n == 0} == {TOPIC}, journal
        assert all(t == retry for t, n, _ in journal if n > 0), journal
        assert set(range(1, last + 1)) <= {n for _, n, _ in journal}, journal
    assert deliveries(rel, "billing", "o-07")[-1][2] == "SUCCESS"
    admin = instances.started[0].consumer.transport
    wait_until(lambda: (admin.get_max_offset("%DLQ%billing", 0) or 0) >= 1, what="o-13 in billing's DLQ")
    # watermarks: each topic queue's at its last offset, the retries' on %RETRY%billing only
    marks = watermarks(rel, "billing")
    for q in range(4):
        assert marks[(TOPIC, q)] == admin.get_max_offset(TOPIC, q) - 1
    assert marks[(retry, 0)] == admin.get_max_offset(retry, 0) - 1
    assert set(marks) == {(TOPIC, q) for q in range(4)} | {(retry, 0)}
    assert watermarks(rel, "audit") == {(TOPIC, q): admin.get_max_offset(TOPIC, q) - 1 for q in range(4)}


@pytest.mark.slow
def test_database_sessions_killed_mid_stream_lose_nothing_and_apply_nothing_twice(
    rel: Reliability, server: BrokerServer, instances: Instances
) -> None:
    """Every session of the database ended, again and again, while the async guard works: deliveries in
    flight are answered RECONSUME_LATER (journal and effect rolled back together), none reaches the DLQ, and
    each message is applied once per group."""
    ids = [f"k-{i:02d}" for i in range(40)]

    async def work(env: Envelope) -> None:
        await asyncio.sleep(0.01)

    billing = async_handler(rel, "billing", work)
    audit = async_handler(rel, "audit", work)
    stage(rel, server.address, ids)
    instances.start(server.address, billing)
    instances.start(server.address, audit)
    wait_until(lambda: len(effect_counts(rel, "billing")) >= 5, what="billing under way")
    kills = 0
    for _ in range(6):  # each round waits for the consumers to have reconnected, then ends their sessions
        wait_until(lambda: kill_sessions(rel) > 0, what="a consumer session to end")
        kills += 1
    wait_until(lambda: set(effect_counts(rel, "billing")) == set(ids), what="billing applied", timeout=120)
    wait_until(lambda: set(effect_counts(rel, "audit")) == set(ids), what="audit applied", timeout=120)
    assert kills == 6
    for group in ("billing", "audit"):
        assert effect_counts(rel, group) == dict.fromkeys(ids, 1), group
        assert statuses(rel, group) == dict.fromkeys(ids, StubStatus.CONFIRMED), group
    admin = instances.started[0].consumer.transport
    assert not admin.get_max_offset("%DLQ%billing", 0) and not admin.get_max_offset("%DLQ%audit", 0)


@pytest.mark.slow
def test_the_rocketmq_client_callback_awaits_an_async_handler_and_retries_through_its_retry_topic(
    rel: Reliability, server: BrokerServer
) -> None:
    """The PyPI ``rocketmq`` 0.4.4 C++ client calls back on its own threads: the async guarded handler runs
    on the bridge's loop; a failure comes back from %RETRY%billing (reconsume_times 1); effects once."""
    from reliable.adapters.rocketmq import push_consumer, subscribe_guarded

    ids = [f"c-{i:02d}" for i in range(16)]
    failed: set[str] = set()

    async def once_failing(env: Envelope) -> None:
        if env.message_id == "c-05" and "c-05" not in failed:
            failed.add("c-05")
            raise RuntimeError("first delivery of c-05 fails")

    billing = async_handler(rel, "billing", once_failing)
    stage(rel, server.address, ids)
    consumer = push_consumer(server.address, "billing", thread_count=4)
    bridge = subscribe_guarded(consumer, TOPIC, billing)
    assert bridge is not None
    consumer.start()
    try:
        wait_until(lambda: set(effect_counts(rel, "billing")) == set(ids), what="billing applied")
        wait_until(
            lambda: statuses(rel, "billing") == dict.fromkeys(ids, StubStatus.CONFIRMED), what="confirmed"
        )
    finally:
        consumer.shutdown()
        bridge.close()
    assert effect_counts(rel, "billing") == dict.fromkeys(ids, 1)
    assert [(t, n) for t, n, _ in deliveries(rel, "billing", "c-05")][:2] == [
        (TOPIC, 0),
        ("%RETRY%billing", 1),
    ]
