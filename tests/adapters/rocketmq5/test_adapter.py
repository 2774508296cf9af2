"""``reliable.adapters.rocketmq5`` with the official 5.x client against broker_sim's gRPC front end.

Workers (worker.py) run the guard in the 5.x venv on a real PostgreSQL database; the broker runs here on a
manual clock, so "longer than the invisible duration" and "after the invisible duration" are exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from broker_sim.grpc.policy import GroupPolicy
from reliable import Reliability
from reliable import constants as C
from tests.adapters.rocketmq5 import venv5
from tests.adapters.rocketmq5.conftest import TOPIC, GrpcBroker, GrpcBrokerFactory
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def db(postgres_url: str) -> Iterator[str]:
    rel = Reliability(postgres_url, None)
    rel.create_schema()
    with rel.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS applied5"
                " (group_name varchar(64), message_id varchar(64), worker int)"
            )
        )
    rel.close()
    yield postgres_url


class Worker:
    def __init__(self, python: Path, spec: dict[str, Any], log: Path) -> None:
        self.log = log.open("a")
        env = {**os.environ, "HOME": str(log.parent)}
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "worker.py"), json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.first_line = self.proc.stdout.readline()  # "ready" / "done" / JSON; ends early if it fails
        assert self.first_line.strip(), f"worker failed to start; see {log}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def start(broker: GrpcBroker, db: str, workers: list[Worker], control: Path, **spec: Any) -> Worker:
    control.mkdir(exist_ok=True)
    full = {"endpoint": broker.endpoint, "db_url": db, "topic": TOPIC, "control": str(control),
            "mode": "simple", "invisible_s": 10, "extend_every_s": 0.2, **spec}  # fmt: skip
    w = Worker(venv5.python(), full, control / "workers.log")
    workers.append(w)
    return w


def applied(db: str, message_id: str) -> list[tuple[str, int]]:
    engine = create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT group_name, worker FROM applied5 WHERE message_id = :m"), {"m": message_id}
        ).all()
    engine.dispose()
    return [(r[0], r[1]) for r in rows]


def started_files(control: Path, message_id: str) -> list[Path]:
    return sorted(control.glob(f"started-{message_id}-*"))


def send(broker: GrpcBroker, body: str, key: str) -> None:
    producer = broker.client()
    producer.call("producer", topics=[TOPIC])
    producer.call("send", topic=TOPIC, body=body, keys=key)


def assert_nothing_left(broker: GrpcBroker, group: str) -> None:
    """After the workers stopped and the clock moved far on: a fresh receive of ``group`` finds nothing."""
    broker.advance(600)
    probe = broker.client()
    probe.call("simple", group=group, topic=TOPIC, await_s=1)
    assert probe.call("receive", max=16, invisible_s=30)["messages"] == []


def test_a_handler_longer_than_the_invisible_duration_is_applied_once(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    broker = make_broker()
    group, key, control = f"long{uuid.uuid4().hex[:6]}", f"slow-{uuid.uuid4().hex[:8]}", tmp_path / "c"
    start(broker, db, workers, control, group=group)
    start(broker, db, workers, control, group=group)  # a second consumer that must not get it meanwhile
    send(broker, "slow", key)
    wait_until(lambda: started_files(control, key), what="the handler to start")
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop

    def serial() -> int:
        return next(iter(pop.inflight(group, TOPIC).values())).serial

    def extended_since(before: int) -> bool:
        return serial() != before

    for _ in range(5):  # 40 s of broker time under a 10 s invisible duration, extended as it goes
        wait_until(partial(extended_since, serial()), what="an extension")
        broker.advance(8)
    assert len(started_files(control, key)) == 1
    (control / "release").touch()
    wait_until(lambda: applied(db, key), what="the application")
    wait_until(lambda: not pop.inflight(group, TOPIC), what="the ack")
    for w in workers:
        w.stop()
    assert_nothing_left(broker, group)
    assert len(applied(db, key)) == 1
    assert len(started_files(control, key)) == 1


def test_a_message_received_behind_a_slow_one_is_not_handed_to_another_consumer(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """One receive brings a slow message and the one behind it. While the slow handler runs through several
    invisible durations, the second waits in that consumer's batch: it must stay invisible too, not go to
    the other consumer at its next attempt (burning the group's delivery attempts without any failure,
    leaving a stale receipt handle behind)."""
    broker = make_broker()
    group, control = f"tail{uuid.uuid4().hex[:6]}", tmp_path / "c"
    slow, behind = f"slow-{uuid.uuid4().hex[:8]}", f"behind-{uuid.uuid4().hex[:8]}"
    send(broker, "slow", slow)
    send(broker, "fast", behind)
    first = start(broker, db, workers, control, group=group)  # receives both in one batch
    wait_until(lambda: started_files(control, slow), what="the slow handler to start")
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop
    assert len(pop.inflight(group, TOPIC)) == 2  # both received by the first consumer
    start(broker, db, workers, control, group=group)  # a second consumer, polling the group

    def serials() -> set[int]:
        return {h.serial for h in pop.inflight(group, TOPIC).values()}

    def extended_since(before: set[int]) -> bool:
        return serials().isdisjoint(before)

    for _ in range(5):  # 40 s of broker time under a 10 s invisible duration
        wait_until(partial(extended_since, serials()), what="both messages extended")
        broker.advance(8)
    assert applied(db, behind) == [] and started_files(control, behind) == []  # still waiting behind
    (control / "release").touch()
    wait_until(lambda: applied(db, behind), what="the message behind to be applied")
    pid = first.proc.pid
    assert [p.name for p in started_files(control, behind)] == [f"started-{behind}-{pid}"]
    assert len(applied(db, slow)) == 1 and len(applied(db, behind)) == 1


@pytest.mark.parametrize("mode", ["simple", "push"])
def test_a_consumer_killed_mid_handler_is_replaced_and_the_message_applied_once(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path, mode: str
) -> None:
    broker = make_broker()
    group, key, control = f"kill{uuid.uuid4().hex[:6]}", f"kill-{uuid.uuid4().hex[:8]}", tmp_path / "c"
    victim = start(broker, db, workers, control, group=group, mode=mode)
    send(broker, "slow", key)
    wait_until(lambda: started_files(control, key), what="the handler to start")
    victim.proc.kill()  # mid-handler: its transaction never commits, its extensions stop
    victim.proc.wait()
    (control / "release").touch()
    heir = start(broker, db, workers, control, group=group, mode=mode)
    broker.advance(61)  # past the invisible duration of the victim's delivery (push: 60 s, simple: 10 s)
    wait_until(lambda: applied(db, key), what="the heir to apply it")
    assert applied(db, key) == [(group, heir.proc.pid)]
    assert len(started_files(control, key)) == 2
    for w in workers:
        w.stop()
    assert_nothing_left(broker, group)
    assert applied(db, key) == [(group, heir.proc.pid)]


def test_bad_input_goes_to_the_dead_letter_queue(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """A second body under a known id is refused by the guard: forwarded to %DLQ%{group}, not acked."""
    broker = make_broker()
    group, key, control = f"bad{uuid.uuid4().hex[:6]}", f"dup-{uuid.uuid4().hex[:8]}", tmp_path / "c"
    start(broker, db, workers, control, group=group, mode="push")
    send(broker, "first", key)
    wait_until(lambda: applied(db, key), what="the first body")
    send(broker, "tampered", key)
    b = broker.server.broker
    assert b is not None
    wait_until(lambda: b.get_max_offset(f"%DLQ%{group}", 0) == 1, what="the DLQ copy")
    assert applied(db, key) == [(group, workers[0].proc.pid)]


def test_fan_out_to_two_groups_applies_every_message_once_per_group(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    broker = make_broker()
    tag = uuid.uuid4().hex[:6]
    billing, audit, control = f"billing{tag}", f"audit{tag}", tmp_path / "c"
    ids = [f"fan-{tag}-{i}" for i in range(10)]
    start(broker, db, workers, control, group=billing, mode="simple")
    start(broker, db, workers, control, group=audit, mode="push")
    start(broker, db, workers, control, mode="produce", ids=ids, groups=[billing, audit])
    wait_until(lambda: all(len(applied(db, m)) == 2 for m in ids), timeout=60, what="both groups")
    for w in workers:
        w.stop()
    assert_nothing_left(broker, billing)
    assert all(sorted(g for g, _ in applied(db, m)) == sorted([audit, billing]) for m in ids)


def test_reconsume_later_comes_back_after_the_guard_backoff(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    from reliable.adapters.rocketmq5 import retry_delay_s

    broker = make_broker()
    group, key, control = f"flaky{uuid.uuid4().hex[:6]}", f"flaky-{uuid.uuid4().hex[:8]}", tmp_path / "c"
    start(broker, db, workers, control, group=group)
    send(broker, "flaky", key)
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop
    backoff_ms = retry_delay_s(1) * 1000

    def hidden_for_backoff() -> bool:
        handles = list(pop.inflight(group, TOPIC).values())
        return bool(handles) and handles[0].invisible_ms == backoff_ms

    wait_until(hidden_for_backoff, what="the invisible duration set to the retry backoff")
    assert applied(db, key) == []
    broker.advance(backoff_ms / 1000 + 1)
    wait_until(lambda: applied(db, key), what="the second attempt")

    # the journal may be written behind the handler's transaction: wait for both rows, then compare
    wait_until(lambda: len(journal(db, key)) >= 2, what="two journal rows")
    assert journal(db, key) == [(0, "RETRY"), (1, "SUCCESS")]


def test_sender_receipts_and_the_query_offset_probe(make_broker: GrpcBrokerFactory, tmp_path: Path) -> None:
    """The 5.x send reports the offset but not the queue; QueryOffset(END) is each queue's max offset."""
    broker = make_broker()
    ids = [f"snd-{i}" for i in range(6)]
    spec = {"endpoint": broker.endpoint, "topic": TOPIC, "mode": "send", "ids": ids}
    w = Worker(venv5.python(), spec, tmp_path / "send.log")
    w.stop()
    out = json.loads(w.first_line)
    assert all(queue_id == -1 and offset >= 0 for queue_id, offset, _ in out["receipts"])
    assert out["max_offsets"][0] is None  # an unknown queue cannot be probed
    b = broker.server.broker
    assert b is not None
    assert out["max_offsets"][1:] == [b.get_max_offset(TOPIC, q) for q in range(4)]
    assert sum(out["max_offsets"][1:]) == len(ids)
    # QueryOffset(BEGINNING): nothing deleted yet, so every queue starts at 0
    assert out["min_offsets"] == [None, 0, 0, 0, 0]


def test_a_resend_for_one_group_is_labelled_with_it_for_the_topics_other_groups(
    make_broker: GrpcBrokerFactory, tmp_path: Path
) -> None:
    """5.x cannot address one group: the sweeper's resend for ``billing`` goes to the topic, every group gets
    it. It carries ``RELIABLE_TARGET_GROUP``, so a group that gave up on the message tells it from a copy of
    its own (:class:`~reliable.types.Envelope` ``target_group``) and does not dead-letter it again."""
    broker = make_broker()
    spec = {"endpoint": broker.endpoint, "topic": TOPIC, "mode": "send", "ids": ["again-1"],
            "target_group": "billing"}  # fmt: skip
    Worker(venv5.python(), spec, tmp_path / "send.log").stop()
    b = broker.server.broker
    assert b is not None
    stored = [
        m.ext.properties for q in range(4) for m in b.store.get_message("reader", TOPIC, q, 0, 8).messages
    ]
    assert [p.get(C.ROCKETMQ5_TARGET_GROUP_PROPERTY) for p in stored] == ["billing"]


def test_a_delayed_stub_is_sent_with_a_delivery_time_not_a_system_property(
    make_broker: GrpcBrokerFactory, tmp_path: Path
) -> None:
    """A stub staged with RocketMQ's ``DELAY`` level: over 5.x that name is the broker's own (a proxy refuses
    it as a user property); the sender turns the level into the message's delivery time, and the broker
    holds the message back (parked: no offset yet)."""
    broker = make_broker()
    spec = {"endpoint": broker.endpoint, "topic": TOPIC, "mode": "send", "ids": ["late-1"],
            "properties": {"DELAY": "3", "origin": "shop"}}  # fmt: skip
    w = Worker(venv5.python(), spec, tmp_path / "send.log")
    w.stop()
    [[queue_id, offset, _]] = json.loads(w.first_line)["receipts"]
    assert (queue_id, offset) == (-1, -1)  # parked on the timer until its delivery time
    b = broker.server.broker
    assert b is not None
    assert sum(b.get_max_offset(TOPIC, q) for q in range(4)) == 0


def test_the_brokers_last_delivery_is_the_guards_last_attempt(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """The group's retry policy allows 3 deliveries, the guard's ``max_attempts`` 16. The broker dead-letters
    the message after its third delivery; the guard, never told it was the last, left the row PENDING — no
    reason, no notice, and the sweeper re-sent it round after round. The third delivery is the guard's last
    attempt now: the row ends DEAD with the handler's error, journaled."""
    from reliable.adapters.rocketmq5 import retry_delay_s

    group, key, control = f"poison{uuid.uuid4().hex[:6]}", f"poison-{uuid.uuid4().hex[:8]}", tmp_path / "c"
    broker = make_broker(groups={group: GroupPolicy(max_attempts=3)})
    start(broker, db, workers, control, group=group, max_attempts=3)
    send(broker, "poison", key)
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop

    def put_back_for(seconds: int) -> Callable[[], bool]:
        """The worker answered the delivery (the journal row is written before): hidden for the backoff."""
        return lambda: [h.invisible_ms for h in pop.inflight(group, TOPIC).values()] == [seconds * 1000]

    for attempt in (1, 2):
        wait_until(lambda n=attempt: len(journal(db, key)) >= n, what=f"delivery {attempt}")  # type: ignore[misc]
        wait_until(put_back_for(retry_delay_s(attempt)), what=f"delivery {attempt} put back")
        broker.advance(retry_delay_s(attempt) + 1)
    wait_until(lambda: len(journal(db, key)) >= 3, what="the third delivery")
    assert [o for _, o in journal(db, key)] == ["RETRY", "RETRY", "DEAD_LETTER"]
    b = broker.server.broker
    assert b is not None
    wait_until(lambda: b.get_max_offset(f"%DLQ%{group}", 0) == 1, what="the DLQ copy")
    assert inbox_status(db, key, group) == "DEAD"


def test_a_push_consumer_follows_its_groups_retry_policy_without_being_told(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """Two groups with their own policies (3 and 2 deliveries) and a listener given no ``max_attempts``: it
    used 17, so at the broker's last delivery each group's row stayed PENDING with nobody told. The push
    client knows each group's policy from the broker's settings; the guard's last attempt follows it."""
    tag = uuid.uuid4().hex[:6]
    limits = {f"three{tag}": 3, f"two{tag}": 2}
    broker = make_broker(groups={g: GroupPolicy(max_attempts=n, backoff_s=(1.0,)) for g, n in limits.items()})
    control, key = tmp_path / "c", f"poison-{tag}"
    for group in limits:
        start(broker, db, workers, control, group=group, mode="push")
    send(broker, "poison", key)

    def delivered(n: int) -> Callable[[], bool]:
        return lambda: all(len(journal(db, key, g)) >= min(n, lim) for g, lim in limits.items())

    def dead(group: str) -> Callable[[], bool]:
        return lambda: inbox_status(db, key, group) == "DEAD"

    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop

    def answered() -> bool:
        """Every group's client has answered its delivery: put it back for the policy's 1 s (a handle no
        longer held for the push client's 60 s) or forwarded it to the DLQ. The journal row is written before
        the listener returns, so moving the clock on before that answer would start the 1 s after the move."""
        return all(h.invisible_ms == 1000 for g in limits for h in pop.inflight(g, TOPIC).values())

    for round_ in range(1, 4):
        wait_until(delivered(round_), what=f"delivery {round_}")
        wait_until(answered, what=f"the clients' answers to delivery {round_}")
        broker.advance(2)
    for group, limit in limits.items():
        assert [o for _, o in journal(db, key, group)] == ["RETRY"] * (limit - 1) + ["DEAD_LETTER"]
        wait_until(dead(group), what=f"{group}'s row DEAD")


def inbox_status(db: str, key: str, group: str) -> str | None:
    engine = create_engine(db)
    with engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM message_inbox WHERE message_id = :m AND consumer_group = :g"),
            {"m": key, "g": group},
        ).scalar()
    engine.dispose()
    return None if status is None else str(status)


def journal(db: str, key: str, group: str | None = None) -> list[tuple[int, str]]:
    engine = create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT reconsume_times, outcome FROM message_log WHERE message_id = :m"
                + (" AND consumer_group = :g" if group is not None else "")
                + " ORDER BY id"
            ),
            {"m": key, "g": group},
        ).all()
    engine.dispose()
    return [(r[0], r[1]) for r in rows]
